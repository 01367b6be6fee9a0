"""``--config`` files a user (or an attacker) may hand gpt1: whatever the file holds — a duplicate key, nesting
100,000 deep, a 5,000-digit number, a JSON list, string or number instead of a table — the command stops with one
``error:`` line naming the file, never a traceback or a silently chosen value; a pipe such as ``/dev/stdin`` is read
like a file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import gpt1

BAD = {
    "duplicate.json": ('{"lr": 0.001, "lr": 0.5}', "'lr' is given twice"),
    "deep.json": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "deep.toml": ("a = " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "long-number.json": ('{"seed": ' + "7" * 5000 + "}", "thousands of digits"),
    "long-number.toml": ("seed = " + "7" * 5000, "thousands of digits"),
    "list.json": ("[1, 2]", "holds a list, not a table of settings"),
    "string.json": ('"lr"', "holds a string, not a table of settings"),
    "number.json": ("3", "holds a number, not a table of settings"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_hostile_config_file_is_one_line(name, tmp_path, capsys):
    text, message = BAD[name]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    res = gpt1(["pretrain", "--config", path, "--data", tmp_path, "--out", tmp_path / "run"], capsys)
    assert_one_line_error(res, name, "not a valid config file", message)
    assert not (tmp_path / "run").exists()


def _write(fifo: Path, text: str) -> None:
    with open(fifo, "w", encoding="utf-8") as f:
        f.write(text)


def test_a_config_from_a_pipe_is_read(tmp_path):
    """``--config /dev/stdin`` is a pipe, not a regular file: it is read once, like the file it stands for (JSON
    when it starts with ``{``, TOML otherwise)."""
    from gptcli.config import read_config_file

    for text, expected in (('{"lr": 0.25}', {"lr": 0.25}), ("lr = 0.5\n", {"lr": 0.5})):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)

        writer = threading.Thread(target=_write, args=(fifo, text), daemon=True)
        writer.start()
        assert read_config_file(fifo) == expected
        writer.join(10)
        fifo.unlink()
