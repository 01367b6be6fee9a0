"""The paper's task metrics, in plain numpy: accuracy, F1, Matthews correlation, Pearson, Spearman.

All return a float in natural units (accuracy in [0, 1], correlations in [-1, 1]); the paper's tables show
them x100. Degenerate inputs follow scikit-learn's conventions where it has one and otherwise return 0.0
rather than nan, so ``results.json`` stays valid JSON: F1 with no true and no predicted positives is 0 (as
sklearn's default), MCC with a zero denominator (one class only) is 0 (as sklearn), and Pearson/Spearman with a
constant input is 0 (scipy returns nan: no linear relation can be measured).

:func:`score_predictions` applies a task's metrics to its predictions (×100, as the tables show them); fine-tuning
(dev score per epoch) and ``gpt1 eval`` both score through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from gptcli.tasks.base import Example, Task

ArrayLike = Sequence[float] | np.ndarray


def _pair(preds: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(preds), np.asarray(labels)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"predictions {p.shape} and labels {y.shape} must be 1-D and of equal length")
    if p.size == 0:
        raise ValueError("no examples to score")
    return p, y


def accuracy(preds: ArrayLike, labels: ArrayLike) -> float:
    p, y = _pair(preds, labels)
    return float(np.mean(p == y))


def f1(preds: ArrayLike, labels: ArrayLike, positive: int = 1) -> float:
    """Binary F1 of class ``positive`` (MRPC: paraphrase, QQP: duplicate)."""
    p, y = _pair(preds, labels)
    tp = float(np.sum((p == positive) & (y == positive)))
    fp = float(np.sum((p == positive) & (y != positive)))
    fn = float(np.sum((p != positive) & (y == positive)))
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom else 0.0


def mcc(preds: ArrayLike, labels: ArrayLike) -> float:
    """Matthews correlation coefficient (multi-class form, as scikit-learn; binary for CoLA)."""
    p, y = _pair(preds, labels)
    classes, inv = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = len(classes)
    yi, pi = inv[: len(y)], inv[len(y) :]
    c = np.zeros((k, k), dtype=np.float64)
    np.add.at(c, (yi, pi), 1.0)
    t_k, p_k = c.sum(axis=1), c.sum(axis=0)
    n, correct = c.sum(), np.trace(c)
    cov_ytyp = correct * n - np.dot(t_k, p_k)
    cov_ypyp = n * n - np.dot(p_k, p_k)
    cov_ytyt = n * n - np.dot(t_k, t_k)
    denom = cov_ytyt * cov_ypyp
    return float(cov_ytyp / np.sqrt(denom)) if denom > 0 else 0.0


def pearson(preds: ArrayLike, labels: ArrayLike) -> float:
    p, y = _pair(preds, labels)
    p, y = p.astype(np.float64), y.astype(np.float64)
    dp, dy = p - p.mean(), y - y.mean()
    denom = np.sqrt(np.dot(dp, dp) * np.dot(dy, dy))
    if denom == 0:
        return 0.0
    return float(np.clip(np.dot(dp, dy) / denom, -1.0, 1.0))


def rank_average(x: ArrayLike) -> np.ndarray:
    """1-based ranks with ties given their average rank (``scipy.stats.rankdata`` 'average')."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    # Boundaries of runs of equal values in sorted order; each run gets the mean of its positions.
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    ends = np.concatenate([starts[1:], [len(s)]])
    avg = (starts + ends + 1) / 2.0  # mean of 1-based positions starts+1 .. ends
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(preds: ArrayLike, labels: ArrayLike) -> float:
    p, y = _pair(preds, labels)
    return pearson(rank_average(p), rank_average(y))


METRICS: dict[str, Callable[[ArrayLike, ArrayLike], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "mcc": mcc,
    "pearson": pearson,
    "spearman": spearman,
}
"""Metric functions by the names used in ``Task.metric`` / ``Task.extra_metrics``."""


def compute(names: Sequence[str], preds: ArrayLike, labels: ArrayLike) -> dict[str, float]:
    """``{name: value}`` for each metric name (unknown names raise ``KeyError`` listing the known ones)."""
    out = {}
    for name in names:
        if name not in METRICS:
            raise KeyError(f"unknown metric {name!r} (known: {', '.join(METRICS)})")
        out[name] = METRICS[name](preds, labels)
    return out


def score_predictions(task: Task, preds: Sequence[Any], examples: Sequence[Example]) -> dict[str, float]:
    """The task's metrics ×100 (headline first), plus per-level accuracy for RACE-style ``extra["level"]``."""
    # Only labeled examples are scored, so every label is a number here.
    labels = cast(list[float], [e.label for e in examples])
    names = list(dict.fromkeys((task.metric, *getattr(task, "extra_metrics", ()))))
    scores = {k: 100.0 * v for k, v in compute(names, list(preds), labels).items()}
    levels = sorted({lv for e in examples if (lv := e.extra.get("level"))})
    if len(levels) > 1:
        for lv in levels:
            idx = [i for i, e in enumerate(examples) if e.extra.get("level") == lv]
            sub = compute([task.metric], [preds[i] for i in idx], [labels[i] for i in idx])
            scores[f"{task.metric}_{lv}"] = 100.0 * sub[task.metric]
    return scores
