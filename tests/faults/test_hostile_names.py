"""Names with control characters (a newline, a terminal escape) in paths the user gives are printed escaped, as
``ls`` and ``git`` show them: a newline in ``--out`` must not forge a "done" line, nor an escape sequence recolour the
terminal, whether the name appears in an error line or in a command's own output."""

from __future__ import annotations

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import TINY_ARGS, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")

FORGED = "run\ndone: 1000000 updates; checkpoint elsewhere\x1b[2J"


def _lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


def test_a_newline_in_out_forges_no_line(corpus, tmp_path, capsys):
    out = tmp_path / FORGED
    res = gpt1(["pretrain", "--data", corpus, "--out", out, "--max-steps", "1", *TINY_ARGS], capsys)
    assert res.code == 0, res.err[-3000:]
    assert out.is_dir()  # the name itself is the user's to choose
    shown = res.out + res.err
    assert not any(x.startswith("done: 1000000") for x in _lines(shown)), shown
    assert "\x1b[2J" not in shown and "run\\ndone: 1000000" in shown


def test_an_error_line_stays_one_line(tmp_path, capsys):
    res = gpt1(["pretrain", "--data", tmp_path / FORGED, "--out", tmp_path / "run"], capsys)
    line = assert_one_line_error(res, "run\\ndone: 1000000", "\\x1b[2J", "corpus directory not found")
    assert "\x1b" not in line


def test_printable_keeps_ordinary_text():
    from gptcli.files.fsutil import printable

    assert printable("runs/été 日本 [draft] (v2)") == "runs/été 日本 [draft] (v2)"
    assert printable("a\tb\rc\x7f") == "a\\tb\\rc\\x7f"
