"""Issue #31, classes 1 and 2: replacing an output is one swap that the next run can always finish or undo, and
nothing lets two runs write one output.

1. ``--overwrite`` swaps the new output in with one ``renameat2(RENAME_EXCHANGE)`` where Linux allows, else with
   three renames (``tmp → .NAME.new-ID``, ``NAME → .NAME.old-ID``, ``.NAME.new-ID → NAME``). A real ``kill -9``
   after each step of either way must leave ``NAME`` old or new — and the next run (taking the output's lock)
   puts it back or finishes, removing every ``.old-``, ``.new-``, ``.partial-``, ``.tmp-`` leftover. A symlinked
   ``--out`` is replaced at its target, the link kept.
2. Every command that writes an output holds an exclusive ``flock`` beside it for the run: a second run on it is
   one line naming the holder (pid, host, command) and exit 1, before any work; the OS releases it when its holder
   dies (``kill -9``); a worker whose parent (the job's launcher) holds it runs under it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli.files.locks import lock_path, output_lock
from tests.faults.conftest import REPO, copy_of, gpt1, one_thread_env, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the quick brown fox jumps over a lazy dog. " * 40, "small birds sing in tall green trees. " * 40]


def _texts(where: Path) -> Path:
    d = where / "texts"
    d.mkdir(exist_ok=True)
    for i, t in enumerate(TEXTS):
        (d / f"t{i}.txt").write_text(t, encoding="utf-8")
    return d


def _prepare(texts: Path, out: Path, *extra) -> list:
    return ["prepare", texts, "--out", out, "--vocab-size", "40", "--workers", "1", *extra]


def _hidden(where: Path, name: str) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith(f".{name}."))


# --- 1. the swap, killed after each of its steps ----------------------------------------------------------------

KILLER = r"""
import os, sys
from pathlib import Path
from gptcli.files import fsutil
fsutil.exchange_supported = sys.argv[3] == "exchange"
real = os.rename
n = [0]
def rename(a, b):
    real(a, b)
    n[0] += 1
    if n[0] == int(sys.argv[4]):
        os._exit(9)  # as kill -9 would: no cleanup at all
os.rename = rename
fsutil.move_into_place(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def _two_outputs(where: Path) -> tuple[Path, Path]:
    out, tmp = where / "out", where / ".out.partial-1-abc"
    for d, what in ((out, "old"), (tmp, "new")):
        d.mkdir()
        (d / "which").write_text(what)
    return out, tmp


@pytest.mark.parametrize("way,killed_after", [("exchange", 1), ("renames", 1), ("renames", 2), ("renames", 3)])
def test_a_swap_killed_after_any_step_is_finished_or_undone_by_the_next_run(tmp_path, way, killed_after):
    out, tmp = _two_outputs(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", KILLER, str(tmp), str(out), way, str(killed_after)],
        env=one_thread_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (0, 9), r.stderr
    if (out / "which").exists():
        seen_before = (out / "which").read_text()
    else:
        seen_before = None  # the window the two-rename swap used to leave open: no output at all
    with output_lock(out):  # what every next run does first
        pass
    assert (out / "which").read_text() in ("old", "new")
    if seen_before is not None:
        assert (out / "which").read_text() == seen_before  # what a reader saw stays
    assert _hidden(tmp_path, "out") == [], "a leftover survived the next run"


def test_the_next_prepare_puts_back_an_output_left_aside_and_says_it_is_there(tmp_path, capsys):
    texts = _texts(tmp_path)
    out = tmp_path / "corpus"
    assert gpt1(_prepare(texts, out), capsys).code == 0
    before = snapshot(out)
    out.rename(tmp_path / ".corpus.old-77-abcdef")  # killed between "old aside" and "new in place"
    (tmp_path / ".corpus.partial-78-abcdef").mkdir()  # and a partial build of a second killed run
    res = gpt1(_prepare(texts, out), capsys)  # no --overwrite: the restored corpus is there again
    assert_one_line_error(res, "already holds a prepared corpus")
    assert snapshot(out) == before and _hidden(tmp_path, "corpus") == []
    tmp_path.joinpath(".corpus.old-79-abcdef").mkdir()  # an old output already replaced: removed
    assert gpt1(_prepare(texts, out, "--overwrite", "--seed", "3"), capsys).code == 0
    assert _hidden(tmp_path, "corpus") == []


def test_overwrite_through_a_symlinked_out_replaces_the_target_and_keeps_the_link(tmp_path, capsys):
    texts = _texts(tmp_path)
    real = tmp_path / "disk" / "corpus"
    real.parent.mkdir()
    assert gpt1(_prepare(texts, real), capsys).code == 0
    link = tmp_path / "corpus"
    link.symlink_to(real, target_is_directory=True)
    old_manifest = (real / "manifest.json").read_text()
    assert gpt1(_prepare(texts, link, "--overwrite", "--seed", "5"), capsys).code == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / "manifest.json").read_text() != old_manifest  # the new corpus is at the target
    assert _hidden(real.parent, "corpus") == [] and _hidden(tmp_path, "corpus") == []


def test_a_stale_cache_temporary_is_removed_by_the_next_writer(tmp_path):
    from gptcli.data.cache import write_entry

    root = tmp_path / "cache"
    root.mkdir()
    (root / ".abc.arrow.tmp-deadbeef").write_bytes(b"half an entry")  # a writer killed mid-write
    write_entry(root, "x" * 40, {"n": 1}, [[[1, 2, 3]]])
    assert sorted(p.name for p in root.iterdir()) == ["x" * 40 + ".arrow", "x" * 40 + ".json"]


# --- 2. one run per output ------------------------------------------------------------------------------------------

HOLDER = r"""
import sys, time
from gptcli.files.locks import output_lock
with output_lock(sys.argv[1]):
    open(sys.argv[2], "w").close()
    time.sleep(120)
"""


@pytest.fixture
def held(tmp_path):
    """Hold the lock on a path from another process: ``held(path)`` returns the holder (a Popen)."""
    procs = []

    def hold(path: Path) -> subprocess.Popen:
        ready = tmp_path / f"ready-{len(procs)}"
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(ready)], env=one_thread_env())
        procs.append(p)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert p.poll() is None and time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.01)
        return p

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def _commands(corpus: Path, run: Path, tmp: Path, shared: Path) -> dict[str, tuple[Path, list]]:
    """(the output, the command) for every command that writes one."""
    from tests.faults.conftest import TINY_ARGS

    ft = [
        "--task",
        "rte",
        "--data-dir",
        shared / "glue" / "RTE",
        "--max-train-examples",
        "4",
        "--max-eval-examples",
        "4",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--quiet",
    ]
    out = tmp / "out"
    return {
        "prepare": (out, _prepare(_texts(tmp), out)),
        "pretrain": (out, ["pretrain", "--data", corpus, "--out", out, *TINY_ARGS, "--max-steps", "1"]),
        "pretrain --resume": (run, ["pretrain", "--data", corpus, "--out", run, "--resume", "--quiet"]),
        "finetune": (out, ["finetune", "--init", run, "--out", out, *ft]),
        "convert": (out, ["convert", run, "--to", "hf", "--out", out]),
        "eval": (
            out,
            [
                "eval",
                "--checkpoint",
                run,
                "--task",
                "rte",
                "--data-dir",
                shared / "glue" / "RTE",
                "--out",
                out,
                "--device",
                "cpu",
            ],
        ),
        "zeroshot": (
            out,
            [
                "zeroshot",
                "--checkpoint",
                run,
                "--task",
                "sst2",
                "--data-dir",
                shared / "glue" / "SST-2",
                "--out",
                out,
                "--device",
                "cpu",
            ],
        ),
        "quickstart": (out, ["quickstart", "--out", out, "--minutes", "1"]),
    }


@pytest.mark.parametrize(
    "command", ["prepare", "pretrain", "pretrain --resume", "finetune", "convert", "eval", "zeroshot", "quickstart"]
)
def test_a_second_run_on_a_locked_output_is_refused_naming_the_holder(
    corpus, run, tmp_path, shared_data, capsys, held, command
):
    mine = copy_of(run, tmp_path) if command == "pretrain --resume" else run
    out, args = _commands(corpus, mine, tmp_path, shared_data)[command]
    before = snapshot(out) if out.exists() else None
    holder = held(out)
    res = gpt1(args, capsys)
    line = assert_one_line_error(res, "is in use by", f"pid {holder.pid}", "wait for that run to end")
    assert "HOLDER" not in line and "-c" in line  # the holder's command line, as it was started
    assert (snapshot(out) if out.exists() else None) == before  # nothing written, nothing tidied


def test_the_lock_dies_with_its_holder(tmp_path, capsys, held):
    texts = _texts(tmp_path)
    out = tmp_path / "corpus"
    holder = held(out)
    assert gpt1(_prepare(texts, out), capsys).code == 1
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock_path(out).exists()  # a stale lock file: no obstacle
    assert gpt1(_prepare(texts, out), capsys).code == 0
    assert not lock_path(out).exists()  # a finished run removes its lock file


def test_a_symlink_and_its_target_are_one_output(tmp_path, capsys, held):
    texts = _texts(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    held(real)
    assert_one_line_error(gpt1(_prepare(texts, link), capsys), "is in use by")


def test_the_lock_is_reentrant_and_a_launchers_workers_run_under_it(tmp_path):
    out = tmp_path / "run"
    with output_lock(out):
        with output_lock(out):  # a pipeline stage locking what its pipeline holds
            pass
        child = "import sys\nfrom gptcli.files.locks import output_lock\nwith output_lock(sys.argv[1]): print('ran')"
        r = subprocess.run(
            [sys.executable, "-c", child, str(out)], env=one_thread_env(), capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr  # a child of the holder: its worker
        info = json.loads(lock_path(out).read_text())
        assert info["pid"] == os.getpid() and info["host"] and "since" in info
    grandchild = (
        "import subprocess, sys\nfrom gptcli.files.locks import output_lock\nwith output_lock(sys.argv[1]):\n"
        "    r = subprocess.run([sys.executable, '-c', 'import sys; sys.path.insert(0, sys.argv[2]);"
        "from gptcli.files.locks import output_lock\\nwith output_lock(sys.argv[1]): pass', sys.argv[1], "
        "sys.argv[2]]); print(r.returncode)"
    )
    r = subprocess.run(
        [sys.executable, "-c", grandchild, str(out), str(REPO)],
        env=one_thread_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "0", r.stderr


def test_a_parent_created_only_for_the_lock_is_removed_when_the_run_fails_early(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "corpus"
    res = gpt1(["prepare", tmp_path / "missing", "--out", out], capsys)
    assert res.code == 1
    assert list(tmp_path.iterdir()) == []
