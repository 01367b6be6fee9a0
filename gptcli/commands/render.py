"""Everything the command line draws with Rich: the progress renderer and the result tables.

``RichProgress`` renders the library's one progress protocol (:mod:`gptcli.progress`) as nested Rich progress bars.
Result tables put the paper's numbers beside ours.

``results_table(results)`` takes the dicts ``evaluate_task`` returns (or ``results.json`` files, read with
``gptcli.eval.tasks.load_results``) for any number of runs and tasks and lays them out as the paper's Tables 2–4:
one column per task (headline metric ×100), a first row with GPT-1's published numbers, a second with what a trivial
predictor scores there (majority class / chance, :mod:`gptcli.eval.baselines`), then one row per run. ``details_table``
lists every metric of every result (F1 *and* accuracy, Pearson *and* Spearman, RACE per level) with that level and
the paper's headline beside it. Both mark a score no better than the trivial level ("≈ majority") and say in words
when a run's predictions are all one label: every command that shows results draws them through these two.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from typing import Any, cast

from rich.console import Console, Group, JustifyMethod
from rich.markup import escape as escape_markup
from rich.progress import (
    BarColumn,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import (
    Progress as Bars,
)
from rich.progress import (
    Task as BarTask,
)
from rich.table import Table
from rich.text import Text

from gptcli.eval.baselines import MARGIN, constant_sentence, level, verdict
from gptcli.files.fsutil import printable
from gptcli.progress import Level, Progress


def escape(text: str) -> str:
    """``text`` to print inside Rich markup: its brackets escaped, and its control characters too (a newline in a
    path must not print as a forged line of its own)."""
    return escape_markup(printable(text))


METRIC_SHORT = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{float(v):.1f}"


def _column_key(r: dict[str, Any]) -> tuple[str, str]:
    return r["task"], r.get("split", "dev")


def _column_title(r: dict[str, Any]) -> str:
    split = r.get("split", "dev")
    name = r.get("title", r["task"]).split(" (")[0]
    return f"{name}\n{METRIC_SHORT.get(r['metric'], r['metric'])}" + ("" if split == "dev" else f"\n({split})")


def _level_name(results: Sequence[dict[str, Any]], headline_only: bool = False) -> str:
    """``majority``, ``chance`` or ``majority / chance``: which trivial levels these results are read against (for
    every score shown, or only the headline metric's)."""
    names = {
        level(r["baseline"], k)[0]
        for r in results
        if r.get("baseline")
        for k in ([r["metric"]] if headline_only else r.get("scores") or {})
    }
    return " / ".join(n for n in ("majority", "chance") if n in names) or "majority"


def _level_cell(r: dict[str, Any], key: str, mixed: bool) -> str:
    """``52.7`` (``52.7 chance`` beside majority levels), ``n/a`` (no level: STS-B), ``50.9†`` (majority of the
    evaluated labels: the checkpoint recorded no training labels), ``–`` (unlabeled: nothing to score)."""
    base = r.get("baseline")
    if not base:
        return "–"
    name, value = level(base, key)
    if value is None:
        return "n/a"
    return (
        _fmt(value) + (" chance" if mixed and name == "chance" else "") + ("†" if base.get("source") == "eval" else "")
    )


def _ours_cell(r: dict[str, Any], key: str) -> str:
    """Our score, followed by ``≈ majority`` / ``< majority`` (or chance) when it is no better than that level."""
    value = (r.get("scores") or {}).get(key)
    mark = verdict(value, r.get("baseline"), key)
    return _fmt(value) + (f" {mark}" if mark else "")


def _legend(results: Sequence[dict[str, Any]]) -> list[str]:
    """What the level cells and marks of these results mean (only the kinds they show)."""
    bases = [(r["baseline"], k) for r in results if r.get("baseline") for k in r.get("scores") or {}]
    if not bases:
        return []
    names = {level(b, k)[0] if level(b, k)[1] is not None else "n/a" for b, k in bases}
    legend = ["majority: always answering the most frequent training label, scored on the same examples"]
    if "chance" in names:
        legend.append("chance: one of the answers at random")
    legend.append(f"≈ / <: ours within {MARGIN:g} point of that level / further below it")
    if "n/a" in names:
        legend.append("n/a: a constant prediction has no correlation")
    lines = ["; ".join(legend) + "."]
    if any(b.get("source") == "eval" for b, _ in bases):
        lines.append("†: majority of the evaluated split's own labels (the checkpoint records no training labels).")
    return lines


def _constant_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per result whose predictions are all one label (or one score)."""
    lines = []
    for r in results:
        said = constant_sentence(r)
        if said:
            lines.append(f"{r.get('run', '')} · {r['task']} ({r.get('split', '')}): {said}.".lstrip(" ·"))
    return lines


def _with_notes(table: Table, results: Sequence[dict[str, Any]], notes: bool) -> Table | Group:
    """The table with the notes every results table ends with under it: the legend of the majority / chance level
    and its marks (dim), then one sentence per result whose predictions are all one label (yellow), at the
    console's width rather than the table's."""
    legend, constant = (_legend(results), _constant_lines(results)) if notes else ([], [])
    if not legend and not constant:
        return table

    text = Text("\n".join(legend), style="dim")
    if constant:
        text.append(("\n" if legend else "") + "\n".join(constant), style="yellow")
    return Group(table, text)


def results_table(results: Sequence[dict[str, Any]], title: str | None = None, *, notes: bool = True) -> Table | Group:
    """Runs × tasks, headline metric ×100; the first row is GPT-1's published score (reference §6), the second what
    a trivial predictor scores on the same split (majority class of the training labels, or chance); a score no
    better than that is marked, and (``notes``) the legend and the runs whose predictions are all one label are said
    in words under the table (:func:`_with_notes`).

    The paper's numbers are test-set scores; ours are on the split named under each column (usually dev), so
    compare with that in mind.
    """
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
    shown = [r for by_col in runs.values() for r in by_col.values()]
    name = _level_name(shown, headline_only=True)
    levels = []
    for key, column in columns.items():  # results of one column may differ in level (other subsets): all are shown
        cells = [_level_cell(by_col[key], column["metric"], "/" in name) for by_col in runs.values() if key in by_col]
        levels.append(" / ".join(dict.fromkeys(cells)))
    table.add_row(name, *levels, style="dim")
    for row, by_col in runs.items():
        cells = []
        for key, column in columns.items():
            result = by_col.get(key)
            cells.append("–" if result is None or not result.get("scores") else _ours_cell(result, column["metric"]))
        table.add_row(escape(row), *cells)
    return _with_notes(table, results, notes)


def details_table(results: Sequence[dict[str, Any]], title: str | None = None, *, notes: bool = True) -> Table | Group:
    """One row per (run, task, metric) with every metric reported, ours marked when no better than a trivial
    predictor, that level beside it (column ``majority``, ``chance`` or both), the paper's headline and the
    difference; ``notes``: the same notes under it as :func:`results_table` (off where a results table above already
    says them)."""
    table = Table(title=title or "Task metrics (×100)")
    level_name = _level_name(results)
    layout: tuple[tuple[str, JustifyMethod], ...] = (
        ("run", "left"),
        ("task", "left"),
        ("split", "left"),
        ("metric", "left"),
        ("ours", "right"),
        (level_name, "right"),
        ("paper", "right"),
        ("Δ", "right"),
        ("n", "right"),
    )
    for name, just in layout:
        table.add_column(name, justify=just)
    for r in results:
        scores = r.get("scores") or {}
        if not scores:
            what = "unlabeled: submission file" if r.get("submission") else "unlabeled"
            table.add_row(
                escape(r.get("run", "")),
                r["task"],
                r.get("split", ""),
                what,
                "–",
                "–",
                _fmt(r.get("paper_score")),
                "",
                str(r.get("n", "")),
            )
            continue
        for i, (metric, value) in enumerate(scores.items()):
            headline = metric == r["metric"]
            paper = r.get("paper_score") if headline else None
            delta = "" if paper is None else f"{value - paper:+.1f}"
            first = i == 0
            table.add_row(
                escape(r.get("run", "")) if first else "",
                r["task"] if first else "",
                r.get("split", "") if first else "",
                metric + (" *" if headline else ""),
                _ours_cell(r, metric),
                _level_cell(r, metric, "/" in level_name),
                _fmt(paper) if headline else "",
                delta,
                str(r.get("n", "")) if first else "",
            )
    return _with_notes(table, results, notes)


# --------------------------------------------------------------------------------------------------- progress


class WarningsOnly(Progress):
    """What --quiet renders: no display, but a warning (a damaged checkpoint skipped on resume) is still printed."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def note(self, message: str, *, level: str = "info") -> None:
        if level == "warn":
            self.console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _status_text(status: dict[str, Any]) -> str:
    """``loss 3.2145  lr 2.500e-04  docs 1,204``: numbers formatted by kind, strings as the library gave them."""
    parts = []
    for key, v in status.items():
        if v is None:
            continue
        if isinstance(v, bool) or isinstance(v, str):
            s = escape(str(v))
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

    def __init__(self, console: Console, log_interval: float = 10.0) -> None:
        self.console = console
        self.log_interval = log_interval
        self._bars: Any = None  # rich.progress.Progress, created on the first sized stage
        self._stack: list[dict[str, Any]] = []
        self._last_line = 0.0

    # -- the protocol
    def stage(self, name: str, total: float | None = None, *, unit: str = "", done: float = 0) -> None:
        entry = {"name": name, "total": total, "unit": unit, "t0": time.perf_counter(), "task": None, "completed": done}
        if total is not None and self.console.is_terminal:
            bars = self._ensure_bars()
            # rich counts in floats (update() takes one); add_task's annotation alone says int
            completed = cast(int, done)
            entry["task"] = bars.add_task(escape(name), total=total, completed=completed, status="", unit=unit)
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
        if top["task"] is not None:
            # The bar has its own time-remaining column: the library's ETA field would show a second, different one.
            text = _status_text({k: v for k, v in status.items() if k != "ETA"})
            self._bars.update(top["task"], advance=n, **({"status": text} if status else {}))
            return
        text = _status_text(status)
        if status and time.perf_counter() - self._last_line >= self.log_interval:
            where = _of(top["completed"], top["total"], top["unit"]) if top["total"] else ""
            self._plain(f"{top['name']} {where}  {text}".replace("[bold]", "").replace("[/]", ""))

    def note(self, message: str, *, level: Level = "info") -> None:
        if level == "warn":
            self.console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)
        else:
            self.console.print(printable(message), highlight=False, soft_wrap=True, markup=False)

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
            self.console.print(f"[green]✓[/] {escape(summary)} [dim]({seconds:.1f} s)[/]", highlight=False)
        elif top["task"] is None and top["total"] is not None:
            # In a log a sized stage ends on a line of its own: without it the stage's last words were its start's
            # "0 of 64 examples" (the first GPU run's eval and zeroshot logs read so).
            self._plain(f"{top['name']}: {_of(top['completed'], top['total'], top['unit'], ' of ')} ({seconds:.1f} s)")

    # -- helpers
    def _ensure_bars(self) -> Bars:
        if self._bars is None:
            self._bars = Bars(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=20),
                _AmountColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                console=self.console,
                transient=False,
            )
            self._bars.start()
        return self._bars

    def _print_heading(self, name: str, depth: int) -> None:
        if depth == 0:
            self.console.print()
            self.console.rule(f"[bold]{name}", align="left")
        else:
            self.console.print(f"[bold cyan]{escape(name)}[/]", highlight=False)

    def _plain(self, line: str) -> None:
        self._last_line = time.perf_counter()
        self.console.print(printable(line), highlight=False, markup=False, soft_wrap=True)


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


class _AmountColumn(ProgressColumn):
    """``12.3 MB/40.0 MB`` for bytes, ``120/1,000 updates`` otherwise."""

    def render(self, task: BarTask) -> Text:
        return Text(_of(task.completed, task.total, task.fields.get("unit", "")))


def make_console(stderr: bool = False) -> Console:
    """Every console gpt1 prints through: no emoji codes (``train.tsv:100:`` must not print as ``train.tsv💯``,
    nor a folder ``exp:warning:`` as ``exp⚠``), and, when not a terminal (piped to a file or a pager), lines
    that are not cut: a path in a log stays whole on its line. Messages built from user text (paths, file lines)
    go in escaped (:func:`rich.markup.escape`) or with ``markup=False``, so ``[draft] (v2)`` prints as is."""
    console = Console(stderr=stderr, emoji=False)
    if not console.is_terminal:
        console.soft_wrap = True
    return console


def stderr_console() -> Console:
    """The console progress, notes and warnings go to (stdout stays for results a user may pipe)."""
    return make_console(stderr=True)


def held_console() -> Console:
    """A console that keeps what is printed to it (as plain text) until :func:`release_held`: the notes of defaults
    a command chose before its settings are checked, said once they are valid, so a failing command prints its
    error line alone."""
    return Console(file=io.StringIO(), emoji=False, soft_wrap=True, highlight=False, color_system=None)


def release_held(held: Console, console: Console) -> None:
    """Print on ``console`` what ``held`` (:func:`held_console`) kept."""
    text = held.file.getvalue() if isinstance(held.file, io.StringIO) else ""
    if text:
        console.print(text, end="", markup=False, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    """The console results go to."""
    return make_console()
