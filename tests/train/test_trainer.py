"""The training step of gptcli/train/trainer.py: gradient accumulation under autocast."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import applied

from gptcli.model.gpt import GPT, ModelConfig
from gptcli.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _casts(fn) -> int:
    """Casts of tensors (``aten::_to_copy`` of at least one dimension: a scalar's cast, as of a loss, is no weight's)
    while ``fn`` runs."""
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        fn()
    return sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::_to_copy" and e.input_shapes and e.input_shapes[0]
    )


def test_bf16_micro_batches_share_one_cast_of_each_weight_and_sum_the_same_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trainer.step casts each weight to bf16 once per update, not once per micro-batch (the casts stay in
    autocast's cache until the update's last backward pass), the tied output layer's padded bf16 copy of the
    embedding too (kernels/casts.py), and accumulates the gradients a loop with one autocast region per
    micro-batch does, bit for bit."""
    from gptcli.model import kernels
    from gptcli.model.kernels import tied

    kernels.force_amx(False)  # the AMX forms: the next test
    padded = []
    real_copy = tied._padded_copy
    monkeypatch.setattr(tied, "_padded_copy", lambda w, dtype: padded.append(1) or real_copy(w, dtype))
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=101,
        n_ctx=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = applied(GPT(cfg).train())  # as a run gives it to the Trainer, which applies them too
    batches = list(torch.randint(0, 101, (3, 2, 17)))

    def loss_fn(m, mb):
        return m.lm_loss(mb[:, :-1], mb[:, 1:])

    def per_micro_batch_regions():
        for mb in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model, mb)
            (loss / len(batches)).backward()

    model.zero_grad(set_to_none=True)
    plain_casts = _casts(per_micro_batch_regions)
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert len(padded) == len(batches)  # the embedding's padded copy, once per micro-batch without the trainer

    captured = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):  # the gradients as the update sees them; the weights stay as they are
            captured.update({n: p.grad.clone() for n, p in model.named_parameters()})

    trainer = Trainer(
        model,
        Capture(model.parameters(), lr=0.0),
        loss_fn,
        lambda step: 0.0,
        device=torch.device("cpu"),
        precision="bf16",
        grad_clip=None,
    )
    model.zero_grad(set_to_none=True)
    shared_casts = _casts(lambda: trainer.step(0, batches))
    weights = sum(1 for n, _ in model.named_parameters() if "ln_" not in n and "emb" not in n)
    assert plain_casts - shared_casts >= (len(batches) - 1) * weights
    assert len(padded) == len(batches) + 1  # and once for the trainer's whole update
    for name, g in plain.items():
        assert torch.equal(captured[name], g), name


def test_the_amx_forms_cast_each_weight_once_per_update_and_sum_the_same_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The AMX forms (kernels/linear.py, kernels/tied.py) cast their weights outside autocast, where its cache does
    not reach: inside Trainer.step each linear weight and the padded embedding are cast once per update
    (kernels/casts.py), not once per micro-batch as a loop of autocast regions does, and the gradients are the
    same bit for bit."""
    from compiled_helpers import built_library

    from gptcli.model import kernels
    from gptcli.model.kernels import linear, tied

    if built_library().vector_isa() != "avx512":
        pytest.skip("the library here is not built with AVX-512: the AMX forms never run")
    kernels.force_amx(True)
    made = {"linear": 0, "head": 0}

    def counted(kind, make):
        def wrapper(*args):
            made[kind] += 1
            return make(*args)

        return wrapper

    monkeypatch.setattr(linear, "_bf16", counted("linear", linear._bf16))
    monkeypatch.setattr(tied, "_padded_copy", counted("head", tied._padded_copy))
    torch.manual_seed(0)
    # 4 × 256 positions per micro-batch: enough for the AMX linear form (256) and the padded head (1,024).
    cfg = ModelConfig(
        vocab_size=101,
        n_ctx=256,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = applied(GPT(cfg).train())
    batches = list(torch.randint(0, 101, (3, 4, 257)))
    n_linear = 4 * cfg.n_layer

    def loss_fn(m, mb):
        return m.lm_loss(mb[:, :-1], mb[:, 1:])

    model.zero_grad(set_to_none=True)
    for mb in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model, mb)
        (loss / len(batches)).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert made == {"linear": len(batches) * n_linear, "head": len(batches)}  # the AMX forms ran, once each

    captured = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            captured.update({n: p.grad.clone() for n, p in model.named_parameters()})

    trainer = Trainer(
        model,
        Capture(model.parameters(), lr=0.0),
        loss_fn,
        lambda step: 0.0,
        device=torch.device("cpu"),
        precision="bf16",
        grad_clip=None,
    )
    made.update(linear=0, head=0)
    model.zero_grad(set_to_none=True)
    trainer.step(0, batches)
    assert made == {"linear": n_linear, "head": 1}
    for name, g in plain.items():
        assert torch.equal(captured[name], g), name
