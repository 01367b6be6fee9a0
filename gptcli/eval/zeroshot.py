"""The paper's zero-shot heuristics (§5, Figure 2 right): task scores of a language model never fine-tuned.

SST-2 compares p(``positive``) with p(``negative``) after ``<sentence> very``; CoLA thresholds the average token
log-probability (MCC); RACE and Story Cloze pick the choice with the highest average token log-probability; DPRD
and WSC273 substitute each candidate for the pronoun and score the rest of the sentence. Averages are per token;
ties go to the first choice.

:func:`zeroshot` is the library entry point over a :class:`ZeroShotConfig`; the per-task functions take a model, a
tokenizer and examples, so they run on anything (the tests use a stub model). All of them build
:class:`gptcli.eval.scoring.Request` objects and let :func:`gptcli.eval.scoring.score` batch them.

Task data comes from the registry (:mod:`gptcli.tasks`). Which heuristic scores a task, and on which split, lives
here in :data:`TASKS`: these are facts of the paper's §5 protocol, not of the data sets, and the task room below
cannot name this room's heuristics.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from gptcli.checkpoint import atomic_directory
from gptcli.errors import DataError, GPT1Error
from gptcli.eval.zeroshot_config import ZeroShotConfig
from gptcli.files.fsutil import write_text_atomic
from gptcli.files.locks import maybe_lock
from gptcli.files.outputs import check_output, mark
from gptcli.progress import SILENT, Progress
from gptcli.tasks.base import Example, Task

SST2_CUE, SST2_WORDS = "very", ("negative", "positive")  # label 0, label 1


@dataclass
class TaskResult:
    task: str
    split: str
    metric: str
    score: float
    """Accuracy in percent, or MCC × 100 (the paper's units)."""
    n: int
    """Examples scored."""
    predictions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    threshold: float | None = None
    seconds: float = 0.0

    @property
    def examples_per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("nan")

    def summary(self) -> dict[str, Any]:
        """Everything but the per-example predictions (what ``results.json`` holds)."""
        d = {k: v for k, v in asdict(self).items() if k != "predictions"}
        d["examples_per_s"] = self.examples_per_s
        return d


# --- scoring helpers --------------------------------------------------------------------------------------------


def _encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [list(x) for x in tokenizer.encode_batch(list(texts))] if texts else []


def _score(model, requests, batch_size: int, precision: str, progress: Progress | None = None, what: str = ""):
    from gptcli.eval.scoring import Precision, score

    return score(
        model,
        requests,
        batch_size=batch_size,
        precision=cast(Precision, precision),  # the CLI's name; score resolves it and refuses unknown ones
        progress=progress,
        stage=f"scoring {what}" if what else "scoring",
    )


def _metric(name: str, preds: Sequence[int], labels: Sequence[int]) -> float:
    from gptcli.eval import metrics

    if name == "accuracy":
        return 100.0 * float(metrics.accuracy(list(preds), list(labels)))
    return 100.0 * float(metrics.mcc(list(preds), list(labels)))


def _fmt(x: float) -> float | None:
    """JSON-safe float (nan → null)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


# --- the heuristics ---------------------------------------------------------------------------------------------


def sst2(
    model, tokenizer, examples, *, batch_size: int = 32, precision: str = "auto", progress: Progress | None = None
) -> TaskResult:
    """``<sentence> very`` → compare log p(positive) with log p(negative) as the next word(s).

    When both words are single tokens, one forward pass of ``<sentence> very`` gives both probabilities. A word
    the vocabulary splits is scored as its whole token sequence (the sum of its tokens' log-probabilities, i.e.
    the probability of the word), which costs a pass per word; the result's notes say so.
    """
    from gptcli.eval.scoring import Request

    cue = _encode(tokenizer, [SST2_CUE])[0]
    words = _encode(tokenizer, list(SST2_WORDS))
    split_words = [
        f"'{w}' = {len(ids)} tokens" for w, ids in zip((SST2_CUE, *SST2_WORDS), (cue, *words)) if len(ids) != 1
    ]
    notes = [f"multi-token words scored as full token sequences: {', '.join(split_words)}"] if split_words else []
    contexts = [ids + cue for ids in _encode(tokenizer, [ex.texts[0] for ex in examples])]
    requests = [Request.of(c, w) for c in contexts for w in words]
    scores = _score(model, requests, batch_size, precision, progress, "sst2")
    preds, preds_out = [], []
    for k, ex in enumerate(examples):
        neg, pos = scores[2 * k], scores[2 * k + 1]
        p = int(pos.logprob > neg.logprob)
        preds.append(p)
        preds_out.append(
            {
                "uid": ex.uid,
                "label": ex.label,
                "prediction": p,
                "logprob_negative": neg.logprob,
                "logprob_positive": pos.logprob,
                "truncated": pos.truncated,
            }
        )
    labels = [int(ex.label) for ex in examples]
    n_trunc = sum(p["truncated"] for p in preds_out)
    if n_trunc:
        notes.append(f"{n_trunc} sentences left-truncated to fit the context window")
    return TaskResult("sst2", "", "accuracy", _metric("accuracy", preds, labels), len(examples), preds_out, notes)


def sentence_scores(
    model,
    tokenizer,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    precision: str = "auto",
    progress: Progress | None = None,
    what: str = "",
) -> list[float]:
    """Average token log-probability of each sentence (tokens 2…n: nothing predicts the first one)."""
    from gptcli.eval.scoring import Request

    scores = _score(
        model, [Request.of((), ids) for ids in _encode(tokenizer, sentences)], batch_size, precision, progress, what
    )
    # A one-token sentence has nothing scored: treat it as unsurprising (0.0, the highest possible average).
    return [s.mean if s.count else 0.0 for s in scores]


def fit_threshold(scores: Sequence[float], labels: Sequence[int], max_candidates: int = 2000) -> tuple[float, float]:
    """The threshold on average log-probability that maximises MCC of ``score > threshold`` on these labels.

    Candidates are the midpoints between consecutive distinct scores (thinned to ``max_candidates`` evenly spaced
    ones on large splits); returns ``(threshold, mcc × 100)``. The first best candidate wins.
    """
    import numpy as np

    from gptcli.eval import metrics

    s = np.asarray(scores, dtype=np.float64)
    y = [int(v) for v in labels]
    u = np.unique(s)
    cand = np.concatenate([[u[0] - 1.0], (u[:-1] + u[1:]) / 2]) if len(u) > 1 else np.array([u[0] - 1.0])
    if len(cand) > max_candidates:
        cand = cand[np.linspace(0, len(cand) - 1, max_candidates).round().astype(int)]
    best_t, best_m = float(cand[0]), -2.0
    for t in cand:
        m = float(metrics.mcc((s > t).astype(int).tolist(), y))
        if m > best_m:
            best_t, best_m = float(t), m
    return best_t, 100.0 * best_m


def cola(
    model,
    tokenizer,
    examples,
    *,
    train_examples=None,
    threshold: float | None = None,
    batch_size: int = 32,
    precision: str = "auto",
    progress: Progress | None = None,
) -> TaskResult:
    """Average token log-probability per sentence, thresholded; MCC. The threshold comes from ``threshold`` or is
    fitted on ``train_examples``."""
    notes = []
    if threshold is None:
        if not train_examples:
            raise GPT1Error("cola: a threshold is needed: give --threshold or make the train split available")
        tr = sentence_scores(
            model,
            tokenizer,
            [ex.texts[0] for ex in train_examples],
            batch_size=batch_size,
            precision=precision,
            progress=progress,
            what="cola (train: threshold)",
        )
        threshold, train_mcc = fit_threshold(tr, [int(ex.label) for ex in train_examples])
        notes.append(
            f"threshold {threshold:.4f} fitted on {len(train_examples)} train sentences (train MCC {train_mcc:.1f})"
        )
    else:
        notes.append(f"threshold {threshold:.4f} given")
    sc = sentence_scores(
        model,
        tokenizer,
        [ex.texts[0] for ex in examples],
        batch_size=batch_size,
        precision=precision,
        progress=progress,
        what="cola",
    )
    preds = [int(v > threshold) for v in sc]
    labels = [int(ex.label) for ex in examples]
    out = [
        {"uid": ex.uid, "label": ex.label, "prediction": p, "mean_logprob": v} for ex, p, v in zip(examples, preds, sc)
    ]
    return TaskResult("cola", "", "mcc", _metric("mcc", preds, labels), len(examples), out, notes, threshold=threshold)


def multiple_choice(
    model,
    tokenizer,
    name: str,
    contexts: Sequence[str | Sequence[str]],
    choices: Sequence[Sequence[str]],
    labels: Sequence[int | None],
    uids: Sequence[str] = (),
    *,
    batch_size: int = 32,
    precision: str = "auto",
    progress: Progress | None = None,
) -> TaskResult:
    """Pick the choice with the highest average token log-probability after its context (RACE, Story Cloze).

    A context given as several strings (RACE: document, question) is tokenized piece by piece and concatenated.
    """
    from gptcli.eval.scoring import Request

    ctx_ids: list[list[int]] = []
    for c in contexts:
        parts = [c] if isinstance(c, str) else list(c)
        ctx_ids.append([t for ids in _encode(tokenizer, parts) for t in ids])
    flat = [ch for chs in choices for ch in chs]
    ch_ids = _encode(tokenizer, flat)
    requests, k = [], 0
    for ctx, chs in zip(ctx_ids, choices):
        for _ in chs:
            requests.append(Request.of(ctx, ch_ids[k]))
            k += 1
    scores = _score(model, requests, batch_size, precision, progress, name)
    preds, out, k = [], [], 0
    n_trunc = 0
    for i, chs in enumerate(choices):
        means = [scores[k + j].mean for j in range(len(chs))]
        n_trunc += any(scores[k + j].truncated for j in range(len(chs)))
        k += len(chs)
        valid = [(m, j) for j, m in enumerate(means) if not math.isnan(m)]
        p = max(valid, key=lambda t: (t[0], -t[1]))[1] if valid else 0
        preds.append(p)
        out.append(
            {
                "uid": uids[i] if uids else str(i),
                "label": labels[i],
                "prediction": p,
                "mean_logprobs": [_fmt(m) for m in means],
            }
        )
    notes = [f"{n_trunc} contexts left-truncated to fit the context window"] if n_trunc else []
    labeled = [(p, y) for p, y in zip(preds, labels) if y is not None]
    score = _metric("accuracy", [p for p, _ in labeled], [int(y) for _, y in labeled]) if labeled else float("nan")
    return TaskResult(name, "", "accuracy", score, len(preds), out, notes)


def winograd(
    model,
    tokenizer,
    name: str,
    schemas,
    *,
    batch_size: int = 32,
    precision: str = "auto",
    progress: Progress | None = None,
) -> TaskResult:
    """Substitute each candidate for the pronoun; the higher average log-probability of the rest of the sentence
    wins. When nothing follows the pronoun, the whole substituted sentence is scored instead (noted)."""
    from gptcli.eval.scoring import Request

    requests, fallback = [], 0
    for s in schemas:
        pairs = [s.substitute(j) for j in range(2)]
        ctx = _encode(tokenizer, [c for c, _ in pairs])
        rest = _encode(tokenizer, [a for _, a in pairs])
        if not rest[0]:
            fallback += 1
            requests += [Request.of((), c) for c in ctx]
        else:
            requests += [Request.of(c, r) for c, r in zip(ctx, rest)]
    scores = _score(model, requests, batch_size, precision, progress, name)
    preds, out = [], []
    for i, s in enumerate(schemas):
        a, b = scores[2 * i].mean, scores[2 * i + 1].mean
        p = int(b > a)
        preds.append(p)
        out.append(
            {
                "uid": s.uid,
                "source": s.source,
                "label": s.label,
                "prediction": p,
                "mean_logprobs": [_fmt(a), _fmt(b)],
                "candidates": list(s.candidates),
            }
        )
    notes = [f"{fallback} schemas end with the pronoun: whole substituted sentences scored"] if fallback else []
    n_trunc = sum(scores[2 * i].truncated or scores[2 * i + 1].truncated for i in range(len(schemas)))
    if n_trunc:
        notes.append(f"{n_trunc} schemas left-truncated to fit the context window")
    return TaskResult(
        name, "", "accuracy", _metric("accuracy", preds, [s.label for s in schemas]), len(schemas), out, notes
    )


# --- zero-shot tasks: the registry's data, scored by one heuristic each --------------------------------------------


@dataclass
class _Job:
    """One task to score: its registry entry, the examples read, and what the heuristic runs with."""

    name: str
    task: Task
    split: str
    examples: list[Example]
    model: Any
    tokenizer: Any
    config: ZeroShotConfig
    data_dir: Path | None
    progress: Progress | None
    note: str | None = None
    """Said first among the result's notes (a default split that fell back to another)."""
    train: list[Example] | None = None
    """CoLA's train split, read with the scored one when its threshold is to be fitted."""
    started: float = field(default_factory=time.perf_counter)
    """When scoring began: ``TaskResult.seconds`` times the scoring, not the reading of files."""

    @property
    def kw(self) -> dict[str, Any]:
        return {"batch_size": self.config.batch_size, "precision": self.config.precision, "progress": self.progress}


def _run_sst2(job: _Job) -> TaskResult:
    return sst2(job.model, job.tokenizer, job.examples, **job.kw)


def _read_cola_train(job: _Job) -> None:
    if job.config.threshold is not None:
        return
    try:
        job.train = read_labeled(job.task, "train", job.data_dir, job.config.limit)
    except DataError:
        raise
    except GPT1Error as e:
        raise GPT1Error(f"{e} — the CoLA threshold is fitted on the train split; give --threshold to skip it") from None


def _run_cola(job: _Job) -> TaskResult:
    return cola(
        job.model, job.tokenizer, job.examples, train_examples=job.train, threshold=job.config.threshold, **job.kw
    )


def _run_multiple_choice(job: _Job) -> TaskResult:
    exs = job.examples
    return multiple_choice(
        job.model,
        job.tokenizer,
        job.name,
        [tuple(ex.texts) for ex in exs],
        [ex.choices for ex in exs],
        cast(list[int | None], [ex.label for ex in exs]),  # a multiple-choice label is a choice index
        [ex.uid for ex in exs],
        **job.kw,
    )


def _run_winograd(job: _Job) -> TaskResult:
    from gptcli.tasks.winograd import Schema

    return winograd(job.model, job.tokenizer, job.name, [Schema.of(ex) for ex in job.examples], **job.kw)


@dataclass(frozen=True)
class ZeroShotTask:
    """How ``gpt1 zeroshot`` scores one registry task."""

    heuristic: Callable[[_Job], TaskResult]
    split: str
    """The split scored when none is given."""
    read_more: Callable[[_Job], None] | None = None
    """Reads what the heuristic needs besides the scored split, with it (before scoring starts)."""
    fallback: bool = False
    """When the default split's files are absent, score another split whose files exist (DPRD: many copies of the
    data set hold only ``train.c.txt``; zero-shot trains on nothing, so it is an equally unseen evaluation set)."""


TASKS: dict[str, ZeroShotTask] = {
    "sst2": ZeroShotTask(_run_sst2, "dev"),
    "cola": ZeroShotTask(_run_cola, "dev", read_more=_read_cola_train),
    "race": ZeroShotTask(_run_multiple_choice, "dev"),
    "race-m": ZeroShotTask(_run_multiple_choice, "dev"),
    "race-h": ZeroShotTask(_run_multiple_choice, "dev"),
    "dprd": ZeroShotTask(_run_winograd, "test", fallback=True),
    "wsc": ZeroShotTask(_run_winograd, "test"),
    "storycloze": ZeroShotTask(_run_multiple_choice, "val"),
}
"""Zero-shot task (its registry name) → heuristic and default split."""
# `--task all`: the paper's four Figure 2 tasks, then WSC273 and the bonus Story Cloze.
ALL_TASKS: tuple[str, ...] = ("sst2", "cola", "race", "dprd", "wsc", "storycloze")


def task_list(task: str) -> list[str]:
    """The zero-shot tasks named by ``task`` (``all``, one name or a comma-separated list; any case)."""
    if task.strip().lower() == "all":
        return list(ALL_TASKS)
    names = [t.strip().lower() for t in task.split(",") if t.strip()]
    for n in names:
        if n not in TASKS:
            raise GPT1Error(f"unknown zero-shot task {n!r} (known: {', '.join(TASKS)}, all)")
    return names


def check_config(config: ZeroShotConfig) -> None:
    """One-line errors for settings that cannot work, before any checkpoint is opened (every number by its one
    rule, :data:`gptcli.config.RULES`: ``--threshold nan`` is refused here as everywhere)."""
    from gptcli.config import check_settings

    check_settings(config)
    names = task_list(config.task)
    for k, split in config.splits.items():
        if k not in TASKS:
            raise GPT1Error(f"--split {k}=…: unknown task {k!r} (known: {', '.join(TASKS)})")
        if k not in names:  # it would be ignored without a word: a typo in --task or in the pair
            raise GPT1Error(
                f"--split {k}={split}: {k} is not among the tasks run ({', '.join(names)}; add it to "
                "--task or drop the pair)"
            )


# --- data: everything through the task registry ------------------------------------------------------------------


def registry_task(name: str) -> Task:
    """The registry entry of zero-shot task ``name`` (DPRD and WSC273 included)."""
    from gptcli.tasks import get_task

    return get_task(name, zero_shot=True)


def task_dir(task: Task, data_dir: str | Path | None, root: bool) -> Path | None:
    """The folder to read ``task`` from: ``data_dir`` itself for one task; with several tasks ``data_dir`` is a root
    like ``$GPT1_DATA`` and the registry finds the task's folder under it. ``None``: the registry's own lookup."""
    if data_dir is None:
        return None
    if not root:
        return Path(data_dir)
    return task.data_dir(root=data_dir)


def _has_files(task: Task, split: str, data_dir: Path) -> bool:
    return all((data_dir / f).exists() for f in task.splits[split].files)


def default_split(name: str, task: Task, data_dir: Path | None) -> tuple[str, str | None]:
    """The default split of zero-shot task ``name`` and, when it had to fall back to another split whose files
    exist (:attr:`ZeroShotTask.fallback`), a note saying so."""
    spec = TASKS[name]
    if not spec.fallback:
        return spec.split, None
    try:
        d = task.data_dir(data_dir)
    except GPT1Error:
        return spec.split, None  # reading the default split will say what is missing
    if _has_files(task, spec.split, d):
        return spec.split, None
    for split, sp in task.splits.items():
        if _has_files(task, split, d):
            missing = ", ".join(task.splits[spec.split].files)
            return split, f"{missing} not found: scored the {split} split ({', '.join(sp.files)}) instead"
    return spec.split, None


def read_labeled(task: Task, split: str, data_dir: Path | None, limit: int | None) -> list[Example]:
    """The labeled examples of one split (the first ``limit`` of them)."""
    examples = [ex for ex in task.read(split, data_dir) if ex.label is not None][:limit]
    if not examples:
        raise GPT1Error(f"task {task.name!r}: no labeled examples in split {split!r}")
    return examples


def read_task(
    task: str, model, tokenizer, config: ZeroShotConfig, *, root: bool = False, progress: Progress | None = None
) -> _Job:
    """``task``'s split (and CoLA's train split) read through the registry, ready to score: all of a task's reading
    comes before its progress stage, so a data error is the only line a failing run prints."""
    if task not in TASKS:
        raise GPT1Error(f"unknown zero-shot task {task!r} (known: {', '.join(TASKS)}, all)")
    t = registry_task(task)
    ddir = task_dir(t, config.data_dir, root)
    given = config.splits.get(task) or config.split  # a per-task override, then the split for every task
    split, note = (given, None) if given else default_split(task, t, ddir)
    job = _Job(
        task, t, split, read_labeled(t, split, ddir, config.limit), model, tokenizer, config, ddir, progress, note
    )
    read_more = TASKS[task].read_more
    if read_more is not None:
        read_more(job)
    return job


def score_task(job: _Job) -> TaskResult:
    """Run a read task's heuristic and time it."""
    job.started = time.perf_counter()
    res = TASKS[job.name].heuristic(job)
    res.seconds = time.perf_counter() - job.started
    res.task, res.split = job.name, job.split
    if job.note:
        res.notes.insert(0, job.note)
    return res


def run_task(
    task: str, model, tokenizer, config: ZeroShotConfig, *, root: bool = False, progress: Progress | None = None
) -> TaskResult:
    """Read ``task`` (:func:`read_task`) and score it (:func:`score_task`)."""
    return score_task(read_task(task, model, tokenizer, config, root=root, progress=progress))


# --- one checkpoint, every task ----------------------------------------------------------------------------------


def open_model(checkpoint: str | Path, device: str = "auto", verify: bool = True, progress: Progress | None = None):
    """``(model, tokenizer, checkpoint)`` ready for scoring on ``device``; ``verify`` checks the checkpoint's files
    against their checksums first. A fine-tuned checkpoint is scored (its language model, head ignored), with a
    warning note to ``progress``: the heuristics are the paper's for language models, Figure 2's curve over
    pretraining."""
    from gptcli.checkpoint import load_checkpoint
    from gptcli.model.kernels import apply as apply_kernels
    from gptcli.system.out_of_memory import move_model
    from gptcli.system.runtime import resolve_device

    ck = load_checkpoint(checkpoint, verify=verify)
    if ck.tokenizer is None:
        raise GPT1Error(
            f"{ck.path}: checkpoint has no tokenizer/ directory; "
            "zero-shot scoring needs the tokenizer it was trained with"
        )
    if ck.kind == "finetuned":
        (progress or SILENT).note(
            f"{ck.path} is fine-tuned (on {ck.meta.get('task', 'a task')}): the zero-shot heuristics are meant for "
            "pretrained language models (the paper's Figure 2); its task head is ignored and the scores say little "
            "about either",
            level="warn",
        )
    dev = resolve_device(device)
    model = move_model(ck.model, dev).eval()
    return apply_kernels(model, dev), ck.tokenizer, ck


def _summary(r: TaskResult) -> str:
    return f"{r.task} ({r.split}): {r.metric} {r.score:.1f} on {r.n} examples, {r.examples_per_s:.1f} examples/s"


def evaluate(
    model, tokenizer, config: ZeroShotConfig, progress: Progress | None = None, *, exclude: Collection[str] = ()
) -> tuple[dict[str, TaskResult], dict[str, str]]:
    """Run every task of ``config.task`` (but those in ``exclude``) on an open model, one progress stage each. With
    several tasks, a task whose data is missing is skipped (a warning note; its reason returned) instead of stopping
    the others, and ``data_dir`` is the root holding every task folder; with one task it raises."""
    report = progress or SILENT
    tasks = task_list(config.task)
    several = len(tasks) > 1
    results: dict[str, TaskResult] = {}
    skipped: dict[str, str] = {}
    for t in (t for t in tasks if t not in exclude):
        try:  # read before the stage is drawn: a task that cannot be read fails (or is skipped) in one line
            job = read_task(t, model, tokenizer, config, root=several, progress=report)
        except GPT1Error as e:
            _skip_or_raise(e, t, several, skipped, report)
            continue
        report.stage(f"zero-shot {t}")
        summary = ""
        try:
            results[t] = score_task(job)
            summary = _summary(results[t])
        except GPT1Error as e:
            _skip_or_raise(e, t, several, skipped, report)
        finally:
            report.end(summary)
    if not results:
        raise GPT1Error("no task could be scored: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return results, skipped


def _skip_or_raise(e: GPT1Error, task: str, several: bool, skipped: dict[str, str], report: Progress) -> None:
    """With several tasks, one that cannot be scored is skipped with a warning note; alone, it is the error. A
    malformed file is always an error to fix, not a task to skip."""
    if isinstance(e, DataError) or not several:
        raise e
    skipped[task] = str(e)
    report.note(f"skipped {task}: {e}", level="warn")


def input_paths(config: ZeroShotConfig, checkpoints: Sequence[str | Path]) -> list[Path]:
    """What a zero-shot run reads: the checkpoints and the task data (``--out`` may hold or lie inside neither)."""
    from gptcli.checkpoint import resolve_checkpoint

    paths = [resolve_checkpoint(c) for c in checkpoints]
    if config.data_dir:
        return paths + [Path(config.data_dir)]
    for name in task_list(config.task):
        try:
            paths.append(registry_task(name).data_dir())
        except GPT1Error:
            pass  # a task without data is reported (or skipped) when it is read
    return paths


def check_out(config: ZeroShotConfig, checkpoints: Sequence[str | Path]) -> None:
    """Refuse ``config.out`` before any scoring unless it is new, empty or earlier zero-shot results (which a re-run
    replaces whole), and outside every input."""
    if config.out:
        check_output(Path(config.out), "zeroshot", overwrite=True, inputs=input_paths(config, checkpoints))


def write_results(
    out: str | Path, results: dict[str, TaskResult], meta: dict[str, Any], skipped: dict[str, str] | None = None
) -> Path:
    """``results.json`` and ``predictions-<task>.jsonl`` in ``out``, written in a temporary folder that replaces
    ``out`` whole once complete (only earlier zero-shot results are ever replaced)."""
    d = Path(out)
    check_output(d, "zeroshot", overwrite=True)  # callers check with their inputs first; this guards the rest
    files: dict[str, str] = {}
    for name, r in results.items():
        files[f"predictions-{name}.jsonl"] = "".join(
            json.dumps(json_safe(p), default=_json_default, allow_nan=False) + "\n" for p in r.predictions
        )
    body = {**meta, "tasks": {k: r.summary() for k, r in results.items()}, "skipped": skipped or {}}
    files["results.json"] = json.dumps(json_safe(body), indent=2, default=_json_default, allow_nan=False) + "\n"

    def write(tmp: Path) -> None:
        mark(tmp, "zeroshot")
        for name, text in files.items():
            write_text_atomic(tmp / name, text)

    atomic_directory(d, write)
    return d / "results.json"


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def json_safe(o):
    """NaN/inf → null, recursively (JSON has no NaN)."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o


def zeroshot(
    config: ZeroShotConfig, progress: Progress | None = None
) -> tuple[dict[str, TaskResult], dict[str, str], dict[str, Any]]:
    """Library entry point: open ``config.checkpoint``, run its task(s), write ``config.out`` if set.

    Returns ``(results, skipped, meta)`` with meta = checkpoint path, step and settings.
    """
    from gptcli.config import to_dict
    from gptcli.model.kernels import use_kernels

    check_config(config)
    if not config.checkpoint:
        raise GPT1Error("no checkpoint given (--checkpoint DIR: a checkpoint or a run directory)")
    with maybe_lock(config.out), use_kernels(config.kernels):  # the caller's kernels mode back after
        check_out(config, [config.checkpoint])
        model, tokenizer, ck = open_model(config.checkpoint, config.device, config.verify, progress)
        results, skipped = evaluate(model, tokenizer, config, progress)
        meta = {"checkpoint": str(ck.path), "step": ck.meta.get("step"), "config": to_dict(config)}
        if config.out:
            write_results(config.out, results, meta, skipped)
    return results, skipped, meta
