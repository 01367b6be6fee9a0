"""commands/render.py: the Rich renderer of the progress protocol."""

from __future__ import annotations

import io

from rich.console import Console

from gptcli.commands.render import RichProgress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120, color_system=None), buf


def test_plain_output_is_one_line_per_event_for_logs() -> None:
    console, buf = _console(terminal=False)
    p = RichProgress(console, log_interval=0)
    p.stage("quickstart")
    p.stage("encode", 2e6, unit="B")
    p.advance(1e6, docs=3, tokens=1200)
    p.end()
    p.stage("pretrain", 100, unit="updates", done=40)
    p.advance(10, loss=3.25, lr=2.5e-4)
    p.note("odd file skipped", level="warn")
    p.end("trained")
    p.end("all done")
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    assert lines[0].startswith("quickstart ─")
    assert "encode: 0.0 MB of 2.0 MB" in lines
    assert "encode 1.0 MB/2.0 MB  docs 3  tokens 1,200" in lines
    # A stage ended without a summary still ends on its own line, with how far it got (not the start's "0 of").
    assert any(line.startswith("encode: 1.0 MB of 2.0 MB (") for line in lines)
    assert "pretrain: 40 of 100 updates" in lines
    assert "pretrain 50/100 updates  loss 3.2500  lr 2.500e-04" in lines
    assert "warning: odd file skipped" in lines
    assert any(line.startswith("✓ trained (") for line in lines)
    assert lines[-1].startswith("✓ all done (")


def test_status_lines_are_throttled_in_logs() -> None:
    console, buf = _console(terminal=False)
    p = RichProgress(console, log_interval=3600)
    p.stage("pretrain", 10)
    p.advance(1, loss=1.0)  # the stage line was printed just now: this one waits for the interval
    p.advance(1, loss=0.9)
    p.end()
    assert "loss" not in buf.getvalue()


def test_a_terminal_gets_bars_that_are_stopped_at_the_end() -> None:
    console, buf = _console(terminal=True)
    p = RichProgress(console)
    p.stage("finetune rte", 4, unit="updates")
    for _ in range(4):
        p.advance(1, loss=0.5)
    p.end("dev accuracy 61.0")
    assert p._bars is None  # the live display is closed once no bar is open
    assert "4/4 updates" in buf.getvalue() and "dev accuracy 61.0" in buf.getvalue()


def test_unbalanced_calls_do_not_crash() -> None:
    console, _ = _console(terminal=False)
    p = RichProgress(console)
    p.advance(1, loss=1.0)
    p.end()


def test_a_bar_shows_one_eta_and_a_log_line_keeps_the_library_s() -> None:
    """A bar has its own time-remaining column: the library's ETA field beside it showed a second, different ETA."""
    console, buf = _console(terminal=True)
    p = RichProgress(console)
    p.stage("pretrain", 10, unit="updates")
    p.advance(1, loss=0.5, ETA="12:34")
    p.end()
    assert "12:34" not in buf.getvalue() and "loss" in buf.getvalue()
    console, buf = _console(terminal=False)
    p = RichProgress(console, log_interval=0)
    p.stage("pretrain", 10, unit="updates")
    p.advance(1, loss=0.5, ETA="12:34")
    p.end()
    assert "ETA 12:34" in buf.getvalue()
