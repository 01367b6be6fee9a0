"""A toy acceptability task for the quickstart: a sentence as written (acceptable) or with its words shuffled.

In the spirit of CoLA: a language model that has learned English word order should tell ``Return whether the file
supports seeking.`` from ``Seeking the return file whether supports.``. It needs no download:
:func:`prose_sentences` picks clean prose out of any text (the quickstart uses the standard library's docstrings),
:func:`make_rows` pairs each sentence with a shuffled copy, and :func:`write_task_files` writes CoLA's own file
format, so CoLA's reader, transformation and metrics serve it unchanged.

It is not one of the paper's benchmarks, so it stays out of the registry's families (and ``--list-tasks``);
:func:`registered` makes it visible to :func:`gptcli.tasks.get_task` inside a ``with`` block.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gptcli.tasks.base import Split, Task
from gptcli.tasks.glue import read_cola

NAME = "shuffled"
SPLITS = ("train", "dev", "test")

SHUFFLED = Task(
    name=NAME,
    title="Original vs word-shuffled sentences (quickstart toy task, CoLA-style)",
    kind="classification",
    labels=("0", "1"),
    metric="mcc",
    folder="shuffled",
    splits={s: Split((f"{s}.tsv",), read_cola) for s in SPLITS},
    extra_metrics=("accuracy",),
    notes="Built by `gpt1 quickstart` from held-out text; CoLA's file format; 1 = as written, 0 = words shuffled.",
)
"""The task. Its folder is whatever directory :func:`write_task_files` wrote (pass it as ``data_dir``)."""

# A prose word: letters, inner apostrophes/hyphens, and at most one trailing , ; or :  (no code, no numbers).
_WORD = re.compile(r"^[A-Za-z][A-Za-z'-]*[,;:]?$")
# Sentence ends: . ! ? followed by whitespace and a capital letter.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PARAGRAPH = re.compile(r"\n\s*\n")


def prose_sentences(text: str, min_words: int = 6, max_words: int = 30) -> list[str]:
    """Clean prose sentences of ``text`` in order: paragraphs with code (doctest prompts, indented blocks) are
    skipped; a kept sentence starts with a capital letter, ends with a period, has ``min_words…max_words``
    words and every word is plain letters (with an optional trailing ``,`` ``;`` ``:``)."""
    out: list[str] = []
    for para in _PARAGRAPH.split(text):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        if not lines or any(ln.lstrip().startswith((">>>", "...", "$ ")) for ln in lines):
            continue
        if len({len(ln) - len(ln.lstrip()) for ln in lines}) > 1:  # an indented block: code or a table
            continue
        joined = " ".join(ln.strip() for ln in lines)
        for s in _SENTENCE_END.split(joined):
            words = s.split()
            if not min_words <= len(words) <= max_words or not s.endswith(".") or not s[0].isupper():
                continue
            last = words[-1][:-1]
            if last and all(_WORD.match(w) for w in words[:-1]) and _WORD.match(last):
                out.append(" ".join(words))
    return out


def shuffle_words(sentence: str, rng: random.Random) -> str:
    """The sentence's words in a random different order, with the capital letter and final period where a
    sentence has them, so that only the order of the words gives it away."""
    words = sentence[:-1].split() if sentence.endswith(".") else sentence.split()
    first = words[0] if words else ""
    if first[:1].isupper() and first[1:].islower() and first != "I":  # sentence-initial capital, not a name
        words[0] = first.lower()
    if len(set(words)) < 2:
        raise ValueError(f"cannot shuffle {sentence!r}: fewer than two distinct words")
    order = list(words)
    while order == words:  # terminates: two distinct words make a different order likely at every draw
        rng.shuffle(order)
    order[0] = order[0][:1].upper() + order[0][1:]
    body = " ".join(order)
    if body.endswith((",", ";", ":")):  # a clause mark moved to the end: drop it before the period
        body = body[:-1]
    return body + "." if sentence.endswith(".") else body


@dataclass
class TaskRow:
    sentence: str
    label: int
    """1 = as written (acceptable), 0 = words shuffled."""
    source: str
    """Where the sentence came from (the quickstart: the standard-library module)."""


def make_rows(sentences: Iterable[tuple[str, str]], seed: int) -> list[list[TaskRow]]:
    """``(source, sentence)`` pairs → one group per distinct sentence: the sentence as written (label 1) and a
    seeded shuffle of its words (label 0), in random order; groups come in a seeded random order.

    Duplicate sentences are dropped (docstrings repeat themselves), and :func:`split_rows` keeps each group in
    one split, so no sentence is seen in training and tested on. Both versions of every sentence are present,
    so the classes are exactly balanced and only word order tells them apart.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    unique: list[tuple[str, str]] = []
    for source, s in sentences:
        key = s.lower()
        if key not in seen and len(set(key[:-1].split())) >= 2:
            seen.add(key)
            unique.append((source, s))
    rng.shuffle(unique)
    groups = []
    for src, s in unique:
        pair = [TaskRow(s, 1, src), TaskRow(shuffle_words(s, rng), 0, src)]
        rng.shuffle(pair)
        groups.append(pair)
    return groups


def split_rows(
    groups: Sequence[Sequence[TaskRow]], fractions: tuple[float, float, float] = (0.6, 0.1, 0.3)
) -> dict[str, list[TaskRow]]:
    """Consecutive train/dev/test slices of the groups of :func:`make_rows` (already shuffled), flattened."""
    n = len(groups)
    n_train = int(fractions[0] * n)
    n_dev = int(fractions[1] * n)
    cut = {"train": groups[:n_train], "dev": groups[n_train : n_train + n_dev], "test": groups[n_train + n_dev :]}
    return {k: [r for g in v for r in g] for k, v in cut.items()}


def _clean(field: str) -> str:
    return " ".join(field.replace("\t", " ").split())


def write_task_files(splits: Mapping[str, Sequence[TaskRow]], directory: str | Path) -> Path:
    """Write ``<split>.tsv`` files in CoLA's train/dev format into ``directory``; returns it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        lines = [
            f"{_clean(r.source) or '-'}\t{r.label}\t{'' if r.label else '*'}\t{_clean(r.sentence)}\n" for r in rows
        ]
        (d / f"{name}.tsv").write_text("".join(lines), encoding="utf-8")
    return d


@contextmanager
def registered(task: Task = SHUFFLED) -> Iterator[Task]:
    """Make ``task`` visible to :func:`gptcli.tasks.get_task` inside the block (a no-op if it already is)."""
    from gptcli.errors import GPT1Error
    from gptcli.tasks import registry

    try:
        registry.get_task(task.name)
        present = True
    except GPT1Error:
        present = False
    if present:
        yield task
        return
    registry.register(task)
    try:
        yield task
    finally:
        # Leaving the toy task in would change `all_tasks()` for the rest of the process (e.g. `--list-tasks`
        # in the same interpreter), so take it out again.
        registry.unregister(task.name)


__all__ = [
    "NAME",
    "SHUFFLED",
    "TaskRow",
    "make_rows",
    "prose_sentences",
    "registered",
    "shuffle_words",
    "split_rows",
    "write_task_files",
]
