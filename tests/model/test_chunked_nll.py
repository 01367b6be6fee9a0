"""The output layer and loss over blocks of rows (gptcli/model/chunked_nll.py): the value and gradients of the
plain ``F.cross_entropy(F.linear(h, w))``, whatever the blocks, the ignored targets, the padding and the dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import applied

from gptcli.model import chunked_nll as chunked
from gptcli.model.losses import IGNORE


def _reference(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w).float().reshape(-1, w.size(0)), targets.reshape(-1), ignore_index=IGNORE)


def _loss_and_grads(loss_of, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, autocast: bool = False):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_of(h, w, targets)
    (2.5 * loss).backward()  # an incoming gradient other than 1 reaches both
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("rows, chunk", [(37, 8), (37, 37), (37, 100), (64, 16)])
@pytest.mark.parametrize("vocab", [101, 128])  # padded to 128, and already aligned
def test_fp32_blocks_give_the_plain_loss_and_gradients(rows, chunk, vocab):
    torch.manual_seed(0)
    h, w = torch.randn(rows, 24), torch.randn(vocab, 24) * 0.3
    targets = torch.randint(0, vocab, (rows,))
    targets[::5] = IGNORE  # ignored targets count neither in the mean nor in the gradients
    ref = _loss_and_grads(_reference, h, w, targets)
    got = _loss_and_grads(lambda h, w, t: chunked.chunked_nll(h, w, t, chunk_rows=chunk), h, w, targets.int())
    for name, a, b in zip(("loss", "h", "w"), got, ref):  # int32 targets too (gather wants int64)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_batched_hidden_states_and_all_targets_ignored():
    """``h`` of shape (batch, positions, width) as the model gives it; a batch with no counted target gives nan, as
    ``F.cross_entropy``'s mean over nothing does (a run's non-finite watch stops there either way)."""
    torch.manual_seed(1)
    h, w = torch.randn(3, 10, 16), torch.randn(50, 16)
    targets = torch.randint(0, 50, (3, 10))
    got = _loss_and_grads(lambda h, w, t: chunked.chunked_nll(h, w, t, chunk_rows=7), h, w, targets)
    ref = _loss_and_grads(_reference, h, w, targets)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    none = torch.full((3, 10), IGNORE)
    assert _reference(h, w, none).isnan() and chunked.chunked_nll(h, w, none).isnan()


def test_bf16_autocast_computes_as_autocast_would():
    """Under bf16 autocast the products take bf16 operands (as autocast's ``F.linear``), the softmax fp32, and the
    gradients come back in the inputs' dtypes: within bf16 rounding of the plain loss under the same autocast."""
    torch.manual_seed(2)
    h, w = torch.randn(96, 32), torch.randn(101, 32) * 0.3
    targets = torch.randint(0, 101, (96,))
    ref = _loss_and_grads(_reference, h, w, targets, autocast=True)
    got = _loss_and_grads(lambda h, w, t: chunked.chunked_nll(h, w, t, chunk_rows=40), h, w, targets, autocast=True)
    for name, a, b in zip(("loss", "h", "w"), got, ref):
        assert a.dtype == b.dtype == torch.float32, name
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3, msg=name)


def test_compiled_as_pretrain_compile_does():
    """Under ``torch.compile`` (aot_eager here: the graph inductor would get) the same loss and gradients, in one
    graph: the blocks are a Python loop over static sizes."""
    import torch._dynamo

    torch.manual_seed(3)
    h, w = torch.randn(40, 16), torch.randn(70, 16)
    targets = torch.randint(0, 70, (40,))
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda h, w, t: chunked.chunked_nll(h, w, t, chunk_rows=16), backend="aot_eager", fullgraph=True
    )
    got = _loss_and_grads(compiled, h, w, targets)
    ref = _loss_and_grads(_reference, h, w, targets)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_a_device_named_in_chunked_loss_devices_trains_through_it(monkeypatch):
    """``lm_nll`` on a named device (CPU here, with the kernels off, as CUDA runs) takes the blocks in training, with
    the plain loss and the model's gradients, in fp32 and bf16; without gradients (validation) the plain loss."""
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.model.kernels import set_kernels

    calls = []
    real = chunked._ChunkedNLL.apply
    monkeypatch.setattr(chunked._ChunkedNLL, "apply", lambda *a: calls.append(1) or real(*a))
    set_kernels("reference")
    try:
        torch.manual_seed(0)
        model = applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)).eval())
        ids = torch.randint(0, 101, (4, 16))
        for autocast, tol in ((False, {}), (True, {"rtol": 2e-2, "atol": 2e-3})):
            results = []
            for devices in ((), ("cpu",)):
                monkeypatch.setattr(chunked, "CHUNKED_LOSS_DEVICES", devices)
                model.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = model.lm_nll(model(ids[:, :-1]), ids[:, 1:])
                loss.backward()
                results.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
            for a, b in zip(results[1], results[0]):
                torch.testing.assert_close(a, b, **tol)
        assert len(calls) == 2  # the named device's two training losses, not the plain ones
        with torch.no_grad():
            model.lm_nll(model(ids[:, :-1]), ids[:, 1:])
        assert len(calls) == 2  # validation: the plain loss
    finally:
        set_kernels("auto")


def test_fp16_takes_the_plain_loss(monkeypatch):
    """Under fp16 autocast the gradients would be made before a GradScaler's scale (a softmax gradient of 1e-9 is
    below fp16's range): ``applies`` says no, as it does on an unnamed device and without gradients."""
    monkeypatch.setattr(chunked, "CHUNKED_LOSS_DEVICES", ("cpu",))
    h, w = torch.randn(4, 8, requires_grad=True), torch.randn(10, 8, requires_grad=True)
    assert chunked.applies(h, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert chunked.applies(h, w)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not chunked.applies(h, w)
    assert not chunked.applies(h.half(), w.detach().half())
    with torch.no_grad():
        assert not chunked.applies(h, w)
    monkeypatch.setattr(chunked, "CHUNKED_LOSS_DEVICES", ())
    assert not chunked.applies(h, w)
