"""Issue #31, class 3: special files among `gpt1 prepare`'s inputs (``gptcli/data/inputs.py`` states the rule).

Only regular files are read; links are followed once (a symlinked folder is walked, never twice); a recursive glob
ends over a folder loop; every input left out is a warning naming it and a line in the manifest's ``warnings``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli.data.inputs import resolve_inputs
from tests.faults.conftest import gpt1, unblock_later

TEXT = "the quick brown fox jumps over the lazy dog.\nsmall birds sing in tall green trees.\n" * 30


def _folder(tmp: Path) -> Path:
    d = tmp / "texts"
    (d / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        (d / name).write_text(TEXT, encoding="utf-8")
    return d


def _prepare(tmp: Path, *inputs) -> list:
    return ["prepare", *inputs, "--out", tmp / "out", "--vocab-size", "40", "--workers", "1"]


def _manifest(tmp: Path) -> dict:
    return json.loads((tmp / "out" / "manifest.json").read_text())


def _read(manifest: dict) -> list[str]:
    return sorted(Path(i["path"]).name for i in manifest["inputs"])


@pytest.mark.parametrize("special", ["fifo", "dev-zero", "dev-null", "socket"])
def test_a_special_file_in_an_input_folder_is_skipped_and_reported(tmp_path, capsys, special):
    d = _folder(tmp_path)
    bad = d / "sub" / "special.txt"
    if special == "fifo":
        os.mkfifo(bad)
        unblock_later(bad)
    elif special == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(bad))
    else:
        bad.symlink_to(f"/dev/{special[4:]}")
    res = gpt1(_prepare(tmp_path, d), capsys)
    assert res.code == 0, res.err[-2000:]
    assert f"{bad}: skipped: not a regular file" in res.err
    m = _manifest(tmp_path)
    assert _read(m) == ["a.txt", "b.txt", "c.txt"]
    assert any(str(bad) in w and "not a regular file" in w for w in m["warnings"]), m["warnings"]


def test_a_named_special_file_is_one_line(tmp_path, capsys):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    unblock_later(fifo)
    assert_one_line_error(gpt1(_prepare(tmp_path, fifo), capsys), "not a regular file (a FIFO)")
    assert not (tmp_path / "out").exists()


def test_a_symlinked_subfolder_is_read_and_a_loop_is_reported_not_followed(tmp_path, capsys):
    d = _folder(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "d.txt").write_text(TEXT, encoding="utf-8")
    (d / "linked").symlink_to(other, target_is_directory=True)
    (d / "sub" / "loop").symlink_to(d, target_is_directory=True)  # texts/sub/loop → texts
    res = gpt1(_prepare(tmp_path, d), capsys)
    assert res.code == 0, res.err[-2000:]
    m = _manifest(tmp_path)
    assert _read(m) == ["a.txt", "b.txt", "c.txt", "d.txt"]  # the linked folder's file, each file once
    assert any("loop" in w and "already read" in w for w in m["warnings"]), m["warnings"]


@pytest.mark.parametrize("pattern", ["**/*.txt", "*/**/*.txt", "**", "sub/**/c.txt", "[ab].txt", "?.txt"])
def test_a_recursive_glob_over_a_folder_loop_ends(tmp_path, pattern):
    d = _folder(tmp_path)
    (d / "sub" / "loop").symlink_to(d, target_is_directory=True)
    (d / "sub" / "loop2").symlink_to(d / "sub", target_is_directory=True)
    skipped: list = []
    files = resolve_inputs([f"{d}/{pattern}"], skipped)
    names = sorted(p.name for p in files)
    assert len(names) == len(set(names))  # each file once
    expect = {
        "**/*.txt": ["a.txt", "b.txt", "c.txt"],
        "*/**/*.txt": ["c.txt"],
        "**": ["a.txt", "b.txt", "c.txt"],
        "sub/**/c.txt": ["c.txt"],
        "[ab].txt": ["a.txt", "b.txt"],
        "?.txt": ["a.txt", "b.txt"],
    }[pattern]
    assert names == expect


def test_two_links_pointing_at_each_other_are_a_warning_not_a_traceback(tmp_path, capsys):
    d = _folder(tmp_path)
    (d / "x.txt").symlink_to(d / "y.txt")
    (d / "y.txt").symlink_to(d / "x.txt")
    res = gpt1(_prepare(tmp_path, d), capsys)
    assert res.code == 0 and "Traceback" not in res.err, res.err[-2000:]
    warnings = _manifest(tmp_path)["warnings"]
    assert sum("x.txt" in w or "y.txt" in w for w in warnings) == 2, warnings
    res = gpt1([*_prepare(tmp_path, d / "x.txt"), "--overwrite"], capsys)
    assert "Traceback" not in res.err and res.code == 1


def test_strict_turns_a_skipped_special_file_into_an_error(tmp_path, capsys):
    d = _folder(tmp_path)
    (d / "zero.txt").symlink_to("/dev/zero")
    assert_one_line_error(gpt1([*_prepare(tmp_path, d), "--strict"], capsys), "zero.txt", "not a regular file")
