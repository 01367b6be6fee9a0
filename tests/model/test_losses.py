"""The language-model loss of gptcli/model/losses.py and its CPU kernel (gptcli/model/kernels/losses.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptcli.model.kernels import losses
from gptcli.model.losses import IGNORE, lm_loss_per_sequence, next_token_nll


def test_per_sequence_loss_matches_the_direct_computation():
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16)
    ids = torch.randint(0, 50, (3, 7))
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    head = torch.randn(50, 16)
    got = lm_loss_per_sequence(hidden, ids, mask, lambda h: h @ head.T)
    for row in range(3):
        n = int(mask[row].sum())
        want = F.cross_entropy(hidden[row, : n - 1] @ head.T, ids[row, 1:n])
        torch.testing.assert_close(got[row], want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_next_token_nll_is_f_cross_entropy_of_the_fp32_logits(monkeypatch, dtype, reduction):
    """Values and gradients (in the logits' dtype) over several row blocks, ignored targets included."""
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 300)  # 101-wide rows: blocks of 2 rows, the last one short
    torch.manual_seed(0)
    logits = (3 * torch.randn(5, 7, 101)).to(dtype).requires_grad_()
    targets = torch.randint(0, 101, (5, 7))
    targets[1, 2:5] = IGNORE
    weights = torch.rand(35) if reduction == "none" else torch.tensor(1.0)
    if reduction == "none":  # zero and negative upstream gradients: the backward's exp(x − lse + log w) has a fallback
        weights[3], weights[7] = 0.0, -0.5
    got = next_token_nll(logits, targets, reduction=reduction)
    (grad,) = torch.autograd.grad((got * weights).sum(), logits)
    want = F.cross_entropy(logits.reshape(-1, 101).float(), targets.reshape(-1), ignore_index=IGNORE,
                           reduction=reduction)
    (grad_want,) = torch.autograd.grad((want * weights).sum(), logits)
    assert got.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, grad_want)


def test_next_token_nll_edge_cases():
    """A strided view (the padded fp32 product's logits), autocast around it, and all targets ignored (nan, as
    ``F.cross_entropy``)."""
    torch.manual_seed(1)
    wide = torch.randn(6, 12, requires_grad=True)
    targets = torch.tensor([0, 3, 9, IGNORE, 2, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = next_token_nll(wide[:, :10], targets)
    want = F.cross_entropy(wide[:, :10], targets, ignore_index=IGNORE)
    torch.testing.assert_close(got, want)
    (g,) = torch.autograd.grad(got, wide)
    assert not g[:, 10:].any() and not g[3].any()
    assert torch.isnan(next_token_nll(wide[:, :10], torch.full((6,), IGNORE)))
