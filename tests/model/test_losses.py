"""The chunked CPU cross-entropy (gptcli/model/losses.py) against ``F.cross_entropy`` of the fp32 logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptcli.model import losses
from gptcli.model.losses import IGNORE, lm_loss_per_sequence, next_token_nll


def _case(dtype: torch.dtype, rows: int = 37, vocab: int = 301, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[::5] = IGNORE
    return logits, targets


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # Several rows per chunk and a ragged last chunk, as at full size.
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 301 * 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_value_and_gradient_match_cross_entropy(dtype, reduction):
    logits, targets = _case(dtype)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = next_token_nll(ours_in, targets, reduction=reduction)
    ref = F.cross_entropy(ref_in.float(), targets, ignore_index=IGNORE, reduction=reduction)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    weights = torch.rand(ref.shape) if reduction == "none" else torch.tensor(1.7)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    assert ours_in.grad.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-5}
    torch.testing.assert_close(ours_in.grad, ref_in.grad, **tol)
    assert ours_in.grad[::5].abs().max() == 0  # ignored rows get no gradient


def test_leaves_fp32_logits_untouched_and_accepts_batched_shapes():
    logits, targets = _case(torch.float32, rows=24)
    before = logits.clone()
    x = logits.view(4, 6, -1).requires_grad_()
    next_token_nll(x, targets.view(4, 6)).backward()
    assert torch.equal(logits, before)
    assert x.grad.shape == (4, 6, 301)


def test_ignored_rows_with_non_finite_logits_do_not_poison_the_loss():
    logits, targets = _case(torch.float32)
    logits[0] = float("inf")  # row 0 is ignored (targets[::5])
    loss = next_token_nll(logits, targets)
    assert torch.isfinite(loss)


def test_no_rows_and_all_ignored_behave_as_cross_entropy():
    empty = torch.zeros(0, 11, requires_grad=True)
    assert next_token_nll(empty, torch.zeros(0, dtype=torch.long), reduction="sum").item() == 0.0
    logits, targets = _case(torch.float32, rows=3)
    targets[:] = IGNORE
    assert torch.isnan(next_token_nll(logits, targets)) and torch.isnan(
        F.cross_entropy(logits, targets, ignore_index=IGNORE))
    with pytest.raises(ValueError, match="reduction"):
        next_token_nll(logits, targets, reduction="max")


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


def test_padded_output_product_gives_the_same_logits_and_gradients(monkeypatch):
    """The fp32 CPU output layer pads the embedding for large batches (gptcli/model/tied.py): same values, same
    gradients, only the memory layout differs."""
    from gptcli.model import tied
    from gptcli.model.gpt import GPT, ModelConfig

    model = GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32))
    ids = torch.randint(0, 101, (4, 16))
    results = []
    for min_positions in (10**9, 8):  # never padded, then padded
        monkeypatch.setattr(tied, "PAD_MIN_POSITIONS", min_positions)
        model.zero_grad()
        h = model.eval()(ids)
        logits = model.lm_logits(h)
        next_token_nll(logits[:, :-1], ids[:, 1:]).backward()
        results.append((logits.detach(), model.tok_emb.weight.grad.clone(), logits.is_contiguous()))
    (plain, g_plain, contiguous), (padded, g_padded, padded_contiguous) = results
    assert contiguous and not padded_contiguous  # the padded product really ran
    assert padded.shape == plain.shape == (4, 16, 101)
    torch.testing.assert_close(padded, plain)
    torch.testing.assert_close(g_padded, g_plain)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.lm_logits(h).is_contiguous()  # bf16: measured no gain, not padded
