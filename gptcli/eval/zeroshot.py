"""The paper's zero-shot heuristics (§5, Figure 2 right): task performance of a language model that was never
fine-tuned, read off its next-token probabilities.

- SST-2: append ``very`` to the sentence; predict positive when p(``positive``) > p(``negative``) next.
- CoLA: average token log-probability of the sentence; acceptable above a threshold chosen on the train split to
  maximise Matthews correlation (or given); the score is MCC.
- RACE: the answer with the highest average token log-probability given the document and the question.
- DPRD / WSC273: substitute each candidate for the pronoun; the candidate under which the rest of the sentence
  has the higher average token log-probability wins (see :mod:`gptcli.tasks.winograd` for locating the pronoun).
- Story Cloze (bonus): the ending with the higher average token log-probability given the four-sentence story.

Averages are per token (not per character). Every heuristic builds :class:`gptcli.eval.scoring.Request` objects from
separately tokenized context and continuation and lets :func:`gptcli.eval.scoring.score` batch them; truncation rules
live there. Ties (equal scores) go to the first choice (SST-2: negative; CoLA: unacceptable).

The library entry point is :func:`zeroshot` over a :class:`ZeroShotConfig`; the per-task functions
(:func:`sst2`, :func:`cola`, :func:`multiple_choice`, :func:`winograd`) take a model, a tokenizer and examples,
so they can be run on anything (the tests use a stub model with known log-probabilities).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gptcli.errors import DataError, GPT1Error

# Zero-shot task name -> (registry task or winograd reader, metric, default split).
TASKS: dict[str, tuple[str, str, str]] = {
    "sst2": ("sst2", "accuracy", "dev"),
    "cola": ("cola", "mcc", "dev"),
    "race": ("race", "accuracy", "dev"),
    "race-m": ("race-m", "accuracy", "dev"),
    "race-h": ("race-h", "accuracy", "dev"),
    "dprd": ("dprd", "accuracy", "test"),
    "wsc": ("wsc", "accuracy", "test"),
    "storycloze": ("storycloze", "accuracy", "val"),
}
# `--task all`: the paper's four Figure 2 tasks, then WSC273 and the bonus Story Cloze.
ALL_TASKS: tuple[str, ...] = ("sst2", "cola", "race", "dprd", "wsc", "storycloze")
# Winograd files, per split, under the task folder ($GPT1_DATA/dprd, $GPT1_DATA/wsc).
WINOGRAD_FILES: dict[str, dict[str, str]] = {
    "dprd": {"train": "train.c.txt", "test": "test.c.txt"},
    "wsc": {"test": "WSCollection.xml"},
}
SST2_CUE, SST2_WORDS = "very", ("negative", "positive")  # label 0, label 1
Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: called as scoring requests complete (``what`` names the task and split)."""


@dataclass
class ZeroShotConfig:
    """Settings of ``gpt1 zeroshot`` (one checkpoint; the curve over many is in :mod:`gptcli.eval.curve`)."""

    task: str = "sst2"
    """A task of :data:`TASKS`, or ``all``."""
    checkpoint: str = ""
    """Checkpoint directory, or a run directory (its newest checkpoint)."""
    split: str | None = None
    """Split to score (default per task: dev; DPRD test; WSC273 its only file; Story Cloze the whole 2016 val file)."""
    splits: dict[str, str] = field(default_factory=dict)
    """Per-task split overrides (``{"dprd": "train"}``), applied over ``split``."""
    data_dir: str | None = None
    """Task folder (one task) or the root holding every task folder (``all``); default ``$GPT1_DATA``."""
    out: str | None = None
    """Directory for ``results.json`` and ``predictions-<task>.jsonl``; nothing is written when unset."""
    threshold: float | None = None
    """CoLA: fixed average log-probability threshold instead of fitting it on the train split."""
    batch_size: int = 32
    """Rows per forward pass."""
    limit: int | None = None
    """Score only the first N examples of each split (the CoLA threshold split included)."""
    precision: str = "auto"
    """``auto`` (bf16 autocast on CUDA and on CPUs with native bf16, else fp32), ``fp32``, ``bf16`` or ``fp16``."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``…"""


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
    from gptcli.eval.scoring import score

    cb = None
    if progress is not None:
        done, total = [0], len(requests)
        progress(what, 0, total)

        def cb(n: int) -> None:
            done[0] += n
            progress(what, done[0], total)

    out = score(model, requests, batch_size=batch_size, precision=precision, progress=cb)  # type: ignore[arg-type]
    if progress is not None:
        progress(what, len(requests), len(requests))  # requests with nothing to score never report
    return out


def _metric(name: str, preds: Sequence[int], labels: Sequence[int]) -> float:
    from gptcli.eval import metrics

    if name == "accuracy":
        return 100.0 * float(metrics.accuracy(list(preds), list(labels)))
    return 100.0 * float(metrics.mcc(list(preds), list(labels)))


def _fmt(x: float) -> float | None:
    """JSON-safe float (nan → null)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


# --- the heuristics ---------------------------------------------------------------------------------------------


def sst2(model, tokenizer, examples, *, batch_size: int = 32, precision: str = "auto", progress: Progress | None = None) -> TaskResult:
    """``<sentence> very`` → compare log p(positive) with log p(negative) as the next word(s).

    When both words are single tokens, one forward pass of ``<sentence> very`` gives both probabilities. A word
    the vocabulary splits is scored as its whole token sequence (the sum of its tokens' log-probabilities, i.e.
    the probability of the word), which costs a pass per word; the result's notes say so.
    """
    from gptcli.eval.scoring import Request

    cue = _encode(tokenizer, [SST2_CUE])[0]
    words = _encode(tokenizer, list(SST2_WORDS))
    split_words = [f"'{w}' = {len(ids)} tokens" for w, ids in zip((SST2_CUE, *SST2_WORDS), (cue, *words)) if len(ids) != 1]
    notes = [f"multi-token words scored as full token sequences: {', '.join(split_words)}"] if split_words else []
    contexts = [ids + cue for ids in _encode(tokenizer, [ex.texts[0] for ex in examples])]
    requests = [Request.of(c, w) for c in contexts for w in words]
    scores = _score(model, requests, batch_size, precision, progress, "sst2")
    preds, preds_out = [], []
    for k, ex in enumerate(examples):
        neg, pos = scores[2 * k], scores[2 * k + 1]
        p = int(pos.logprob > neg.logprob)
        preds.append(p)
        preds_out.append({"uid": ex.uid, "label": ex.label, "prediction": p, "logprob_negative": neg.logprob, "logprob_positive": pos.logprob, "truncated": pos.truncated})
    labels = [int(ex.label) for ex in examples]
    n_trunc = sum(p["truncated"] for p in preds_out)
    if n_trunc:
        notes.append(f"{n_trunc} sentences left-truncated to fit the context window")
    return TaskResult("sst2", "", "accuracy", _metric("accuracy", preds, labels), len(examples), preds_out, notes)


def sentence_scores(model, tokenizer, sentences: Sequence[str], *, batch_size: int = 32, precision: str = "auto", progress: Progress | None = None, what: str = "") -> list[float]:
    """Average token log-probability of each sentence (tokens 2…n: nothing predicts the first one)."""
    from gptcli.eval.scoring import Request

    scores = _score(model, [Request.of((), ids) for ids in _encode(tokenizer, sentences)], batch_size, precision, progress, what)
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


def cola(model, tokenizer, examples, *, train_examples=None, threshold: float | None = None, batch_size: int = 32, precision: str = "auto", progress: Progress | None = None) -> TaskResult:
    """Average token log-probability per sentence, thresholded; MCC. The threshold comes from ``threshold`` or is
    fitted on ``train_examples``."""
    notes = []
    if threshold is None:
        if not train_examples:
            raise GPT1Error("cola: a threshold is needed: give --threshold or make the train split available")
        tr = sentence_scores(model, tokenizer, [ex.texts[0] for ex in train_examples], batch_size=batch_size, precision=precision, progress=progress, what="cola (train: threshold)")
        threshold, train_mcc = fit_threshold(tr, [int(ex.label) for ex in train_examples])
        notes.append(f"threshold {threshold:.4f} fitted on {len(train_examples)} train sentences (train MCC {train_mcc:.1f})")
    else:
        notes.append(f"threshold {threshold:.4f} given")
    sc = sentence_scores(model, tokenizer, [ex.texts[0] for ex in examples], batch_size=batch_size, precision=precision, progress=progress, what="cola")
    preds = [int(v > threshold) for v in sc]
    labels = [int(ex.label) for ex in examples]
    out = [{"uid": ex.uid, "label": ex.label, "prediction": p, "mean_logprob": v} for ex, p, v in zip(examples, preds, sc)]
    return TaskResult("cola", "", "mcc", _metric("mcc", preds, labels), len(examples), out, notes, threshold=threshold)


def multiple_choice(model, tokenizer, name: str, contexts: Sequence[str | Sequence[str]], choices: Sequence[Sequence[str]], labels: Sequence[int | None], uids: Sequence[str] = (), *, batch_size: int = 32, precision: str = "auto", progress: Progress | None = None) -> TaskResult:
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
        out.append({"uid": uids[i] if uids else str(i), "label": labels[i], "prediction": p, "mean_logprobs": [_fmt(m) for m in means]})
    notes = [f"{n_trunc} contexts left-truncated to fit the context window"] if n_trunc else []
    labeled = [(p, l) for p, l in zip(preds, labels) if l is not None]
    score = _metric("accuracy", [p for p, _ in labeled], [int(l) for _, l in labeled]) if labeled else float("nan")
    return TaskResult(name, "", "accuracy", score, len(preds), out, notes)


def winograd(model, tokenizer, name: str, schemas, *, batch_size: int = 32, precision: str = "auto", progress: Progress | None = None) -> TaskResult:
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
        out.append({"uid": s.source, "label": s.label, "prediction": p, "mean_logprobs": [_fmt(a), _fmt(b)], "candidates": list(s.candidates)})
    notes = [f"{fallback} schemas end with the pronoun: whole substituted sentences scored"] if fallback else []
    n_trunc = sum(scores[2 * i].truncated or scores[2 * i + 1].truncated for i in range(len(schemas)))
    if n_trunc:
        notes.append(f"{n_trunc} schemas left-truncated to fit the context window")
    return TaskResult(name, "", "accuracy", _metric("accuracy", preds, [s.label for s in schemas]), len(schemas), out, notes)


# --- data --------------------------------------------------------------------------------------------------------


def task_dir(task: str, data_dir: str | None, root: bool) -> str | None:
    """The folder to read ``task`` from: ``data_dir`` itself for one task; with several tasks ``data_dir`` is a
    root like ``$GPT1_DATA`` (``<root>/<folder>``, then ``<root>/<parent>/<folder>`` as the registry looks)."""
    if data_dir is None or not root:
        return data_dir
    if task in WINOGRAD_FILES:
        return str(Path(data_dir) / task)
    from gptcli.tasks import get_task

    t = get_task(TASKS[task][0])
    candidates = [Path(data_dir) / t.folder] + [Path(data_dir) / p / t.folder for p in t.parent_folders]
    return str(next((c for c in candidates if c.is_dir()), candidates[0]))


def winograd_dir(task: str, data_dir: str | None) -> Path:
    """``data_dir`` or ``$GPT1_DATA/<task>`` for DPRD/WSC273."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get("GPT1_DATA"):
        return Path(os.environ["GPT1_DATA"]) / task
    files = WINOGRAD_FILES[task]
    raise GPT1Error(f"no data location for task {task!r}: pass --data-dir or set GPT1_DATA so that $GPT1_DATA/{task}/ holds {', '.join(files.values())}")


def default_winograd_split(task: str, data_dir: str | None) -> tuple[str, str | None]:
    """The default split of a Winograd task, falling back to another split whose file exists.

    Zero-shot scoring trains on nothing, so when DPRD's test file is absent (only ``train.c.txt`` is at hand, as in
    many copies of the data set) its train split is an equally unseen evaluation set; the returned note says so.
    """
    default = TASKS[task][2]
    files = WINOGRAD_FILES[task]
    try:
        d = winograd_dir(task, data_dir)
    except GPT1Error:
        return default, None
    if (d / files[default]).is_file():
        return default, None
    for split, name in files.items():
        if (d / name).is_file():
            return split, f"{files[default]} not found: scored the {split} split ({name}) instead"
    return default, None


def read_winograd(task: str, split: str, data_dir: str | None):
    """DPRD / WSC273 schemas, found like the registry's tasks (``data_dir`` or ``$GPT1_DATA/<task>``)."""
    from gptcli.tasks.winograd import read_dprd, read_wsc

    files = WINOGRAD_FILES[task]
    if split not in files:
        raise GPT1Error(f"task {task!r} has no split {split!r} (splits: {', '.join(files)})")
    d = winograd_dir(task, data_dir)
    path = d / files[split]
    if not path.is_file():
        raise GPT1Error(f"{path}: missing {split} file for task {task!r} (expected {files[split]} in {d})")
    return read_dprd(path) if task == "dprd" else read_wsc(path)


def split_for(task: str, config: ZeroShotConfig) -> str:
    return config.splits.get(task) or config.split or TASKS[task][2]


def run_task(task: str, model, tokenizer, config: ZeroShotConfig, *, root: bool = False, progress: Progress | None = None) -> TaskResult:
    """Read ``task``'s split (and CoLA's train split), run its heuristic, time it."""
    if task not in TASKS:
        raise GPT1Error(f"unknown zero-shot task {task!r} (known: {', '.join(TASKS)}, all)")
    split = split_for(task, config)
    ddir = task_dir(task, config.data_dir, root)
    lim = config.limit
    kw = dict(batch_size=config.batch_size, precision=config.precision, progress=progress)
    t0 = time.perf_counter()
    if task in WINOGRAD_FILES:
        fallback_note = None
        if not (config.splits.get(task) or config.split):
            split, fallback_note = default_winograd_split(task, ddir)
        schemas = read_winograd(task, split, ddir)[:lim]
        t0 = time.perf_counter()
        res = winograd(model, tokenizer, task, schemas, **kw)
        if fallback_note:
            res.notes.insert(0, fallback_note)
    else:
        from gptcli.tasks import get_task

        t = get_task(TASKS[task][0])
        examples = [ex for ex in t.read(split, ddir) if ex.label is not None][:lim]
        if not examples:
            raise GPT1Error(f"task {task!r}: no labeled examples in split {split!r}")
        if task == "sst2":
            t0 = time.perf_counter()
            res = sst2(model, tokenizer, examples, **kw)
        elif task == "cola":
            train = None
            if config.threshold is None:
                try:
                    train = [ex for ex in t.read("train", ddir) if ex.label is not None][:lim]
                except DataError:
                    raise
                except GPT1Error as e:
                    raise GPT1Error(f"{e} — the CoLA threshold is fitted on the train split; give --threshold to skip it") from None
            t0 = time.perf_counter()
            res = cola(model, tokenizer, examples, train_examples=train, threshold=config.threshold, **kw)
        else:  # RACE, Story Cloze: multiple choice
            t0 = time.perf_counter()
            contexts = [tuple(ex.texts) for ex in examples]
            res = multiple_choice(model, tokenizer, task, contexts, [ex.choices for ex in examples], [ex.label for ex in examples], [ex.uid for ex in examples], **kw)
    res.seconds = time.perf_counter() - t0
    res.task, res.split = task, split
    return res


def open_model(checkpoint: str | Path, device: str = "auto"):
    """``(model, tokenizer, checkpoint)`` ready for scoring on ``device``."""
    from gptcli.checkpoint import load_checkpoint

    from gptcli.runtime import resolve_device

    ck = load_checkpoint(checkpoint)
    if ck.tokenizer is None:
        raise GPT1Error(f"{ck.path}: checkpoint has no tokenizer/ directory; zero-shot scoring needs the tokenizer it was trained with")
    model = ck.model.to(resolve_device(device)).eval()
    return model, ck.tokenizer, ck


def task_list(task: str) -> list[str]:
    if task == "all":
        return list(ALL_TASKS)
    names = [t.strip().lower() for t in task.split(",") if t.strip()]
    for n in names:
        if n not in TASKS:
            raise GPT1Error(f"unknown zero-shot task {n!r} (known: {', '.join(TASKS)}, all)")
    return names


def evaluate(model, tokenizer, config: ZeroShotConfig, on_skip: Callable[[str, str], None] | None = None, progress: Progress | None = None) -> tuple[dict[str, TaskResult], dict[str, str]]:
    """Run every task of ``config.task`` on an open model. With several tasks, a task whose data is missing is
    skipped (its reason returned) instead of stopping the others; with one task it raises."""
    tasks = task_list(config.task)
    several = len(tasks) > 1
    results, skipped = {}, {}
    for t in tasks:
        try:
            results[t] = run_task(t, model, tokenizer, config, root=several, progress=progress)
        except DataError:
            raise  # a malformed file is an error to fix, not a task to skip
        except GPT1Error as e:
            if not several:
                raise
            skipped[t] = str(e)
            if on_skip:
                on_skip(t, str(e))
    if not results:
        raise GPT1Error("no task could be scored: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return results, skipped


def write_results(out: str | Path, results: dict[str, TaskResult], meta: dict[str, Any], skipped: dict[str, str] | None = None) -> Path:
    """``results.json`` and ``predictions-<task>.jsonl`` in ``out``, each written to a temporary name first."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[Path, str] = {}
    for name, r in results.items():
        files[d / f"predictions-{name}.jsonl"] = "".join(json.dumps(json_safe(p), default=_json_default, allow_nan=False) + "\n" for p in r.predictions)
    body = {**meta, "tasks": {k: r.summary() for k, r in results.items()}, "skipped": skipped or {}}
    files[d / "results.json"] = json.dumps(json_safe(body), indent=2, default=_json_default, allow_nan=False) + "\n"
    for path, text in files.items():
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
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


def zeroshot(config: ZeroShotConfig, on_skip: Callable[[str, str], None] | None = None, progress: Progress | None = None) -> tuple[dict[str, TaskResult], dict[str, str], dict[str, Any]]:
    """Library entry point: open ``config.checkpoint``, run its task(s), write ``config.out`` if set.

    Returns ``(results, skipped, meta)`` with meta = checkpoint path, step and settings.
    """
    if not config.checkpoint:
        raise GPT1Error("no checkpoint given")
    model, tokenizer, ck = open_model(config.checkpoint, config.device)
    results, skipped = evaluate(model, tokenizer, config, on_skip, progress)
    from gptcli.config import to_dict

    meta = {"checkpoint": str(ck.path), "step": ck.meta.get("step"), "config": to_dict(config)}
    if config.out:
        write_results(config.out, results, meta, skipped)
    return results, skipped, meta
