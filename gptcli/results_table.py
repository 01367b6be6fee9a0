"""Rich tables of task results with the paper's numbers beside ours.

``results_table(results)`` takes the dicts ``evaluate_task`` returns (or ``results.json`` files) for any number
of runs and tasks and lays them out as the paper's Tables 2–4: one column per task (headline metric ×100), a
first row with GPT-1's published numbers, then one row per run. ``details_table`` lists every metric of every
result (F1 *and* accuracy, Pearson *and* Spearman, RACE per level) with the paper's headline beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

METRIC_SHORT = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


def load_results(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Read ``results.json`` files (or the directories holding them)."""
    out = []
    for p in paths:
        p = Path(p)
        out.append(json.loads((p / "results.json" if p.is_dir() else p).read_text(encoding="utf-8")))
    return out


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{float(v):.1f}"


def _column_key(r: dict[str, Any]) -> tuple[str, str]:
    return r["task"], r.get("split", "dev")


def _column_title(r: dict[str, Any]) -> str:
    split = r.get("split", "dev")
    name = r.get("title", r["task"]).split(" (")[0]
    return f"{name}\n{METRIC_SHORT.get(r['metric'], r['metric'])}" + ("" if split == "dev" else f"\n({split})")


def results_table(results: Sequence[dict[str, Any]], title: str | None = None) -> Any:
    """Runs × tasks, headline metric ×100; the first row is GPT-1's published score (reference §6).

    The paper's numbers are test-set scores; ours are on the split named under each column (usually dev), so
    compare with that in mind.
    """
    from rich.table import Table

    columns: dict[tuple[str, str], dict[str, Any]] = {}
    runs: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for r in results:
        if not r.get("scores"):
            continue  # an unlabeled split (a submission file): nothing to compare
        col = _column_key(r)
        columns.setdefault(col, r)
        # Rows are pretrained models (+ ablation): the MNLI run and the RTE run of one model share a row. Two
        # results for the same model and column (e.g. two seeds) fall back to their run names.
        row = r.get("model") or r.get("run") or r.get("checkpoint", "?")
        if col in runs.get(row, {}):
            row = r.get("run") or r.get("checkpoint", "?")
        runs.setdefault(row, {})[col] = r
    table = Table(title=title or "Task results (×100)", show_lines=False)
    table.add_column("model", style="bold")
    for r in columns.values():
        table.add_column(_column_title(r), justify="right")
    table.add_row("GPT-1 (paper)", *[_fmt(r.get("paper_score")) for r in columns.values()], style="dim")
    for name, by_col in runs.items():
        cells = []
        for key, col in columns.items():
            r = by_col.get(key)
            cells.append("–" if r is None or not r.get("scores") else _fmt(r["scores"].get(col["metric"])))
        table.add_row(name, *cells)
    return table


def details_table(results: Sequence[dict[str, Any]], title: str | None = None) -> Any:
    """One row per (run, task, metric) with every metric reported, the paper's headline and the difference."""
    from rich.table import Table

    table = Table(title=title or "Task metrics (×100)")
    for name, just in (("run", "left"), ("task", "left"), ("split", "left"), ("metric", "left"), ("ours", "right"),
                       ("paper", "right"), ("Δ", "right"), ("n", "right")):
        table.add_column(name, justify=just)
    for r in results:
        scores = r.get("scores") or {}
        if not scores:
            what = "unlabeled: submission file" if r.get("submission") else "unlabeled"
            table.add_row(r.get("run", ""), r["task"], r.get("split", ""), what, "–", _fmt(r.get("paper_score")),
                          "", str(r.get("n", "")))
            continue
        for i, (metric, value) in enumerate(scores.items()):
            headline = metric == r["metric"]
            paper = r.get("paper_score") if headline else None
            delta = "" if paper is None else f"{value - paper:+.1f}"
            table.add_row(r.get("run", "") if i == 0 else "", r["task"] if i == 0 else "", r.get("split", "") if i == 0 else "",
                          metric + (" *" if headline else ""), _fmt(value), _fmt(paper) if headline else "", delta,
                          str(r.get("n", "")) if i == 0 else "")
    return table
