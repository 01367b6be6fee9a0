"""Test helpers for command tests: read `gpt1 COMMAND --help` (run in this process by ``error_lines.gpt1``) as
{panel title: its lines}."""

from __future__ import annotations

import re

from error_lines import gpt1

PANEL_TOP = re.compile(r"^╭─ (.+?) ─+╮$")


def help_panels(capsys, monkeypatch, command: str) -> dict[str, str]:
    """``gpt1 COMMAND --help`` on a wide terminal, split into panels: title → the panel's text, one line per row
    (with its box borders removed)."""
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setenv("TERMINAL_WIDTH", "220")
    capsys.readouterr()
    assert gpt1([command, "--help"]).code == 0
    panels: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in capsys.readouterr().out.splitlines():
        line = line.strip()
        top = PANEL_TOP.match(line)
        if top:
            current = panels.setdefault(top.group(1), [])
        elif line.startswith("╰"):
            current = None
        elif current is not None:
            current.append(line.strip("│ "))
    return {title: "\n".join(rows) for title, rows in panels.items()}


def option_row(panel: str, flag: str) -> str:
    """What ``panel`` says about option ``flag``: its row and the wrapped lines under it, joined by spaces."""
    rows = panel.splitlines()
    for i, row in enumerate(rows):
        if re.match(rf"^{re.escape(flag)}(\s|$)", row):
            more = []
            for nxt in rows[i + 1 :]:
                if nxt.startswith("-"):
                    break
                more.append(nxt)
            return " ".join([row, *more])
    raise AssertionError(f"{flag} not in panel:\n{panel}")
