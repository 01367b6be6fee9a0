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
        [
            sys.executable,
            str(SCRIPT),
            "--size",
            "tiny",
            "--shapes",
            "rte",
            "--batchings",
            "length",
            "--batches",
            "1",
            "--repeats",
            "1",
            "--settle",
            "0",
            "--variants",
            "ours",
            "--precisions",
            "fp32",
            "--profile",
            "--profile-shapes",
            "--profile-rows",
            "5",
            "--default-malloc",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--- profile: ours fp32 ---" in out.stdout and "ours/HF" not in out.stdout
    products = [line.split() for line in out.stdout.splitlines() if line.startswith("  aten::")]
    assert len(products) == 5 and products[0][5] == "GFLOP/s" and float(products[0][4]) > 0, out.stdout


def test_a_products_flops_come_from_its_recorded_shapes() -> None:
    """``--profile-shapes``' rates: the added input of addmm and baddbmm is not an operand of the product."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("finetune_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    flops = module._product_flops
    assert flops("aten::mm", [[1682, 40512], [40512, 768]]) == 2 * 1682 * 40512 * 768
    assert flops("aten::addmm", [[3072], [1714, 768], [768, 3072], [], []]) == 2 * 1714 * 768 * 3072
    assert flops("aten::bmm", [[384, 66, 66], [384, 66, 64]]) == 2 * 384 * 66 * 66 * 64
    assert flops("aten::baddbmm", [[384, 66, 66], [384, 66, 64], [384, 64, 66], [], []]) == 2 * 384 * 66 * 64 * 66
    assert flops("aten::mm", [[7], []]) == 0.0
