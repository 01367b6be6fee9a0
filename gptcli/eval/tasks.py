"""Evaluate a fine-tuned checkpoint on a task split: metrics, per-example predictions, GLUE submission files.

``evaluate_task("rte", "runs/rte", split="dev")`` loads ``RUN/checkpoints/final`` (body, head, tokenizer), encodes
the split with the transformation and context the run was trained with, and writes ``results.json`` (metrics ×100,
headline first, beside the paper's number and the trivial predictor's level), ``predictions.jsonl`` and, for an
unlabeled GLUE test split, the ``<GLUE name>.tsv`` the GLUE server takes (the layout is in docs/eval.md).
:func:`evaluate_tasks` is ``gpt1 eval`` as a library call over an :class:`EvalConfig`: several checkpoints on
several tasks, or with ``data`` their perplexity on a prepared corpus.

A checkpoint may be scored on another task of the same kind and labels (``mnli`` → ``mnli-mm``, ``race`` →
``race-m``), because those tasks differ only in their data, not in the head.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gptcli.checkpoint import Checkpoint, atomic_directory, load_checkpoint, read_header, resolve_checkpoint
from gptcli.config import check_settings
from gptcli.data.batching import iterate
from gptcli.data.transforms import encode_examples
from gptcli.errors import GPT1Error
from gptcli.eval.baselines import prediction_summary, trivial_level
from gptcli.eval.metrics import score_predictions
from gptcli.eval.perplexity import corpus_perplexity
from gptcli.files.fsutil import write_text_atomic
from gptcli.files.locks import maybe_lock, output_lock
from gptcli.files.outputs import check_output, mark
from gptcli.model.classifier import FinetuneModel, predict
from gptcli.model.gpt import GPT
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.model.kernels import apply as apply_kernels
from gptcli.model.kernels import config_default, use_kernels
from gptcli.progress import SILENT, Progress, staged
from gptcli.system.out_of_memory import move_model
from gptcli.system.runtime import resolve_device, resolve_precision
from gptcli.tasks import Example, ReadOptions, Task, get_task
from gptcli.tasks.base import EVAL_SUBSET_SEED, subsample

RESULTS = "results.json"
PREDICTIONS = "predictions.jsonl"


@dataclass
class EvalConfig:
    """Settings of ``gpt1 eval``: checkpoints, and either a prepared corpus (perplexity) or tasks (their metric)."""

    checkpoint: list[str] = field(default_factory=list)
    """Checkpoint directory or run directory (newest checkpoint); repeat for several. `gpt1 eval` also takes a
    Hugging Face Hub id (``openai-gpt``, ``owner/name[@revision]``: converted once)."""
    data: str | None = None
    """Prepared corpus directory: report token-level perplexity on ``split``."""
    task: list[str] = field(default_factory=list)
    """Task(s) to score fine-tuned checkpoints on (comma list or repeat; default: each checkpoint's own task). See
    ``gpt1 finetune --list-tasks``."""
    split: str | None = None
    """Split to evaluate: corpus split (default val) or task split dev|test|train (default dev; an unlabeled test
    split writes a GLUE submission file)."""
    data_dir: str | None = None
    """The task's official data folder (default: ``$GPT1_DATA/<folder>``)."""
    out: str | None = None
    """Where task results, predictions and submission files go (default: ``RUN/eval/<task>-<split>/``); each
    ``<task>-<split>`` folder is replaced whole, and only when it holds earlier evaluation results."""
    skip_bad_rows: bool = False
    """Skip and count malformed task rows instead of stopping at the first."""
    max_examples: int | None = None
    """Score a random subset of this many task examples (quick checks): the examples a fine-tuning run with the
    same ``--max-eval-examples`` scored on its dev split."""
    batch_size: int = 8
    """Sequences per forward pass (a task example with several sequences counts once)."""
    seq_len: int | None = None
    """Perplexity window length (default: the length the pretraining run trained at, else the model's context)."""
    device: str = "auto"
    """auto, cpu or cuda[:N]."""
    precision: str = "fp32"
    """auto, fp32, bf16 or fp16 (autocast; weights stay fp32)."""
    kernels: str = field(default_factory=config_default)
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy). Default: the
    process's mode when the config is made ($GPT1_KERNELS, else auto)."""
    max_batches: int | None = None
    """Perplexity on only the first N batches."""
    verify: bool = True
    """Check each checkpoint's files (and with --data the corpus's shards) against their checksums first."""
    layout: Literal["packed", "padded"] = "packed"
    """How task batches are laid out: ``packed`` (each batch's sequences end to end with no padding, and a
    multiple-choice example's shared context run once for all its answers) or ``padded`` (the reference). Same
    predictions; an LSTM is always padded. (gptcli/model/packed.py)"""


def submission_name(task: Task) -> str:
    """GLUE's file name for the task (``SST-2.tsv``, ``MNLI-mm.tsv``), else ``<task>.tsv``."""
    return f"{getattr(task, 'glue_name', '') or task.name}.tsv"


def default_out_dir(checkpoint: Path, task: str, split: str) -> Path:
    """``RUN/eval/<task>-<split>`` for ``RUN/checkpoints/<name>``, else ``<checkpoint>-eval/<task>-<split>`` beside
    it (never inside a checkpoint directory, which is replaced whole when rewritten)."""
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent / "eval" / f"{task}-{split}"
    return checkpoint.parent / f"{checkpoint.name}-eval" / f"{task}-{split}"


def run_label(checkpoint: Path) -> str:
    """A short name for a checkpoint in tables: its run directory's name."""
    return checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.name


def model_label(meta: dict[str, Any]) -> str:
    """The pretrained model and ablation a fine-tuned checkpoint came from, e.g. ``pre`` / ``pre, λ=0`` /
    ``no pretraining`` / ``pre, 6 layers``: runs of different tasks from the same model share a table row."""
    init = str(meta.get("init", ""))
    if init == "none":
        name = "no pretraining"
    elif init:
        name = run_label(Path(init))
    else:
        name = "?"
    cfg = meta.get("finetune_config", {})
    parts = [name]
    if meta.get("transfer_layers") is not None:
        parts.append(f"{meta['transfer_layers']} layers")
    if cfg.get("lm_weight", 0.5) == 0:
        parts.append("no aux LM")
    elif cfg.get("lm_weight", 0.5) != 0.5:
        parts.append(f"λ={cfg['lm_weight']:g}")
    return ", ".join(parts)


def is_finetuned(path: str | Path) -> bool:
    """Whether ``path`` (a checkpoint or run directory) holds a fine-tuned checkpoint (reads only its header)."""
    return read_header(path).kind == "finetuned"


def trained_task(checkpoint: str | Path) -> str:
    """The task a fine-tuned checkpoint was trained on (from its header)."""
    header = read_header(checkpoint)
    if not header.meta.get("task"):
        raise GPT1Error(f"{header.path}: not a fine-tuned checkpoint; pass --task to say what to evaluate")
    return str(header.meta["task"])


def load_finetuned(
    checkpoint: str | Path, device: Any = "cpu", *, verify: bool = True
) -> tuple[Checkpoint, FinetuneModel, Any]:
    """(checkpoint, FinetuneModel on ``device`` in eval mode, tokenizer) of a fine-tuned checkpoint; ``verify``
    checks its files against their checksums first."""
    ck = load_checkpoint(checkpoint, verify=verify)
    if ck.kind != "finetuned" or "head" not in ck.meta:
        raise GPT1Error(
            f"{ck.path}: not a fine-tuned checkpoint (kind {ck.kind!r}); run `gpt1 finetune --task ...` first"
        )
    if ck.tokenizer is None:
        raise GPT1Error(f"{ck.path}: checkpoint has no tokenizer/")
    head = TaskHead(HeadConfig.from_dict(ck.meta["head"]))
    try:
        head.load_state_dict(ck.head_state)
    except RuntimeError as e:
        raise GPT1Error(f"{ck.path}: head weights do not match the head config ({str(e).splitlines()[0]})") from None
    model = move_model(FinetuneModel(ck.model, head), device).eval()
    return ck, apply_kernels(model, device), ck.tokenizer


def load_results(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Read ``results.json`` files (or the directories holding them), as written by fine-tuning or evaluation."""
    out = []
    for p in paths:
        p = Path(p)
        out.append(json.loads((p / RESULTS if p.is_dir() else p).read_text(encoding="utf-8")))
    return out


# --------------------------------------------------------------------------------------------- one task, one checkpoint


def evaluate_task(
    task_name: str | None,
    checkpoint: str | Path,
    split: str = "dev",
    *,
    data_dir: str | Path | None = None,
    out: str | Path | None = None,
    # The settings `gpt1 eval` shares have its defaults, written once: EvalConfig's fields.
    batch_size: int = EvalConfig.batch_size,
    device: str = EvalConfig.device,
    precision: str = EvalConfig.precision,
    skip_bad_rows: bool = EvalConfig.skip_bad_rows,
    max_examples: int | None = EvalConfig.max_examples,
    seed: int = EVAL_SUBSET_SEED,
    verify: bool = EvalConfig.verify,
    layout: str = EvalConfig.layout,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score ``checkpoint`` on ``split`` of a task (default: the task it was fine-tuned on); returns results.json
    plus ``out_dir`` (``precision`` there is the one the scoring ran in). The settings are the :class:`EvalConfig`
    fields of the same names, checked as every command checks them; ``progress`` sees one stage sized in examples.
    The output folder is locked while it is worked on. The model computes in the process's kernels mode
    (:func:`gptcli.model.kernels.mode`)."""
    check_settings({"batch_size": batch_size, "max_examples": max_examples, "seed": seed})
    if layout not in ("packed", "padded"):
        raise GPT1Error(f"--layout: expected packed or padded, got {layout!r}")
    with maybe_lock(out):  # a given folder before anything is read; the default one once the checkpoint says where
        return _evaluate_task(
            task_name,
            checkpoint,
            split,
            data_dir,
            out,
            batch_size,
            device,
            precision,
            skip_bad_rows,
            max_examples,
            seed,
            verify,
            layout,
            progress,
        )


def _evaluate_task(
    task_name: str | None,
    checkpoint: str | Path,
    split: str,
    data_dir: str | Path | None,
    out: str | Path | None,
    batch_size: int,
    device: str,
    precision: str,
    skip_bad_rows: bool,
    max_examples: int | None,
    seed: int,
    verify: bool,
    layout: str,
    progress: Progress | None,
) -> dict[str, Any]:
    report = progress or SILENT
    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    ck, model, tok = load_finetuned(checkpoint, dev, verify=verify)
    task = _scorable_task(task_name, ck)
    opts = ReadOptions(skip_bad_rows=skip_bad_rows, skippable=True)
    examples = subsample(task.read(split, data_dir, opts), max_examples, seed)
    _check_labels(task, split, examples)
    out_dir = Path(out) if out is not None else default_out_dir(ck.path, task.name, split)
    with output_lock(out_dir):
        check_out_dir(out_dir, ck.path, task, data_dir)
        n_ctx = int(ck.meta.get("n_ctx") or ck.config.n_ctx)
        enc = encode_examples(task, examples, tok, n_ctx)
        with staged(report, f"evaluate {run_label(ck.path)} on {task.name} ({split})", len(enc), unit="examples"):
            shared = tok.extract_id if layout == "packed" and isinstance(model.gpt, GPT) else None
            batches = iterate(
                enc, batch_size, shuffle=False, regression=task.kind == "regression", shared_extract=shared
            )
            preds, outs = predict(model, batches, dev, prec, progress=report)
        results = write_outputs(
            out_dir, ck, task, split, examples, preds, outs, skipped=opts.skipped, n_ctx=n_ctx, precision=prec
        )
    results["out_dir"] = str(out_dir)
    return results


def check_out_dir(out_dir: Path, checkpoint: Path, task: Task, data_dir: str | Path | None) -> None:
    """Refuse, before any scoring, an output folder that is not earlier evaluation results (a re-run replaces
    those whole) or that holds or lies inside what is evaluated: the checkpoint and the task's data."""
    inputs = [Path(checkpoint)]
    try:
        inputs.append(task.data_dir(data_dir))
    except GPT1Error:
        pass  # missing data is reported when it is read
    check_output(out_dir, "eval", overwrite=True, inputs=inputs)


def write_outputs(
    out_dir: Path,
    ck: Checkpoint,
    task: Task,
    split: str,
    examples: Sequence[Example],
    preds: Sequence[Any],
    outs: Sequence[list[float]],
    *,
    skipped: list[str],
    n_ctx: int,
    precision: str | None = None,
) -> dict[str, Any]:
    """predictions.jsonl, the submission file of an unlabeled split, and results.json (returned), written in a
    temporary folder that replaces ``out_dir`` whole once complete (earlier results survive a failed run).
    ``precision``: the one the predictions were computed in (recorded)."""
    labeled = all(e.label is not None for e in examples)
    submission = None if labeled else out_dir / submission_name(task)
    results = {
        "task": task.name,
        "title": task.title,
        "split": split,
        "labeled": labeled,
        "metric": task.metric,
        "paper_score": task.paper_score,
        "scores": score_predictions(task, preds, examples) if labeled else {},
        # What always answering the training split's most frequent label (or chance) scores here, and what the
        # model answered: a score is read against both (gptcli/eval/baselines.py).
        "baseline": trivial_level(task, examples, ck.meta.get("train_label_counts")) if labeled else None,
        **prediction_summary(task, preds),
        "n": len(examples),
        "checkpoint": str(ck.path),
        "run": run_label(ck.path),
        "model": model_label(ck.meta),
        "trained_on": ck.meta.get("task", ""),
        "predictions": str(out_dir / PREDICTIONS),
        "submission": str(submission) if submission else None,
        "skipped_rows": skipped,
        "n_ctx": n_ctx,
        "precision": precision,
    }

    def write(tmp: Path) -> None:
        mark(tmp, "eval")
        write_predictions(tmp / PREDICTIONS, task, examples, preds, outs, labeled)
        if submission is not None:
            write_submission(tmp / submission.name, task, examples, preds)
        write_text_atomic(tmp / RESULTS, json.dumps(results, indent=2))

    atomic_directory(out_dir, write)
    return results


def _scorable_task(task_name: str | None, ck: Checkpoint) -> Task:
    """The task to score (default: the one the checkpoint was fine-tuned on), if its head fits the checkpoint's."""
    trained_on = ck.meta.get("task", "")
    task = get_task(task_name or trained_on)
    if task.kind != ck.meta.get("kind") or list(task.labels) != list(ck.meta.get("labels", [])):
        raise GPT1Error(
            f"{ck.path}: fine-tuned on {trained_on!r} ({ck.meta.get('kind')}, labels {ck.meta.get('labels')}); "
            f"cannot score task {task.name!r} ({task.kind}, labels {list(task.labels)})"
        )
    return task


def _check_labels(task: Task, split: str, examples: Sequence[Example]) -> None:
    """A split is labeled or unlabeled (a GLUE test file) throughout; a mix, or no examples, is an error."""
    if not examples:
        raise GPT1Error(f"{task.name}: split {split!r} has no examples")
    n_unlabeled = sum(e.label is None for e in examples)
    if 0 < n_unlabeled < len(examples):
        raise GPT1Error(f"{task.name}: split {split!r} mixes labeled and unlabeled rows ({n_unlabeled} unlabeled)")


def _label_string(task: Task, pred: Any) -> str:
    if task.kind == "regression":
        return f"{float(pred):.3f}"
    return str(task.labels[pred]) if task.labels else str(pred)


def write_predictions(
    path: Path,
    task: Task,
    examples: Sequence[Example],
    preds: Sequence[Any],
    outs: Sequence[list[float]],
    labeled: bool,
) -> Path:
    """``predictions.jsonl``: index, uid, predicted label string (and index), gold label, head outputs."""
    lines = []
    for i, (ex, p, o) in enumerate(zip(examples, preds, outs)):
        rec: dict[str, Any] = {"index": i, "uid": ex.uid, "prediction": _label_string(task, p)}
        if task.kind != "regression":
            rec["pred_index"] = p
        if labeled:
            rec["label"] = _label_string(task, ex.label)
            if task.kind != "regression":
                rec["correct"] = p == ex.label
        rec["outputs"] = o
        lines.append(json.dumps(rec, ensure_ascii=False))
    return write_text_atomic(path, "".join(line + "\n" for line in lines))


def write_submission(path: Path, task: Task, examples: Sequence[Example], preds: Sequence[Any]) -> Path:
    """A GLUE submission file: ``index\\tprediction`` with the row ids and GLUE's label strings."""
    rows = ["index\tprediction"] + [f"{ex.uid}\t{_label_string(task, p)}" for ex, p in zip(examples, preds)]
    return write_text_atomic(path, "\n".join(rows) + "\n")


# --------------------------------------------------------------------------------------------- checkpoints × tasks


def parse_tasks(task: str | Sequence[str] | None) -> list[str | None]:
    """``"mnli,mnli-mm"`` or a list → task names; None or empty → ``[None]`` (each checkpoint's own task)."""
    if task is None:
        return [None]
    items = [task] if isinstance(task, str) else list(task)
    names: list[str | None] = [t.strip() for item in items for t in str(item).split(",") if t.strip()]
    return names or [None]


def evaluate_tasks(config: EvalConfig, progress: Progress | None = None) -> list[dict[str, Any]]:
    """What ``gpt1 eval`` computes, as configured by ``config``: one dict per result, each with ``run``, the
    checkpoint's label, unique in the list.

    Without ``data``: every checkpoint on every task's split (default: its own task, split ``dev``), as
    :func:`evaluate_task`'s results, written under ``OUT/<run>/<task>-<split>/`` with ``out``, else under
    ``RUN/eval/<task>-<split>/``. With ``data`` (a prepared corpus): each checkpoint's loss and perplexity on the
    corpus split (default ``val``) by :func:`gptcli.eval.perplexity.corpus_perplexity`; nothing is written.

    The model computes in ``config.kernels`` and the caller's kernels mode is back afterwards
    (:func:`gptcli.model.kernels.use_kernels`).
    """
    check_settings(config)  # one rule per number, the same in every command (gptcli.config.RULES)
    if not config.checkpoint:
        raise GPT1Error("no checkpoint to evaluate: give --checkpoint RUN_DIR (repeatable)")
    check_eval_mode(config)
    if config.data is not None:
        with use_kernels(config.kernels):
            return _corpus_perplexities(config, progress)
    if not config.task:
        untasked = [c for c in config.checkpoint if not is_finetuned(c)]
        if untasked:
            raise _nothing_to_evaluate(untasked, len(config.checkpoint))
    with maybe_lock(config.out), use_kernels(config.kernels):  # the lock before anything is read
        return _evaluate_tasks(config, progress)


def check_eval_mode(config: EvalConfig) -> None:
    """Refuse ``data`` (perplexity) and ``task`` (a task metric) together: one evaluation is one or the other."""
    if config.data is not None and config.task:
        raise GPT1Error("give either --data (perplexity) or --task (task metric), not both")


def _nothing_to_evaluate(untasked: Sequence[str | Path], given: int) -> GPT1Error:
    """No ``task`` and no ``data``: fine-tuned checkpoints know their task, these (language models) do not. Among
    fine-tuned ones, the error names them rather than saying there is nothing to evaluate."""
    if len(untasked) == given:
        return GPT1Error("nothing to evaluate: give --data CORPUS_DIR for perplexity, or --task T for a task metric")
    names = ", ".join(map(str, untasked))
    return GPT1Error(
        f"{names}: not fine-tuned, so no task of its own to score, unlike the fine-tuned checkpoints "
        f"given (give --task T to score every checkpoint on T, or evaluate {names} apart, with --data "
        "CORPUS_DIR for perplexity)"
    )


def _corpus_perplexities(config: EvalConfig, progress: Progress | None) -> list[dict[str, Any]]:
    """``data`` mode: :func:`corpus_perplexity` of every checkpoint, as dicts labelled like the task results."""
    assert config.data is not None
    split = config.split or "val"
    rows = corpus_perplexity(
        config.checkpoint,
        config.data,
        split,
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        device=config.device,
        precision=config.precision,
        max_batches=config.max_batches,
        verify=config.verify,
        progress=progress,
    )
    return [
        {
            "run": label,
            "checkpoint": str(row.checkpoint),
            "step": row.step,
            "data": str(config.data),
            "split": split,
            "loss": row.loss,
            "perplexity": row.perplexity,
            "tokens": row.tokens,
        }
        for row, (_, label) in zip(rows, _labelled_checkpoints([row.checkpoint for row in rows]))
    ]


def _evaluate_tasks(config: EvalConfig, progress: Progress | None) -> list[dict[str, Any]]:
    tasks = parse_tasks(config.task)
    if config.data_dir is not None and len(tasks) > 1:
        raise GPT1Error("--data-dir names one task's folder; with several tasks set GPT1_DATA instead")
    split = config.split or "dev"
    jobs = [
        (path, label, t or trained_task(path))
        for path, label in _labelled_checkpoints(config.checkpoint)
        for t in tasks
    ]
    targets = [
        Path(config.out) / label / f"{name}-{split}" if config.out is not None else None for _, label, name in jobs
    ]
    for (path, _, name), target in zip(jobs, targets):  # every output folder checked before any scoring
        check_out_dir(target or default_out_dir(path, name, split), path, get_task(name), config.data_dir)
    results = []
    for (path, label, name), target in zip(jobs, targets):
        r = evaluate_task(
            name,
            path,
            split,
            data_dir=config.data_dir,
            out=target,
            batch_size=config.batch_size,
            device=config.device,
            precision=config.precision,
            skip_bad_rows=config.skip_bad_rows,
            max_examples=config.max_examples,
            verify=config.verify,
            layout=config.layout,
            progress=progress,
        )
        r["run"] = label
        results.append(r)
    return results


def _labelled_checkpoints(checkpoints: Sequence[str | Path]) -> list[tuple[Path, str]]:
    """(checkpoint, label) pairs; two runs with the same directory name stay apart in tables and on disk."""
    seen: dict[str, int] = {}
    out = []
    for ck in checkpoints:
        path = resolve_checkpoint(ck)
        label = run_label(path)
        seen[label] = seen.get(label, 0) + 1
        out.append((path, label if seen[label] == 1 else f"{label}#{seen[label]}"))
    return out
