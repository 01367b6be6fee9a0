"""Everything the command line draws with Rich: the progress renderer and the result tables.

``RichProgress`` renders the library's one progress protocol (:mod:`gptcli.progress`) as nested Rich progress bars.
Result tables put the paper's numbers beside ours.

``results_table(results)`` takes the dicts ``evaluate_task`` returns (or ``results.json`` files, read with
``gptcli.eval.tasks.load_results``) for any number of runs and tasks and lays them out as the paper's Tables 2–4:
one column per task (headline metric ×100), a first row with GPT-1's published numbers, then one row per run. ``details_table`` lists every metric of every
result (F1 *and* accuracy, Pearson *and* Spearman, RACE per level) with the paper's headline beside it.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from gptcli.progress import Level, Progress

METRIC_SHORT = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


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


# --------------------------------------------------------------------------------------------------- progress


def _status_text(status: dict[str, Any]) -> str:
    """``loss 3.2145  lr 2.500e-04  docs 1,204``: numbers formatted by kind, strings as the library gave them."""
    parts = []
    for key, v in status.items():
        if v is None:
            continue
        if isinstance(v, bool) or isinstance(v, str):
            s = str(v)
        elif isinstance(v, int):
            s = f"{v:,}"
        elif isinstance(v, float):
            s = f"{v:.3e}" if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e6) else f"{v:.4f}"
        else:
            s = str(v)
        parts.append(f"[bold]{key}[/] {s}")
    return "  ".join(parts)


class RichProgress(Progress):
    """Nested stages as Rich progress: a stage with a size is a bar, one without is a heading.

    On a terminal the bars update in place; elsewhere (a log file, CI) each stage start, end and note is one
    plain line, and live status at most one line every ``log_interval`` seconds, so logs stay readable.
    """

    def __init__(self, console: Any, log_interval: float = 10.0) -> None:
        self.console = console
        self.log_interval = log_interval
        self._bars: Any = None  # rich.progress.Progress, created on the first sized stage
        self._stack: list[dict[str, Any]] = []
        self._last_line = 0.0

    # -- the protocol
    def stage(self, name: str, total: float | None = None, *, unit: str = "", done: float = 0) -> None:
        entry = {"name": name, "total": total, "unit": unit, "t0": time.perf_counter(), "task": None,
                 "completed": done}
        if total is not None and self.console.is_terminal:
            bars = self._ensure_bars()
            entry["task"] = bars.add_task(name, total=total, completed=done, status="", unit=unit)
        elif total is None:
            self._print_heading(name, depth=len(self._stack))
        else:
            self._plain(f"{name}: {_of(done, total, unit, ' of ')}")
        self._stack.append(entry)

    def advance(self, n: float = 0, **status: Any) -> None:
        if not self._stack:
            return
        top = self._stack[-1]
        top["completed"] += n
        text = _status_text(status)
        if top["task"] is not None:
            self._bars.update(top["task"], advance=n, **({"status": text} if status else {}))
        elif status and time.perf_counter() - self._last_line >= self.log_interval:
            where = _of(top["completed"], top["total"], top["unit"]) if top["total"] else ""
            self._plain(f"{top['name']} {where}  {text}".replace("[bold]", "").replace("[/]", ""))

    def note(self, message: str, *, level: Level = "info") -> None:
        if level == "warn":
            self.console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
        else:
            self.console.print(message, highlight=False, soft_wrap=True, markup=False)

    def end(self, summary: str = "") -> None:
        if not self._stack:
            return
        top = self._stack.pop()
        seconds = time.perf_counter() - top["t0"]
        if top["task"] is not None:
            self._bars.stop_task(top["task"])
            if not any(e["task"] is not None for e in self._stack):
                self._bars.stop()
                self._bars = None
        if summary:
            self.console.print(f"[green]✓[/] {summary} [dim]({seconds:.1f} s)[/]", highlight=False)

    # -- helpers
    def _ensure_bars(self) -> Any:
        if self._bars is None:
            from rich.progress import BarColumn, Progress as Bars, TextColumn, TimeElapsedColumn
            from rich.progress import TimeRemainingColumn

            self._bars = Bars(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), _AmountColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                console=self.console, transient=False,
            )
            self._bars.start()
        return self._bars

    def _print_heading(self, name: str, depth: int) -> None:
        if depth == 0:
            self.console.print()
            self.console.rule(f"[bold]{name}", align="left")
        else:
            self.console.print(f"[bold cyan]{name}[/]", highlight=False)

    def _plain(self, line: str) -> None:
        self._last_line = time.perf_counter()
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def _amount(x: float | None, unit: str) -> str:
    if x is None:
        return "?"
    if unit == "B":
        return f"{x / 1e6:,.1f} MB"
    return f"{int(x):,}" + (f" {unit}" if unit else "")


def _of(done: float, total: float | None, unit: str, sep: str = "/") -> str:
    """``1.0 MB/2.0 MB`` for bytes, ``40/100 updates`` for counts (the unit said once)."""
    if unit == "B":
        return f"{_amount(done, unit)}{sep}{_amount(total, unit)}"
    return f"{_amount(done, '')}{sep}{_amount(total, unit)}"


def _make_amount_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class AmountColumn(ProgressColumn):
        """``12.3 MB/40.0 MB`` for bytes, ``120/1,000 updates`` otherwise."""

        def render(self, task: Any) -> Text:
            return Text(_of(task.completed, task.total, task.fields.get("unit", "")))

    return AmountColumn


def _AmountColumn() -> Any:  # noqa: N802 - a column factory that reads like the class it builds
    return _make_amount_column()()


def stderr_console() -> Any:
    """The console progress, notes and warnings go to (stdout stays for results a user may pipe)."""
    from rich.console import Console

    return Console(stderr=True)


def stdout_console() -> Any:
    """The console results go to."""
    from rich.console import Console

    return Console()
