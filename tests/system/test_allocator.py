"""gptcli/system/allocator.py: CPU training keeps glibc's freed blocks mapped instead of page-faulting them in every
step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gptcli.system.allocator import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc only")

# A child process: optionally configure the CPU backends as a training run does, then run a few rounds of what a
# step does to memory (64 MB tensors made, computed on and freed) and count the minor page faults of the last rounds
# (the first ones still lay the heap out).
_CHILD = """
import json, resource, sys, torch
from gptcli.system.allocator import keep_freed_memory
from gptcli.system.runtime import configure_backends
if sys.argv[1] == "configure":
    configure_backends(torch.device("cpu"))
set_to = keep_freed_memory()
def round_():
    x = torch.ones(16 * 2**20)  # 64 MB each
    y = x * 2
    del x, y
for _ in range(20):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    round_()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "set": set_to}))
"""


def _child(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GPT1_DEFAULT_MALLOC")}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cpu_training_run_reuses_freed_memory_without_page_faults():
    pages = 5 * 2 * 64 * 2**20 // 4096  # what five rounds fault in when every round maps fresh memory
    kept = _child("configure")
    assert kept["set"] is not None
    assert kept["faults"] < pages // 5  # fewer than two of the ten 64 MB tensors mapped afresh
    default = _child("configure", GPT1_DEFAULT_MALLOC="1")
    assert default["set"] is None
    assert default["faults"] > pages // 2  # the test's premise: glibc's default does fault them in again


def test_the_users_own_malloc_setting_wins():
    assert _child("plain", GLIBC_TUNABLES="glibc.malloc.arena_max=2")["set"] is None
    assert _child("plain", GPT1_DEFAULT_MALLOC="1")["set"] is None
    assert _child("plain", GLIBC_TUNABLES="glibc.rtld.nns=4")["set"] is not None
