"""The paper's input transformations (§3.3, Figure 1): task examples → token-id sequences.

Every sequence starts with the start token ``<s>`` and ends with the extract token ``<e>``, whose final hidden
state the task head reads. The layout depends on the task's *kind*, never its name: classification
``<s> text <e>``; entailment ``<s> premise $ hypothesis <e>``; similarity and regression both orders
``<s> a $ b <e>`` and ``<s> b $ a <e>``; multiple choice one ``<s> context question $ answer <e>`` per answer.
Each kind has its truncation rule so every sequence fits ``n_ctx`` (the table: docs/finetune.md).

Multiple-choice truncation is chosen from the example's shape (one text field: Story Cloze, the released code's
rule; two: RACE, ours), so the training loop needs no task names; a task may override it with a ``truncation``
attribute (``"pair"``, ``"released_roc"``, ``"keep_qa"``).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gptcli.data.workers import quiet_worker
from gptcli.errors import GPT1Error
from gptcli.tasks.base import Example, Task
from gptcli.tokenizers.base import Tokenizer

KINDS = ("classification", "entailment", "similarity", "multiple_choice", "regression")


@dataclass
class Encoded:
    """One example as token-id sequences ready for batching.

    ``seqs`` has 1 sequence (classification, entailment), 2 (similarity and regression: both orders) or one per
    answer (multiple choice). ``index`` is the example's position in the list it came from.
    """

    seqs: list[list[int]]
    label: int | float | None = None
    index: int = 0
    uid: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return max(len(s) for s in self.seqs)


@dataclass(frozen=True)
class SpecialIds:
    start: int
    delim: int
    extract: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> SpecialIds:
        return cls(tokenizer.start_id, tokenizer.delim_id, tokenizer.extract_id)


# --------------------------------------------------------------------------------------------- truncation rules


def truncate_head(ids: Sequence[int], n: int) -> list[int]:
    """Keep the first ``n`` tokens."""
    return list(ids[: max(0, n)])


def truncate_pair(a: Sequence[int], b: Sequence[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut the longer of two fields (its tail) one token at a time until ``len(a) + len(b) <= budget``.

    Closed form of the usual loop: the shorter field is kept whole when it fits in half the budget; otherwise
    both end at half (the first field gets the odd token, as the loop that pops from ``b`` on ties does).
    """
    la, lb = len(a), len(b)
    if la + lb <= budget:
        return list(a), list(b)
    half_a, half_b = (budget + 1) // 2, budget // 2
    if la <= half_a:
        return list(a), list(b[: budget - la])
    if lb <= half_b:
        return list(a[: budget - lb]), list(b)
    return list(a[:half_a]), list(b[:half_b])


def released_roc_max_len(n_ctx: int) -> int:
    """Per-field limit of the released Story Cloze code: ``max_len = n_ctx // 2 - 2``."""
    return n_ctx // 2 - 2


# --------------------------------------------------------------------------------------------- layouts


def classification(text: Sequence[int], sp: SpecialIds, n_ctx: int) -> list[list[int]]:
    return [[sp.start, *truncate_head(text, n_ctx - 2), sp.extract]]


def entailment(premise: Sequence[int], hypothesis: Sequence[int], sp: SpecialIds, n_ctx: int) -> list[list[int]]:
    p, h = truncate_pair(premise, hypothesis, n_ctx - 3)
    return [[sp.start, *p, sp.delim, *h, sp.extract]]


def similarity(a: Sequence[int], b: Sequence[int], sp: SpecialIds, n_ctx: int) -> list[list[int]]:
    """Both orders; the pair is cut once so the two sequences hold the same tokens."""
    a, b = truncate_pair(a, b, n_ctx - 3)
    return [[sp.start, *a, sp.delim, *b, sp.extract], [sp.start, *b, sp.delim, *a, sp.extract]]


def multiple_choice(
    context: Sequence[int],
    question: Sequence[int] | None,
    answers: Sequence[Sequence[int]],
    sp: SpecialIds,
    n_ctx: int,
    rule: str = "auto",
) -> list[list[int]]:
    """One ``<s> context question $ answer <e>`` sequence per answer.

    ``released_roc`` (Story Cloze, the released ``transform_roc``): context and each answer keep their first
    ``n_ctx // 2 - 2`` tokens. ``keep_qa`` (RACE, not published in the paper): question and answers stay whole and the
    context keeps its head, cut the same for every answer so the answers compete on equal context; should question
    and longest answer alone overflow, the question keeps its tail (next to the answer), then answers their heads.
    """
    if rule == "auto":
        rule = "released_roc" if question is None else "keep_qa"
    q = list(question or [])
    budget = n_ctx - 3
    out = []
    if rule == "released_roc":
        m = released_roc_max_len(n_ctx)
        # The released code has no question; a question (if any) is treated as part of the context.
        c = truncate_head([*context, *q], m)
        for ans in answers:
            out.append([sp.start, *c, sp.delim, *truncate_head(ans, m), sp.extract])
        return out
    if rule == "keep_qa":
        longest = max((len(a) for a in answers), default=0)
        room = budget - len(q) - longest
        if room >= 0:
            c, ans_cut = truncate_head(context, room), [list(a) for a in answers]
        else:
            c = []
            q = q[len(q) - max(0, budget - longest) :] if budget - longest < len(q) else q
            ans_cut = [truncate_head(a, budget - len(q)) for a in answers]
        for ans in ans_cut:
            out.append([sp.start, *c, *q, sp.delim, *ans, sp.extract])
        return out
    if rule == "pair":
        cq = [*context, *q]
        for ans in answers:
            a, b = truncate_pair(cq, ans, budget)
            out.append([sp.start, *a, sp.delim, *b, sp.extract])
        return out
    raise ValueError(f"unknown multiple-choice truncation rule {rule!r}")


# --------------------------------------------------------------------------------------------- tasks → ids


def transform_ids(
    kind: str,
    texts: Sequence[Sequence[int]],
    choices: Sequence[Sequence[int]],
    sp: SpecialIds,
    n_ctx: int,
    rule: str = "auto",
) -> list[list[int]]:
    """Token-id fields of one example → its sequences, by task kind."""
    if kind == "classification":
        return classification(texts[0], sp, n_ctx)
    if kind == "entailment":
        return entailment(texts[0], texts[1], sp, n_ctx)
    if kind in ("similarity", "regression"):
        return similarity(texts[0], texts[1], sp, n_ctx)
    if kind == "multiple_choice":
        question = texts[1] if len(texts) > 1 else None
        return multiple_choice(texts[0], question, choices, sp, n_ctx, rule)
    raise ValueError(f"unknown task kind {kind!r}")


def truncation_rule(task: Task) -> str:
    """The task's declared rule, else ``auto`` (chosen from the example's shape)."""
    return getattr(task, "truncation", None) or "auto"


# --------------------------------------------------------------------------------------------- parallel tokenization

PARALLEL_MIN_TEXTS = 2000
"""Below this many distinct texts one process encodes them: starting workers would cost more than it saves."""
_WORK: tuple[Tokenizer, Sequence[str]] | None = None
"""(tokenizer, texts) of the encode in progress, inherited by forked workers (nothing is pickled to them)."""


def resolve_workers(workers: int) -> int:
    """``workers`` processes, 0 meaning every core this process may run on."""
    if workers < 0:
        raise GPT1Error(f"--workers must be 0 (all cores) or more, got {workers}")
    if workers:
        return workers
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _encode_range(bounds: tuple[int, int]) -> tuple[array, array]:
    """In a worker: texts[lo:hi] → (their ids concatenated, each one's length) — two flat arrays pickle far faster
    back to the parent than a list of lists."""
    assert _WORK is not None
    tokenizer, texts = _WORK
    flat, lengths = array("q"), array("q")
    for ids in tokenizer.encode_batch(texts[bounds[0] : bounds[1]]):
        flat.extend(ids)
        lengths.append(len(ids))
    return flat, lengths


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], workers: int = 1) -> list[list[int]]:
    """``tokenizer.encode_batch(texts)`` over ``workers`` processes (0 = all cores), in order: the same ids as one
    process, since every text is encoded on its own. Workers are forked (they inherit the tokenizer, whatever its
    kind); where fork is unavailable, or the input is small, one process encodes."""
    import multiprocessing as mp

    n = min(resolve_workers(workers), max(1, len(texts) // 64))
    if n <= 1 or len(texts) < PARALLEL_MIN_TEXTS or "fork" not in mp.get_all_start_methods():
        return tokenizer.encode_batch(texts) if texts else []
    global _WORK
    # Several chunks per worker so an unlucky chunk of long texts does not leave the others idle at the end.
    step = -(-len(texts) // (n * 8))
    bounds = [(lo, min(lo + step, len(texts))) for lo in range(0, len(texts), step)]
    _WORK = (tokenizer, texts)
    try:
        with mp.get_context("fork").Pool(n, initializer=quiet_worker) as pool:  # leaving the block terminates it
            parts = pool.map(_encode_range, bounds, chunksize=1)
    finally:
        _WORK = None
    out: list[list[int]] = []
    for flat, lengths in parts:
        ids, pos = flat.tolist(), 0
        for k in lengths:
            out.append(ids[pos : pos + k])
            pos += k
    return out


def encode_examples(
    task: Task, examples: Sequence[Example], tokenizer: Tokenizer, n_ctx: int, workers: int = 1
) -> list[Encoded]:
    """Tokenize every field of ``examples`` (deduplicated, through ``encode_batch`` over ``workers`` processes, 0 =
    all cores) and lay them out."""
    if n_ctx < 8:
        raise GPT1Error(f"context of {n_ctx} tokens is too short for the task transformations")
    kind = task.kind
    expected = {
        "classification": (1,),
        "entailment": (2,),
        "similarity": (2,),
        "regression": (2,),
        "multiple_choice": (1, 2),
    }
    texts: dict[str, int] = {}
    for ex in examples:
        if len(ex.texts) not in expected[kind]:
            raise GPT1Error(
                f"{ex.source or task.name}: a {kind} example needs {' or '.join(map(str, expected[kind]))} "
                f"text field(s), got {len(ex.texts)}"
            )
        if kind == "multiple_choice" and task.n_choices and len(ex.choices) != task.n_choices:
            raise GPT1Error(f"{ex.source or task.name}: expected {task.n_choices} answers, got {len(ex.choices)}")
        for t in (*ex.texts, *ex.choices):
            texts.setdefault(t, len(texts))
    uniq = list(texts)
    ids = encode_texts(tokenizer, uniq, workers)
    lookup = dict(zip(uniq, ids))
    sp = SpecialIds.of(tokenizer)
    rule = truncation_rule(task)
    out = []
    for i, ex in enumerate(examples):
        seqs = transform_ids(kind, [lookup[t] for t in ex.texts], [lookup[c] for c in ex.choices], sp, n_ctx, rule)
        out.append(Encoded(seqs, ex.label, i, ex.uid, dict(ex.extra)))
    return out
