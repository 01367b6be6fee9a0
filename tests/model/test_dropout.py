"""The CPU dropout kernel of gptcli/model/kernels/dropout.py has ``F.dropout``'s law: keep rate, scaling, gradient,
modes; gptcli/model/dropout.py draws it when the kernels are on. ``dropout()`` runs the compiled seeded masks where
the library is built (as in CI; their own law: tests/model/test_native.py), ``keep_mask`` is the Python masks'."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from kernel_helpers import applied

from gptcli.model.gpt import GPT, preset
from gptcli.model.kernels.dropout import dropout, keep_mask
from gptcli.model.kernels.layers import Dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    torch.manual_seed(0)
    n = 1_000_003  # not a multiple of 8: the last 64-bit draw is partly used
    kept = keep_mask((n,), p).sum().item()
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sd


def test_units_are_independent_and_the_bytes_of_a_draw_too():
    torch.manual_seed(1)
    m = keep_mask((250_000, 8), 0.5).float()  # each row: the eight bytes of one 64-bit draw
    for i in range(7):
        both = (m[:, i] * m[:, i + 1]).mean().item()
        assert abs(both - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 250_000)
    assert not torch.equal(keep_mask((1000,), 0.5), keep_mask((1000,), 0.5))


def test_units_whose_byte_ties_the_threshold_are_decided_by_more_bits():
    """p = 0.5 + 2⁻⁹ puts the threshold halfway through byte 128: the keep rate is exactly 1 − p only if the units
    whose byte is 128 (1 in 256) draw further bits; decided by the byte alone it would be 0.5 or 0.49609."""
    torch.manual_seed(2)
    n, p = 4_000_000, 0.5 + 2**-9
    rate = keep_mask((n,), p).float().mean().item()
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # 5 sd = 0.0013, half the byte-only error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_float_mask_is_the_bool_mask(dtype):
    torch.manual_seed(4)
    a = keep_mask((3, 1000), 0.1)
    torch.manual_seed(4)
    b = keep_mask((3, 1000), 0.1, dtype=dtype)
    assert b.dtype == dtype and torch.equal(b, a.to(dtype))


def test_reproducible_under_manual_seed():
    torch.manual_seed(3)
    a = keep_mask((4, 5, 6), 0.1)
    torch.manual_seed(3)
    assert torch.equal(a, keep_mask((4, 5, 6), 0.1))
    assert a.shape == (4, 5, 6) and a.dtype == torch.bool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_are_dropped_or_scaled_and_the_gradient_follows(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 33).to(dtype).requires_grad_()
    y = dropout(x, 0.25)
    kept = y != 0
    assert 0.6 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(y[kept], (x[kept] / 0.75).to(dtype))
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.to(dtype) / 0.75)


def test_identity_when_off_and_f_dropout_edge_cases():
    x = torch.randn(10, 10)
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError):
        dropout(x, 1.5)


def test_module_is_an_nn_dropout_with_its_modes():
    d = Dropout(0.1)
    assert isinstance(d, nn.Dropout) and repr(d) == repr(nn.Dropout(0.1))
    x = torch.randn(1000)
    assert torch.equal(d.eval()(x), x)
    assert (d.train()(x) == 0).any()
    torch.manual_seed(0)
    inplace = Dropout(0.5, inplace=True)(x.clone())
    torch.manual_seed(0)
    torch.testing.assert_close(inplace, F.dropout(x.clone(), 0.5, True, True))


def test_model_uses_it_and_still_matches_its_expectation():
    """GPT's dropouts are this module's, and a training-mode forward averages to the eval forward's scale."""
    model = applied(GPT(preset("tiny", n_layer=1, vocab_size=64, n_ctx=16)))
    assert all(type(m) is Dropout for m in model.modules() if isinstance(m, nn.Dropout))
    torch.manual_seed(0)
    x = torch.randn(200_000)
    assert abs(dropout(x, 0.1).mean().item() - x.mean().item()) < 0.01
