"""What the compiled CPU kernels' tests share: the built library (or a skip saying why not), and ``--compile``'s
check: a step run through ``torch.compile`` (the eager backend) computes what it computes eagerly, and dynamo never
warns that it cannot trace a call (the kernels' pybind calls are marked ``torch.compiler.disable``, so they run
eagerly between graphs)."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from gptcli.model.kernels import native


def built_library() -> ModuleType:
    """The built library: every machine gpt1's CI runs on has a C++ compiler; elsewhere the test skips, saying why."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the compiled kernels cannot be built here (the reference runs instead)")
    built = native.library()
    assert built is not None, native.unavailable()
    return built


def assert_runs_eagerly_between_graphs(step: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """``step(x)`` (a scalar) under ``torch.compile`` equals it eagerly, with the same seed, and backpropagates to
    ``x`` (a leaf that requires grad), without dynamo's "does not know how to trace" warnings."""
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.manual_seed(0)
            got = torch.compile(step, backend="eager")(x)
            got.backward()
        torch.manual_seed(0)
        torch.testing.assert_close(got.detach(), step(x.detach()))
        assert x.grad is not None and x.grad.abs().sum() > 0
        assert not [w for w in seen if "does not know how to trace" in str(w.message)], [str(w.message) for w in seen]
    finally:
        torch.compiler.reset()
