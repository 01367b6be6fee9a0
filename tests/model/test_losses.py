"""The language-model loss of gptcli/model/losses.py and its CPU kernel (gptcli/model/kernels/losses.py), as a
model with the kernels applied computes it (``TiedKernels.nll``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptcli.model.kernels import losses
from gptcli.model.kernels.layers import TiedKernels
from gptcli.model.losses import IGNORE, lm_loss_per_sequence
from gptcli.model.tied import TiedProducts

next_token_nll = TiedKernels(TiedProducts()).nll
"""The loss of a model with the kernels applied: the kernel's under ``auto`` (the tests' mode), else the reference."""


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


def test_per_sequence_loss_from_positions_counted_on_the_host_is_the_same():
    """The padded batch carries its LM positions (gptcli.data.batching.lm_positions), so that a GPU never waits to
    count them: the same losses and gradients as the mask's own positions, and as the mask-indexed form before."""
    from gptcli.model.losses import lm_positions

    torch.manual_seed(0)
    hidden = torch.randn(4, 9, 16, requires_grad=True)
    ids = torch.randint(0, 50, (4, 9))
    mask = torch.ones(4, 9)
    mask[1, 4:] = 0
    mask[2, 1:] = 0  # one token: no target, loss 0
    head = torch.randn(50, 16)
    positions = lm_positions(mask)
    assert positions.tolist() == [r * 9 + j for r, n in enumerate([9, 4, 1, 9]) for j in range(n - 1)]
    got = lm_loss_per_sequence(hidden, ids, mask, lambda h: h @ head.T, positions)
    (g_got,) = torch.autograd.grad(got.sum(), hidden)
    found = lm_loss_per_sequence(hidden, ids, mask, lambda h: h @ head.T)
    (g_found,) = torch.autograd.grad(found.sum(), hidden)
    m = mask[:, 1:] > 0  # the form before: boolean indexing, whose size a GPU has to report to the host
    rows = torch.arange(4).unsqueeze(1).expand_as(m)[m]
    nll = F.cross_entropy(hidden[:, :-1][m] @ head.T, ids[:, 1:][m], reduction="none")
    before = torch.zeros(4).index_add_(0, rows, nll) / m.sum(1).clamp_min(1)
    (g_before,) = torch.autograd.grad(before.sum(), hidden)
    assert torch.equal(got, found) and torch.equal(g_got, g_found)
    torch.testing.assert_close(got, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(g_got, g_before, rtol=0, atol=1e-6)
    assert got[2] == 0


@pytest.fixture(params=["compiled", "blocks"])
def loss_path(request, monkeypatch) -> str:
    """Both ways the kernel computes: the compiled rows (loss.cpp, where the library is built with AVX-512) and the
    blocks of PyTorch ops (everywhere else)."""
    if request.param == "blocks":
        monkeypatch.setattr(losses, "_compiled", lambda logits: None)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_next_token_nll_is_f_cross_entropy_of_the_fp32_logits(monkeypatch, loss_path, dtype, reduction):
    """Values and gradients (in the logits' dtype) over several row blocks, ignored targets included."""
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 300)  # 101-wide rows: blocks of 2 rows, the last one short
    torch.manual_seed(0)
    logits = (3 * torch.randn(5, 7, 101)).to(dtype).requires_grad_()
    targets = torch.randint(0, 101, (5, 7))
    targets[1, 2:5] = IGNORE
    weights = torch.rand(35) if reduction == "none" else torch.tensor(1.0)
    if reduction == "none":  # zero and negative upstream gradients: the backward's exp(x − lse + log w) has a fallback
        weights[3], weights[7] = 0.0, -0.5
    got = next_token_nll(logits, targets, reduction)
    (grad,) = torch.autograd.grad((got * weights).sum(), logits)
    want = F.cross_entropy(
        logits.reshape(-1, 101).float(), targets.reshape(-1), ignore_index=IGNORE, reduction=reduction
    )
    (grad_want,) = torch.autograd.grad((want * weights).sum(), logits)
    assert got.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, grad_want)


def test_next_token_nll_edge_cases(loss_path):
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_consumed_logits_tensor_takes_its_own_gradient(loss_path, dtype):
    """``consume=True`` (the tied LM's training losses): the backward writes the gradient over the logits, the
    same values as into a new tensor, for contiguous logits and for a column slice of a padded product; a second
    backward through the graph then fails loudly instead of reading gradients as logits."""
    torch.manual_seed(2)
    h = torch.randn(9, 16).to(dtype).requires_grad_()
    w = torch.randn(70, 16).to(dtype)
    targets = torch.randint(0, 60, (9,))
    targets[4] = IGNORE
    for logits_of in (lambda: h @ w.T, lambda: (h @ w.T)[:, :60]):
        grads = []
        for consume in (False, True):
            logits = logits_of()
            loss = next_token_nll(logits, targets, consume=consume)
            grads.append(torch.autograd.grad(loss, logits)[0])
            if consume:
                assert grads[-1].data_ptr() == logits.data_ptr()
        torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    loss = next_token_nll(h @ w.T, targets, consume=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_int32_targets_give_the_int64_targets_loss_and_gradient(loss_path):
    torch.manual_seed(3)
    logits = torch.randn(6, 50, requires_grad=True)
    targets = torch.tensor([1, 7, IGNORE, 49, 0, 3])
    results = []
    for t in (targets, targets.int()):
        loss = next_token_nll(logits, t)
        results.append((loss.detach(), torch.autograd.grad(loss, logits)[0]))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)
