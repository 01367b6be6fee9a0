"""Evaluate a fine-tuned checkpoint on a task split: metrics, per-example predictions, GLUE submission files.

``evaluate_task("rte", "runs/rte", split="dev")`` loads ``RUN/checkpoints/final`` (body + head + tokenizer),
encodes the split with the same transformation and context the run was trained with, and writes to ``out``:

- ``results.json``: the task's metrics ×100 (the paper's headline metric first, e.g. ``f1`` then ``accuracy``
  for MRPC/QQP, ``pearson`` and ``spearman`` for STS-B; RACE adds ``accuracy_middle``/``accuracy_high`` when a
  split holds both levels), with the paper's number for comparison;
- ``predictions.jsonl``: one line per example (``uid``, predicted label string or score, gold label, head outputs);
- for an unlabeled split (GLUE test files), ``<GLUE name>.tsv`` with ``index\\tprediction`` and GLUE's label
  strings (``SST-2.tsv``, ``MNLI-m.tsv``, ``STS-B.tsv`` ...), ready for the GLUE server.

A checkpoint fine-tuned on one task may be scored on another of the same kind and labels (``mnli`` → ``mnli-mm``,
``race`` → ``race-m``/``race-h``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from gptcli.errors import GPT1Error

RESULTS = "results.json"
PREDICTIONS = "predictions.jsonl"


def score_predictions(task: Any, preds: Sequence[Any], examples: Sequence[Any]) -> dict[str, float]:
    """The task's metrics ×100 (headline first), plus per-level accuracy for RACE-style ``extra["level"]``."""
    from gptcli.eval.metrics import compute

    labels = [e.label for e in examples]
    names = list(dict.fromkeys((task.metric, *getattr(task, "extra_metrics", ()))))
    scores = {k: 100.0 * v for k, v in compute(names, list(preds), labels).items()}
    levels = sorted({e.extra.get("level") for e in examples if e.extra.get("level")})
    if len(levels) > 1:
        for lv in levels:
            idx = [i for i, e in enumerate(examples) if e.extra.get("level") == lv]
            sub = compute([task.metric], [preds[i] for i in idx], [labels[i] for i in idx])
            scores[f"{task.metric}_{lv}"] = 100.0 * sub[task.metric]
    return scores


def _label_string(task: Any, pred: Any) -> str:
    if task.kind == "regression":
        return f"{float(pred):.3f}"
    return str(task.labels[pred]) if task.labels else str(pred)


def submission_name(task: Any) -> str:
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


def load_finetuned(checkpoint: str | Path, device: Any = "cpu") -> tuple[Any, Any, Any]:
    """(checkpoint, FinetuneModel on ``device`` in eval mode, tokenizer) of a fine-tuned checkpoint."""
    from gptcli.checkpoint import load_checkpoint
    from gptcli.train.finetune import FinetuneModel
    from gptcli.model.heads import HeadConfig, TaskHead

    ck = load_checkpoint(checkpoint)
    if ck.kind != "finetuned" or "head" not in ck.meta:
        raise GPT1Error(f"{ck.path}: not a fine-tuned checkpoint (kind {ck.kind!r}); run `gpt1 finetune --task ...` first")
    if ck.tokenizer is None:
        raise GPT1Error(f"{ck.path}: checkpoint has no tokenizer/")
    head = TaskHead(HeadConfig.from_dict(ck.meta["head"]))
    try:
        head.load_state_dict(ck.head_state)
    except RuntimeError as e:
        raise GPT1Error(f"{ck.path}: head weights do not match the head config ({str(e).splitlines()[0]})") from None
    model = FinetuneModel(ck.model, head).to(device).eval()
    return ck, model, ck.tokenizer


def evaluate_task(
    task_name: str | None,
    checkpoint: str | Path,
    split: str = "dev",
    *,
    data_dir: str | Path | None = None,
    out: str | Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    precision: str = "auto",
    skip_bad_rows: bool = False,
    max_examples: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Score ``checkpoint`` on ``split`` of a task (default: the task it was fine-tuned on); returns results.json."""
    from gptcli.train.finetune import predict, subsample
    from gptcli.runtime import resolve_device, resolve_precision
    from gptcli.tasks import ReadOptions, get_task
    from gptcli.data.transforms import encode_examples

    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    ck, model, tok = load_finetuned(checkpoint, dev)
    trained_on = ck.meta.get("task", "")
    task = get_task(task_name or trained_on)
    if task.kind != ck.meta.get("kind") or list(task.labels) != list(ck.meta.get("labels", [])):
        raise GPT1Error(
            f"{ck.path}: fine-tuned on {trained_on!r} ({ck.meta.get('kind')}, labels {ck.meta.get('labels')}); "
            f"cannot score task {task.name!r} ({task.kind}, labels {list(task.labels)})"
        )
    opts = ReadOptions(skip_bad_rows=skip_bad_rows)
    examples = subsample(task.read(split, data_dir, opts), max_examples, seed)
    if not examples:
        raise GPT1Error(f"{task.name}: split {split!r} has no examples")
    n_unlabeled = sum(e.label is None for e in examples)
    if 0 < n_unlabeled < len(examples):
        raise GPT1Error(f"{task.name}: split {split!r} mixes labeled and unlabeled rows ({n_unlabeled} unlabeled)")
    labeled = n_unlabeled == 0
    n_ctx = int(ck.meta.get("n_ctx") or ck.config.n_ctx)
    enc = encode_examples(task, examples, tok, n_ctx)
    preds, outs = predict(model, enc, batch_size, dev, prec, task.kind == "regression")

    out_dir = Path(out) if out is not None else default_out_dir(ck.path, task.name, split)
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = score_predictions(task, preds, examples) if labeled else {}
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
    _atomic_write(out_dir / PREDICTIONS, "".join(line + "\n" for line in lines))
    submission = None
    if not labeled:
        submission = out_dir / submission_name(task)
        rows = ["index\tprediction"] + [f"{ex.uid}\t{_label_string(task, p)}" for ex, p in zip(examples, preds)]
        _atomic_write(submission, "\n".join(rows) + "\n")
    results = {
        "task": task.name,
        "title": task.title,
        "split": split,
        "labeled": labeled,
        "metric": task.metric,
        "paper_score": task.paper_score,
        "scores": scores,
        "n": len(examples),
        "checkpoint": str(ck.path),
        "run": run_label(ck.path),
        "model": model_label(ck.meta),
        "trained_on": trained_on,
        "predictions": str(out_dir / PREDICTIONS),
        "submission": str(submission) if submission else None,
        "skipped_rows": opts.skipped,
        "n_ctx": n_ctx,
    }
    _atomic_write(out_dir / RESULTS, json.dumps(results, indent=2))
    results["out_dir"] = str(out_dir)
    return results


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
