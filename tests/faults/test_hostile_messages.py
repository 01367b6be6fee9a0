"""Issue #31, class 8: what gpt1 prints is what it meant, character for character.

Rich reads ``:100:`` as an emoji code and ``[draft]`` as markup; piped output used to be cut at 80 columns, inside
paths. Every console is made without emoji (``commands/render.make_console``; the error console in ``cli.py``),
soft-wrapped when not a terminal, and every message, table title and cell built from user text is escaped. A folder
that exists is an input even when its name has glob characters. ``prepare``'s workers end quietly when the pool
terminates them (they used to inherit the command's SIGTERM handler and print a traceback).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from error_lines import Outcome, assert_one_line_error

from tests.faults.conftest import gpt1, one_thread_env

NAMES = [
    "train.tsv:1234:",
    "dev.tsv:100:",
    "exp:warning:",
    "[draft] (v2)",
    "[bold]x[dim]",
    ":smile: [red]",
    "a:+1::100:",
]


@pytest.mark.parametrize("name", NAMES)
def test_an_error_naming_a_path_prints_it_verbatim(tmp_path, capsys, name):
    missing = tmp_path / name / "books"
    line = assert_one_line_error(gpt1(["prepare", missing, "--out", tmp_path / "out"], capsys))
    assert str(missing) in line, line


@pytest.mark.parametrize("name", NAMES)
def test_a_warning_naming_a_file_prints_it_verbatim(tmp_path, capsys, name):
    d = tmp_path / "texts"
    d.mkdir()
    for i in range(3):
        (d / f"good{i}.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    (d / f"{name}.txt").write_bytes(b"")  # an empty file: skipped with a warning naming it
    res = gpt1(["prepare", d, "--out", tmp_path / "out", "--vocab-size", "40", "--workers", "1"], capsys)
    assert res.code == 0, res.err[-2000:]
    assert f"{name}.txt" in res.err, res.err


@pytest.mark.parametrize("name", ["[draft] (v2)", "notes[1]", "a*b?"])
def test_an_existing_folder_with_glob_characters_is_that_folder(tmp_path, capsys, name):
    d = tmp_path / name
    d.mkdir()
    for i in range(3):
        (d / f"a{i}.txt").write_text("small birds sing in tall green trees.\n" * 60, encoding="utf-8")
    res = gpt1(["prepare", d, "--out", tmp_path / "out", "--vocab-size", "40", "--workers", "1"], capsys)
    assert res.code == 0, res.err[-2000:]
    assert str(tmp_path / "out") in res.out.replace("\n", "") or (tmp_path / "out" / "manifest.json").is_file()


def test_piped_output_keeps_a_long_path_on_one_line(tmp_path, capsys):
    deep = tmp_path / ("x" * 60) / ("y" * 60) / ("z" * 60) / "books"
    line = assert_one_line_error(gpt1(["prepare", deep, "--out", tmp_path / "out"], capsys))
    assert str(deep) in line


def test_piped_output_of_a_real_process_has_no_emoji_and_no_cut_paths(tmp_path):
    deep = tmp_path / ("exp:warning:" + "w" * 90) / "dev.tsv:100:"
    r = subprocess.run(
        [sys.executable, "-m", "gptcli", "prepare", str(deep), "--out", str(tmp_path / "o")],
        env={**one_thread_env(), "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert str(deep) in r.stderr, r.stderr  # whole, on one line, no ⚠ or 💯
    assert "⚠" not in r.stderr and "💯" not in r.stderr


def test_prepare_workers_end_quietly_when_the_pool_is_terminated(tmp_path):
    """Several workers and an error mid-run: the only thing printed is the main process's one line."""
    d = tmp_path / "texts"
    d.mkdir()
    for i in range(4):
        (d / f"t{i}.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    (d / "bad.txt").write_bytes(b"\xff\xfe\x00binary\x00" * 100)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gptcli",
            "prepare",
            str(d),
            "--out",
            str(tmp_path / "o"),
            "--vocab-size",
            "40",
            "--workers",
            "2",
            "--strict",
        ],
        env=one_thread_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line_error(Outcome(r.returncode, r.stdout, r.stderr))


def test_a_prepare_worker_does_not_keep_the_command_s_sigterm_handler(tmp_path):
    """The cause, checked directly: a forked worker inherits the command line's SIGTERM handler (which raises, and
    would print the worker's traceback when the pool terminates it); the worker's initializer restores the default."""
    code = (
        "import signal\nfrom gptcli import cli\nfrom gptcli.data import workers\ncli._catch_sigterm()\n"
        "assert signal.getsignal(signal.SIGTERM) is cli._on_sigterm\nworkers._worker_init()\n"
        "print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)"
    )
    r = subprocess.run([sys.executable, "-c", code], env=one_thread_env(), capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "True", r.stderr
