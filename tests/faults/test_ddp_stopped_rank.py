"""`gpt1 pretrain --procs 2` with one worker stopped (SIGSTOP: alive, silent, holding its sockets open).

Before, the other rank waited out the whole collective timeout, then failed naming *itself*, and the launcher
spent another 30 s failing to SIGTERM the stopped process. Now the launcher's watchdog sees the stopped worker's
heartbeat stand still for half of ``GPT1_DIST_TIMEOUT``, kills it, and the job ends within the timeout with one
line naming the rank; the run resumes from its last checkpoint.
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

from tests.faults.conftest import REPO, TINY_ARGS, end_launch, gpt1, launch_workers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc"),
]

TIMEOUT_S = 20


def _logged(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(x)["step"] for x in lines[:-1]]  # the last line may be half-written
    return max(steps, default=0)


def test_a_stopped_rank_ends_the_job_within_the_timeout_naming_it(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GPT1_DIST_TIMEOUT": str(TIMEOUT_S),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "gptcli",
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(run),
        "--procs",
        "2",
        "--max-steps",
        "100000",
        "--save-every",
        "5",
        *TINY_ARGS,
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _logged(run) < 12:  # past two checkpoints
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        workers = launch_workers(proc.pid)
        assert sorted(workers) == [0, 1], workers
        # Rank 0: the rank that writes checkpoints and logs. The old message named the rank left waiting (1).
        stopped = time.monotonic()
        os.kill(workers[0], signal.SIGSTOP)
        _, err = proc.communicate(timeout=TIMEOUT_S + 60)
        took = time.monotonic() - stopped
    finally:
        end_launch(proc)
    assert proc.returncode == 1, err[-3000:]
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[-1].startswith("error: worker rank 0 stopped responding"), err[-3000:]
    assert "GPT1_DIST_TIMEOUT" in lines[-1]
    with capsys.disabled():  # shown with -s
        print(f"the job ended {took:.1f} s after rank 0 was stopped (GPT1_DIST_TIMEOUT={TIMEOUT_S})")
    assert took < TIMEOUT_S, took  # the job ended within the collective timeout
    assert not Path(f"/proc/{workers[0]}").exists()  # the stopped worker is gone, not left behind stopped
    # The run continues from its last checkpoint, here in one process.
    res = gpt1(["pretrain", "--out", run, "--resume", "--max-steps", str(_logged(run) + 2), "--quiet"], capsys)
    assert res.code == 0, res.err[-3000:]


def test_a_bad_timeout_setting_is_one_line(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT1_DIST_TIMEOUT", "soon")
    res = gpt1(["pretrain", "--data", corpus, "--out", tmp_path / "run", "--procs", "2", *TINY_ARGS], capsys)
    assert_one_line_error(res, "GPT1_DIST_TIMEOUT='soon'", "positive number of seconds")
    assert not (tmp_path / "run").exists()
