"""Device and precision for a run (gptcli/system/runtime.py): resolved in one call, backends configured."""

from __future__ import annotations

import pytest
import torch

from gptcli.errors import GPT1Error
from gptcli.system import runtime


def test_prepare_device_resolves_the_device_and_precision_and_configures_the_backends(monkeypatch):
    configured = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: configured.append("cpu"))
    assert runtime.prepare_device("cpu", "fp32") == (torch.device("cpu"), "fp32")
    assert configured == ["cpu"]


def test_prepare_device_takes_a_workers_own_device_over_the_named_one():
    """A worker of a job computes on the device its launcher gave it (``cuda:LOCAL_RANK``), whatever ``--device``
    names: here a "cuda" that this machine may not have is never resolved."""
    device, precision = runtime.prepare_device("cuda", "fp32", given=torch.device("cpu"))
    assert device == torch.device("cpu") and precision == "fp32"


def test_prepare_device_refuses_what_the_device_cannot_run():
    with pytest.raises(GPT1Error, match="fp16 needs a CUDA device"):
        runtime.prepare_device("cpu", "fp16")
    with pytest.raises(GPT1Error, match="--device: expected auto, cpu or cuda"):
        runtime.prepare_device("tpu", "fp32")
