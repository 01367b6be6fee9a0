"""What a trivial predictor scores: the level every task result is read against.

A score means little without the score of answering without looking (on MRPC, always answering "paraphrase"
comes close to the paper's F1; docs/eval.md). This module computes those levels from the data, once, for every
place that shows a result: ``results.json`` of ``gpt1 eval`` and ``gpt1 finetune``, the per-epoch line, the tables.

- **majority**: always the most frequent *training* label (ties: the first listed), scored with the task's
  metrics on the evaluated split; for multiple choice, the most frequent right position. Without the training
  labels, the evaluated split's own (``source = "eval"``, an upper bound; tables mark it).
- **chance**: multiple choice only, 1/number of answers. A table compares against the higher of the two.
- STS-B (regression) has none: a constant prediction has no correlation.

:func:`verdict` reads a score within :data:`MARGIN` of its level as "≈ majority", below that as "< majority";
:func:`prediction_summary` counts the predicted labels so a run that always answers one label can say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gptcli.eval.metrics import score_predictions
from gptcli.tasks.base import Example, Task

MARGIN = 1.0
"""Points (on the tables' ×100 scale) within which a score counts as the trivial level. One point is 3 examples of
RTE's 277 dev pairs and 9 of SST-2's 872: a difference that small says nothing about the model. It is a reading aid,
not a significance test (on RTE dev one binomial standard error is about 3 points)."""

CONSTANT_TOLERANCE = 1e-6
"""Regression predictions whose range is at most this are one constant score."""


def label_counts(task: Task, examples: Sequence[Example]) -> dict[str, int] | None:
    """Count per label string of the labeled ``examples``, every label of the task listed (zeros too) in the
    task's order; None for regression (no classes) or when no example is labeled."""
    if task.kind == "regression":
        return None
    labels = [int(e.label) for e in examples if e.label is not None]
    if not labels:
        return None
    n = np.bincount(np.asarray(labels), minlength=len(task.labels))
    return {task.labels[i]: int(n[i]) for i in range(len(task.labels))}


def prediction_summary(task: Task, preds: Sequence[Any]) -> dict[str, Any]:
    """The prediction distribution: ``prediction_counts`` (count per predicted label, zeros included) or for
    regression ``prediction_stats`` (mean, std, min, max), and ``constant_prediction``: the label (or score) every
    prediction is, when two or more are all one, else None."""
    if task.kind == "regression":
        p = np.asarray(preds, dtype=np.float64)
        if p.size == 0:
            return {"prediction_stats": None, "constant_prediction": None}
        stats = {"mean": float(p.mean()), "std": float(p.std()), "min": float(p.min()), "max": float(p.max())}
        one = stats["max"] - stats["min"] <= CONSTANT_TOLERANCE and p.size > 1
        constant = f"{stats['mean']:.3f}" if one else None
        return {"prediction_stats": stats, "constant_prediction": constant}
    n = np.bincount(np.asarray(preds, dtype=np.int64), minlength=len(task.labels))
    counts = {task.labels[i]: int(n[i]) for i in range(len(task.labels))}
    used = [label for label, c in counts.items() if c]
    one = len(used) == 1 and len(preds) > 1  # a single prediction is one label trivially: nothing to say
    return {"prediction_counts": counts, "constant_prediction": used[0] if one else None}


def trivial_level(
    task: Task, examples: Sequence[Example], train_counts: dict[str, int] | None = None
) -> dict[str, Any] | None:
    """The trivial predictors' scores on the labeled ``examples`` (×100, keys as :func:`score_predictions`).

    ``train_counts`` (from :func:`label_counts` of the training examples) picks the majority label; without it the
    evaluated examples' own labels do (``source = "eval"``). None for an unlabeled split (nothing to score).
    """
    if not examples or any(e.label is None for e in examples):
        return None
    chance = 100.0 / task.n_choices if task.kind == "multiple_choice" and task.n_choices else None
    base: dict[str, Any] = {
        "source": "train",
        "label_counts": train_counts,
        "majority_label": None,
        "majority": None,
        "chance": chance,
        "margin": MARGIN,
    }
    if task.kind == "regression":
        return {**base, "source": None, "label_counts": None}  # a constant has no correlation: n/a
    if not train_counts or list(train_counts) != list(task.labels) or not any(train_counts.values()):
        base.update(source="eval", label_counts=label_counts(task, examples))
    counts = base["label_counts"]
    top = max(range(len(task.labels)), key=lambda i: (counts[task.labels[i]], -i))  # ties: the first label
    base["majority_label"] = task.labels[top]
    base["majority"] = score_predictions(task, [top] * len(examples), examples)
    return base


def baseline_of(task: Task, train: Sequence[Example], evaluated: Sequence[Example]) -> dict[str, Any] | None:
    """:func:`trivial_level` on ``evaluated`` with the majority label of the ``train`` examples (fine-tuning's own
    training set, subsampled or not: the labels the model saw)."""
    return trivial_level(task, evaluated, label_counts(task, train))


def level(baseline: dict[str, Any] | None, key: str) -> tuple[str, float | None]:
    """(``"majority"`` or ``"chance"``, value) that score ``key`` is read against: the higher of the two where both
    exist (chance applies to multiple-choice accuracies); value None = no level ("n/a": STS-B, or no baseline)."""
    if not baseline:
        return "majority", None
    found = []
    if baseline.get("chance") is not None and key.startswith("accuracy"):
        found.append(("chance", float(baseline["chance"])))
    value = (baseline.get("majority") or {}).get(key)
    if value is not None:
        found.append(("majority", float(value)))
    if not found:
        return "majority", None
    return max(found, key=lambda f: f[1])  # equal: chance, listed first


def verdict(score: float | None, baseline: dict[str, Any] | None, key: str) -> str:
    """``"≈ majority"`` when ``score`` is within the margin of its level, ``"< majority"`` when further below it
    (``chance`` likewise), ``""`` when above it or when there is no level."""
    name, value = level(baseline, key)
    if score is None or value is None:
        return ""
    margin = float((baseline or {}).get("margin", MARGIN))
    if abs(score - value) <= margin:
        return f"≈ {name}"
    return f"< {name}" if score < value else ""


def level_note(scores: dict[str, float], baseline: dict[str, Any] | None, metric: str) -> str:
    """``majority 52.71`` / ``≈ majority 81.22`` / ``< majority 52.71`` / ``chance 25.00`` / ``majority n/a``: the
    headline's level, marked, for one-line reports (the per-epoch line of fine-tuning)."""
    if baseline is None:
        return ""
    name, value = level(baseline, metric)
    if value is None:
        return f"{name} n/a"
    mark = verdict(scores.get(metric), baseline, metric)
    return f"{mark or name} {value:.2f}"


def constant_sentence(result: dict[str, Any]) -> str | None:
    """``all 408 predictions are "1"``, when a result's predictions are one label (or one score); else None."""
    label = result.get("constant_prediction")
    if label is None:
        return None
    n = result.get("n") or sum((result.get("prediction_counts") or {}).values())
    return f'all {n:,} predictions are "{label}": a constant predictor, whatever its scores look like'
