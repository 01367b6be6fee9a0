"""benchmarks/finetune_throughput.py runs as its documentation says, on the real RTE file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "finetune_throughput.py"


@pytest.mark.slow
def test_profile_runs_for_a_shape_without_shared_prefixes(shared_data: Path) -> None:
    """``--profile`` on RTE (single-sequence examples: no shared-prefix layout to profile) printed its tables for
    every variant that ran; it used to fail indexing the absent shared-prefix batches."""
    env = {**os.environ, "GPT1_SHARED": str(shared_data.parent)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "tiny", "--shapes", "rte", "--batchings", "length", "--batches", "1",
         "--repeats", "1", "--settle", "0", "--variants", "ours", "--precisions", "fp32", "--profile",
         "--default-malloc", "--threads", "1"],
        capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--- profile: ours fp32 ---" in out.stdout and "ours/HF" not in out.stdout
