"""The temporary folders of `--gpus`/`--procs` launches: a launcher killed with SIGKILL cannot remove its own (the
resolved config among them), so the next launch sweeps every folder whose launcher is gone — never a live one's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gptcli.train.launch_files import launch_folder, launch_root, sweep, this_host
from tests.faults.conftest import KILL_TIMEOUT, REPO, TINY_ARGS, one_thread_env, wait_for

pytestmark = pytest.mark.skipif(os.name != "posix", reason="asks the OS whether a pid is alive")


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder(root: Path, pid: int, host: str | None = None) -> Path:
    folder = root / f"launch-{pid}-{host or this_host()}-abc123"
    (folder / "heartbeat").mkdir(parents=True)
    (folder / "finetune.toml").write_text("task = 'rte'\n", encoding="utf-8")
    return folder


def test_the_next_launch_sweeps_the_folders_of_dead_launchers_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = launch_root()
    assert root.parent == tmp_path
    dead = _folder(root, _dead_pid())
    live = _folder(root, os.getpid())  # a launch running now (this process)
    parent = _folder(root, os.getppid())  # another live process's
    stranger = root / "notes"  # not a launch folder: never touched
    stranger.mkdir()
    remote = _folder(root, _dead_pid(), "another-host")  # a shared temporary folder: its pids are not ours

    with launch_folder() as mine:
        assert mine.parent == root and mine.name.startswith(f"launch-{os.getpid()}-{this_host()}-")
        assert not dead.exists()
        assert live.is_dir() and parent.is_dir() and stranger.is_dir() and remote.is_dir()
    assert not mine.exists()


def test_a_sweep_leaves_links_and_files_alone(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x", encoding="utf-8")
    root = tmp_path / "root"
    root.mkdir()
    pid = _dead_pid()
    (root / f"launch-{pid}-{this_host()}-link").symlink_to(target)
    (root / f"launch-{pid}-{this_host()}-file").write_text("x", encoding="utf-8")
    dead = _folder(root, pid)
    assert sweep(root) == [dead]
    assert (target / "keep").is_file() and (root / f"launch-{pid}-{this_host()}-file").is_file()


def test_no_sweep_through_a_root_that_is_not_this_users_folder(tmp_path, monkeypatch):
    """The root's name taken by a link to another folder: the launch works in a private folder of its own and
    removes nothing behind the link, not even what looks like a dead launcher's folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    looks_dead = _folder(elsewhere, _dead_pid())
    launch_root().symlink_to(elsewhere)
    with launch_folder() as mine:
        assert elsewhere not in mine.parents
    assert looks_dead.is_dir()


def test_the_last_launch_leaves_no_trace(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with launch_folder() as folder:
        (folder / "config.toml").write_text("", encoding="utf-8")
    assert list(tmp_path.iterdir()) == []


def test_a_root_taken_by_another_file_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    launch_root().write_text("not a folder", encoding="utf-8")
    with launch_folder() as folder:
        assert folder.is_dir() and launch_root() not in folder.parents
    assert launch_root().read_text(encoding="utf-8") == "not a folder"


@pytest.mark.slow
def test_a_launcher_killed_with_sigkill_leaves_nothing_after_the_next_launch(corpus, tmp_path, monkeypatch):
    """The real case: `gpt1 pretrain --procs 2` killed with SIGKILL keeps its folder (its resolved config inside);
    the next launch on this machine removes it."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    args = ["pretrain", "--data", corpus, "--out", tmp_path / "run", "--procs", "2", "--max-steps", "100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptcli", *map(str, [*args, *TINY_ARGS])],
        cwd=REPO,
        env={**one_thread_env(), "TMPDIR": str(temp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: list(launch_root().glob("launch-*/pretrain.toml")), proc, "the launch", poll=0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=KILL_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [left] = list(launch_root().iterdir())
    assert (left / "pretrain.toml").is_file()  # what the launcher could not remove
    with launch_folder() as mine:
        assert list(launch_root().iterdir()) == [mine]
    assert list(temp.iterdir()) == []
