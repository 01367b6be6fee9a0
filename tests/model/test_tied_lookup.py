"""The token lookup's gradient added into the tied output layer's (gptcli/model/kernels/tied_lookup.py): the
reference's gradients, without the vocabulary-sized lookup gradient, and the plain one wherever the link cannot
apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import applied
from torch.profiler import ProfilerActivity, profile

from gptcli.model import kernels
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.kernels import tied as padding
from gptcli.model.kernels.tied_lookup import Link

DENSE = "aten::embedding_dense_backward"


def _model() -> GPT:
    torch.manual_seed(0)
    return applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=32, n_layer=1, n_head=2, n_inner=64)).eval())


def _grads(model: GPT, mode: str, run) -> tuple[dict[str, torch.Tensor], int]:
    """Every parameter's gradient after ``run(model)`` (which calls backward) in kernel ``mode``, and how many dense
    lookup gradients it computed (the position embedding's is one)."""
    kernels.set_kernels(mode)
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(model)
    dense = sum(e.count for e in prof.key_averages() if e.key == DENSE)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, dense


def _lm_loss(model: GPT, ids: torch.Tensor) -> None:
    model.lm_nll(model(ids[:, :-1]), ids[:, 1:]).backward()


# (forced AMX flag, PAD_MIN_POSITIONS, autocast): the plain fp32 product, the padded fp32 one (no AMX), the AMX
# padded bf16 one, the bf16 product padded without AMX (at any size), and the plain bf16 one (AMX under its bound).
PATHS = {
    "fp32 plain": (True, 10**9, False),
    "fp32 padded": (False, 8, False),
    "bf16 amx": (True, 8, True),
    "bf16 padded": (False, 10**9, True),
    "bf16 plain": (True, 10**9, True),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_linked_lookup_gives_the_reference_gradients_without_a_vocabulary_sized_one(monkeypatch, path):
    amx, min_positions, bf16 = PATHS[path]
    kernels.force_amx(amx)
    monkeypatch.setattr(padding, "PAD_MIN_POSITIONS", min_positions)
    model, ids = _model(), torch.randint(0, 101, (4, 16))
    ids[:, :4] = 7  # a token looked up many times: its rows are summed

    def run(m):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _lm_loss(m, ids)

    ref, ref_ops = _grads(model, "reference", run)
    got, ops = _grads(model, "auto", run)
    assert (ref_ops, ops) == (2, 1)  # the token lookup's was not computed: the link was taken
    for name, g in ref.items():
        tol = {"atol": 1e-3, "rtol": 2e-2} if bf16 else {"atol": 1e-6, "rtol": 1e-5}
        torch.testing.assert_close(got[name], g, msg=name, **tol)


def test_accumulated_micro_batches_and_a_second_use_of_the_output_layer():
    """Two backward passes into the same gradients (gradient accumulation), the second through two uses of the
    output layer in one graph: the reference's sums."""
    kernels.force_amx(True)
    model, ids = _model(), torch.randint(0, 101, (2, 4, 16))

    def run(m):
        _lm_loss(m, ids[0])
        h = m(ids[1, :, :-1])
        (m.lm_nll(h, ids[1, :, 1:]) + 0.5 * m.lm_logits(h).square().mean()).backward()

    ref, _ = _grads(model, "reference", run)
    got, ops = _grads(model, "auto", run)
    assert ops == 2  # the position embedding's, once per pass: the second pass added into the first product's
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, atol=1e-6, rtol=1e-5, msg=name)


def test_without_the_output_layer_or_in_another_backward_pass_the_lookup_computes_its_own():
    """A loss without the LM (a classifier's), and an output layer whose backward ran in an earlier pass than the
    lookup's: the link was not offered, or was withdrawn when that pass ended, and the lookup's gradient is the
    reference's dense one."""
    kernels.force_amx(True)
    model, ids = _model(), torch.randint(0, 101, (4, 16))

    def no_lm(m):
        m(ids).square().mean().backward()

    def two_passes(m):
        h = m(ids[:, :-1])
        m.lm_nll(h.detach(), ids[:, 1:]).backward()  # the output layer's gradient, accumulated in this pass
        h.square().mean().backward()  # the lookup's, in the next one

    def weight_used_after(m):  # its gradient reaches autograd's sum first, which then adds the output layer's in
        h = m(ids[:, :-1])
        (m.lm_nll(h, ids[:, 1:]) + 1e-3 * m.tok_emb.weight.square().sum()).backward()

    for run in (no_lm, two_passes, weight_used_after):
        ref, _ = _grads(model, "reference", run)
        got, ops = _grads(model, "auto", run)
        assert ops == 2, run.__name__  # the token lookup's and the position embedding's
        for name, g in ref.items():
            torch.testing.assert_close(got[name], g, atol=1e-6, rtol=1e-5, msg=f"{run.__name__}: {name}")


def test_a_use_of_the_weight_summed_after_the_output_layers_keeps_the_link():
    """A second use of the weight whose gradient autograd adds into the output layer's in place (it arrives
    second): the offered tensor still holds the sum, and the lookup adds into it."""
    kernels.force_amx(True)
    model, ids = _model(), torch.randint(0, 101, (4, 16))

    def run(m):
        penalty = 1e-3 * m.tok_emb.weight.square().sum()  # recorded before the output layer: its backward runs after
        h = m(ids[:, :-1])
        (m.lm_nll(h, ids[:, 1:]) + penalty).backward()

    ref, _ = _grads(model, "reference", run)
    got, ops = _grads(model, "auto", run)
    assert ops == 1
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, atol=1e-6, rtol=1e-5, msg=name)


def test_no_link_without_gradients_or_under_the_reference(monkeypatch):
    model, ids = _model(), torch.randint(0, 101, (2, 8))
    kernels.set_kernels("auto")
    with torch.no_grad():
        model(ids)
    assert model.tied.link is None
    model(ids)
    assert model.tied.link is not None
    kernels.set_kernels("reference")
    model(ids)
    assert model.tied.link is None


@pytest.mark.parametrize("pad", [False, True])
def test_the_bf16_linked_product_is_autocasts_product_bit_for_bit(pad):
    """Without AMX, bf16 training's output layer is :class:`_LinkedProduct` in bf16: the logits and both gradients
    are autocast's ``F.linear`` against the cast (and padded) weight, the weight's gradient cast back to float32."""
    torch.manual_seed(0)
    w = torch.randn(101, 32, requires_grad=True)
    h = torch.randn(3, 40, 32, requires_grad=True)
    grad = torch.randn(3, 40, 128 if pad else 101).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.linear(h, padding.pad_rows(w.to(torch.bfloat16)) if pad else w)
    ref_h, ref_w = torch.autograd.grad(ref, (h, w), grad)
    link = Link()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert padding._linked_dtype(h, w, link) == torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            got = padding._LinkedProduct.apply(h.to(torch.bfloat16), w, link, pad)
    got_h, got_w = torch.autograd.grad(got, (h, w), grad)
    assert got.dtype == torch.bfloat16 and got_w.dtype == torch.float32 and got_w.is_contiguous()
    for a, b in ((got, ref), (got_h, ref_h), (got_w, ref_w)):
        assert torch.equal(a, b)
