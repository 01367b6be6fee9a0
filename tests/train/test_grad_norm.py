"""The global gradient norm and its clipping (gptcli/train/grad_norm.py) against torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import math

import pytest
import torch

from gptcli.train.grad_norm import CHUNK, clip_grad_norm, grad_norm


def _params(sizes, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params


def _exact(params) -> float:
    return math.sqrt(sum(float(p.grad.double().square().sum()) for p in params))


def test_the_norm_is_exact_to_float64_rounding_whatever_the_sizes():
    """Chunks of 4,096 and their tails, scalars, and one gradient of 20 M elements (where fp32 partial sums
    drift: PyTorch's own fp32 norm was 5·10⁻⁴ off on GPT-1's gradients)."""
    params = _params([1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, 20_000_003], scale=1e-3)
    got = grad_norm(params)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert abs(float(got) - _exact(params)) <= 1e-7 * _exact(params)


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clipping_is_clip_grad_norm_(max_norm):
    """Clipped (max_norm under the norm) and not: the same norm and gradients as PyTorch's, on gradients small
    enough for PyTorch's fp32 norm to be exact too."""
    ours, ref = _params([7, 300, 5000]), _params([7, 300, 5000])
    want = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    got = clip_grad_norm(ours, max_norm)
    torch.testing.assert_close(got, want)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad)


def test_gradients_under_the_threshold_are_left_untouched():
    params = _params([5000, 17])
    before = [p.grad.clone() for p in params]
    clip_grad_norm(params, 1e6)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_norm_is_multiplied_in_as_clip_grad_norm_does(bad):
    ours, ref = _params([10, 20]), _params([10, 20])
    for ps in (ours, ref):
        ps[1].grad[3] = bad
    want = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    got = clip_grad_norm(ours, 1.0)
    assert (got.isnan() and want.isnan()) or (got.isinf() and want.isinf())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, equal_nan=True)


def test_other_dtypes_take_pytorchs_clip(monkeypatch):
    params = [torch.nn.Parameter(torch.zeros(8, dtype=torch.float64))]
    params[0].grad = torch.full((8,), 2.0, dtype=torch.float64)
    called = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: called.append(1) or real(*a, **k))
    norm = clip_grad_norm(params, 1.0)
    assert called and math.isclose(float(norm), math.sqrt(32.0))


def test_under_the_reference_kernels_pytorchs_clip_runs(monkeypatch):
    from gptcli.model.kernels import set_kernels

    set_kernels("reference")
    params = _params([10])
    called = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: called.append(1) or real(*a, **k))
    clip_grad_norm(params, 1.0)
    assert called
