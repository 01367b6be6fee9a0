"""`gpt1 finetune --procs 2` with rank 0 killed by SIGKILL mid-run (an out-of-memory killer, a `kill -9`).

The user sees one line naming the killed worker and how to continue, not the surviving rank's tracebacks nor the
elastic launcher's; what the workers printed is kept in the run's ``workers.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gptcli.train import distributed
from gptcli.train.launch_files import KEEP_ENV, debugging, keep_uncaught
from tests.faults.conftest import (
    KILL_TIMEOUT,
    REPO,
    end_launch,
    gpt1,
    launch_workers,
    one_thread_env,
    sst2_inputs,
    step_numbers,
    wait_for,
)


@pytest.fixture(scope="module")
def inputs(corpus, tmp_path_factory) -> tuple[Path, Path]:
    """(a "pretrained" checkpoint with the corpus's tokenizer; an SST-2 folder of 200 training sentences)."""
    return sst2_inputs(corpus, tmp_path_factory.mktemp("killed-rank"), 200, 8)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")
@pytest.mark.parametrize("rank", [0, 1])
def test_a_killed_rank_is_one_line_and_the_workers_output_is_kept(inputs, tmp_path, rank):
    pre, data = inputs
    run = tmp_path / "run"
    args = ["finetune", "--task", "sst2", "--init", pre, "--data-dir", data, "--out", run, "--procs", "2"]
    args += ["--batch-size", "4", "--epochs", "20", "--save-every", "2", "--device", "cpu", "--quiet"]
    temp = tmp_path / "temp"  # the launcher's temporary folders: gone when it ends
    temp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptcli", *map(str, args)],
        cwd=REPO,
        env={**one_thread_env(), "TMPDIR": str(temp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: len(step_numbers(run)) > 0, proc, "the first checkpoint", poll=0.05)
        workers = launch_workers(proc.pid)
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[rank], signal.SIGKILL)
        out, err = proc.communicate(timeout=KILL_TIMEOUT)
    finally:
        end_launch(proc)
    assert proc.returncode == 1, err[-3000:]
    # The line the launcher prints before it starts, then the error alone: no traceback of the surviving rank (up
    # to 88 lines before), none of elastic's log lines.
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 2 and lines[0].startswith("launching 2 CPU worker(s)"), err[-5000:]
    assert lines[1].startswith(f"error: worker rank {rank} was killed (SIGKILL"), lines
    assert f"gpt1 finetune --out {run} --resume" in lines[1] and f"{run / 'workers.log'}" in lines[1], lines[1]
    log = (run / "workers.log").read_text(encoding="utf-8")
    assert "Traceback" in log and "closing signal SIGTERM" in log  # the surviving rank's and elastic's own
    assert [p.name for p in temp.iterdir() if p.name.startswith("gpt1-")] == []


def test_a_worker_of_the_launcher_leaves_its_error_to_it(tmp_path, monkeypatch, capsys):
    """A worker's own error line (or traceback) goes to the launch's folder, not the terminal: the launcher says it
    once for the whole job."""
    monkeypatch.setenv(KEEP_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    res = gpt1(["finetune", "--task", "no-such-task", "--out", tmp_path / "run"], capsys)
    assert res.code == 1 and res.err == "", res.err
    assert (tmp_path / "rank-1.txt").read_text(encoding="utf-8").startswith("error: ")


def test_debug_shows_the_workers_everything(inputs, tmp_path, monkeypatch, capsys):
    """`gpt1 --debug` reaches the workers (which then print their tracebacks) and ends with the command."""
    monkeypatch.delenv("GPT1_DEBUG", raising=False)
    seen = {}

    def launch_command(*args, **kwargs):
        seen["debug"] = debugging()
        return None

    monkeypatch.setattr(distributed, "launch_command", launch_command)
    pre, data = inputs
    args = ["--debug", "finetune", "--task", "sst2", "--init", pre, "--data-dir", data, "--procs", "2"]
    res = gpt1([*args, "--out", tmp_path / "run", "--device", "cpu"], capsys)
    assert seen == {"debug": True}, res.err[-3000:]
    assert "GPT1_DEBUG" not in os.environ


def test_an_exception_that_escapes_a_worker_is_kept_too(tmp_path, monkeypatch):
    """The launcher's SIGTERM can arrive while a worker handles its peer's death: the exception it raises escapes
    the command's error handling, and would print as a traceback but for the worker's hook."""
    import sys
    import threading

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # both restored after the test
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    monkeypatch.setenv(KEEP_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    keep_uncaught()
    try:
        raise RuntimeError("Connection reset by peer")
    except RuntimeError as e:
        sys.excepthook(type(e), e, e.__traceback__)
    text = (tmp_path / "rank-0.txt").read_text(encoding="utf-8")
    assert text.startswith("Traceback") and "RuntimeError: Connection reset by peer" in text
