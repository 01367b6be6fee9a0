"""The tied output layer (gptcli/model/tied.py) and its padded CPU product (gptcli/model/kernels/tied.py)."""

from __future__ import annotations

import torch
from kernel_helpers import applied

from gptcli.model import kernels
from gptcli.model.losses import next_token_nll


def test_padded_output_product_gives_the_same_logits_and_gradients(monkeypatch):
    """The fp32 CPU output layer pads the embedding for large batches: same values, same gradients, only the memory
    layout differs."""
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.model.kernels import set_kernels
    from gptcli.model.kernels import tied as padding

    set_kernels("auto")
    kernels.force_amx(False)  # fp32 pads on CPUs without AMX
    model = applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)))
    ids = torch.randint(0, 101, (4, 16))
    results = []
    for min_positions in (10**9, 8):  # never padded, then padded
        monkeypatch.setattr(padding, "PAD_MIN_POSITIONS", min_positions)
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


def test_training_loss_through_the_padded_product_is_the_plain_one(monkeypatch):
    """``lm_nll`` pads the product in fp32 and under bf16 autocast and hands the padded logits to the loss whole:
    the same loss and embedding gradient as the plain product and loss."""
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.model.kernels import set_kernels
    from gptcli.model.kernels import tied as padding

    set_kernels("auto")
    kernels.force_amx(False)  # fp32 pads on CPUs without AMX
    torch.manual_seed(0)
    model = applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)).eval())
    ids = torch.randint(0, 101, (4, 16))
    seen = []
    real = model.tied.nll

    def spy(*args, **kwargs):
        seen.append(kwargs.get("classes"))
        return real(*args, **kwargs)

    monkeypatch.setattr(model.tied, "nll", spy)
    monkeypatch.setattr(padding, "PAD_MIN_POSITIONS", 8)
    rule = padding.padding_is_faster
    for autocast in (False, True):
        results = []
        for pads in (False, True):  # plain, then padded
            monkeypatch.setattr(padding, "padding_is_faster", rule if pads else lambda *a, **k: False)
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model.lm_nll(model(ids[:, :-1]), ids[:, 1:])
            loss.backward()
            results.append((loss.detach(), model.tok_emb.weight.grad.clone()))
        torch.testing.assert_close(results[1][0], results[0][0])
        torch.testing.assert_close(results[1][1], results[0][1])
    assert seen == [None, 101, None, 101]  # the padded product really ran, in both precisions


def test_the_amx_padded_product_gives_the_plain_bf16_loss_and_gradients(monkeypatch):
    """Under bf16 autocast on an AMX CPU the training loss takes ``_AmxPaddedProduct`` (logits in column blocks, the
    weight gradient from a transposed copy of the hidden states): the loss and every gradient of the plain bf16
    product, and it really ran."""
    from gptcli.model import kernels
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.model.kernels import tied as padding

    kernels.set_kernels("auto")
    monkeypatch.setattr(padding, "PAD_MIN_POSITIONS", 8)
    monkeypatch.setattr(padding, "AMX_COLUMNS", 48)  # 101 rows padded to 128: three column blocks
    calls = []
    real = padding._AmxPaddedProduct.forward
    monkeypatch.setattr(padding._AmxPaddedProduct, "forward", staticmethod(lambda *a: calls.append(1) or real(*a)))
    torch.manual_seed(0)
    model = applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=32, n_layer=1, n_head=2, n_inner=64)).eval())
    ids = torch.randint(0, 101, (4, 16))
    results = []
    for amx in (False, True):
        kernels.force_amx(amx)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.lm_nll(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert len(calls) == 1
    (ref_loss, ref_grads), (loss, grads) = results
    torch.testing.assert_close(loss, ref_loss, atol=1e-3, rtol=1e-3)
    for name, g in grads.items():
        assert g.dtype == torch.float32 and g.is_contiguous(), name
        torch.testing.assert_close(g, ref_grads[name], atol=1e-3, rtol=2e-2, msg=name)


def test_on_an_amx_cpu_fp32_keeps_the_plain_product_and_bf16_training_the_padded_one(monkeypatch):
    """Which product runs is measured per machine (``padding_is_faster``): on an AMX CPU the fp32 plain product was
    the faster one, in training and evaluation; bf16 training keeps its padded AMX product."""
    from gptcli.model.kernels import set_kernels
    from gptcli.model.kernels import tied as padding

    set_kernels("auto")
    monkeypatch.setattr(padding, "PAD_MIN_POSITIONS", 8)
    h, w = torch.randn(4, 16, 16), torch.randn(101, 16)
    for amx, fp32 in ((True, False), (False, True)):
        kernels.force_amx(amx)
        assert padding.padding_is_faster(h, w) is fp32
        assert padding.padding_is_faster(h, w, training=True) is fp32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert padding.padding_is_faster(h, w, training=True)
            assert not padding.padding_is_faster(h, w)


def test_bf16_training_pads_at_any_size_without_amx():
    """Under bf16 autocast the embedding is cast anyway, so without AMX the training product pads at any number of
    positions (fine-tuning's micro-batches of about a thousand); on AMX the padded product keeps its measured bound,
    and fp32 (whose pad is a copy of its own) keeps it everywhere."""
    from gptcli.model.kernels import set_kernels
    from gptcli.model.kernels import tied as padding

    set_kernels("auto")
    h, w = torch.randn(4, 16, 16), torch.randn(101, 16)  # 64 positions, under PAD_MIN_POSITIONS
    for amx in (False, True):
        kernels.force_amx(amx)
        assert not padding.padding_is_faster(h, w, training=True)  # fp32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert padding.padding_is_faster(h, w, training=True) is not amx
            assert not padding.padding_is_faster(h, w)  # evaluation: autocast's plain product


def test_fine_tunings_auxiliary_loss_takes_the_amx_padded_product_under_bf16(monkeypatch):
    """``lm_token_nll`` (the per-token loss of fine-tuning's auxiliary LM objective) under bf16 autocast takes the
    padded product — the AMX one on an AMX CPU, the linked padded bf16 product without AMX — with the plain bf16
    product's per-token losses and gradients."""
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.model.kernels import tied as padding

    kernels.set_kernels("auto")
    monkeypatch.setattr(padding, "PAD_MIN_POSITIONS", 8)
    monkeypatch.setattr(padding, "AMX_COLUMNS", 48)
    calls, seen = [], []
    torch.manual_seed(0)
    model = applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=32, n_layer=1, n_head=2, n_inner=64)).eval())
    real, real_nll, rule = padding._AmxPaddedProduct.forward, model.tied.nll, padding.padding_is_faster
    monkeypatch.setattr(padding._AmxPaddedProduct, "forward", staticmethod(lambda *a: calls.append(1) or real(*a)))
    monkeypatch.setattr(model.tied, "nll", lambda *a, **k: seen.append(k.get("classes")) or real_nll(*a, **k))
    ids = torch.randint(0, 101, (4, 16))
    targets = ids[:, 1:].clone()
    targets[0, -3:] = -100  # ignored positions lose nothing
    results = []
    for amx, pads in ((False, False), (False, True), (True, True)):  # the plain product first: the reference
        kernels.force_amx(amx)
        monkeypatch.setattr(padding, "padding_is_faster", rule if pads else lambda *a, **k: False)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            nll = model.lm_token_nll(model(ids[:, :-1]), targets)
        nll.sum().backward()
        results.append((nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert len(calls) == 1 and seen == [None, 101, 101]  # the padded products really ran, the AMX one once
    (ref_nll, ref_grads), *padded = results
    for nll, grads in padded:
        assert nll.shape == (targets.numel(),) and (nll.view_as(targets)[0, -3:] == 0).all()  # one per target
        torch.testing.assert_close(nll, ref_nll, atol=1e-3, rtol=1e-3)
        for name, g in grads.items():
            assert g.dtype == torch.float32 and g.is_contiguous(), name
            torch.testing.assert_close(g, ref_grads[name], atol=1e-3, rtol=2e-2, msg=name)


def test_a_device_named_in_padded_head_devices_trains_on_the_padded_product(monkeypatch):
    """``PADDED_HEAD_DEVICES`` (for CUDA, where the CPU kernels are off): ``lm_nll`` and ``lm_token_nll`` take the
    product against the padded embedding, in fp32 and under bf16 autocast, with the plain losses and gradients;
    the padded logits reach the loss with ``classes``. Run here on CPU with the kernels off, as CUDA runs."""
    from gptcli.model import tied
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.model.kernels import set_kernels

    set_kernels("reference")
    try:
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)).eval()
        ids = torch.randint(0, 101, (4, 16))
        seen = []
        real = tied.next_token_nll

        def spy(logits, *args, **kwargs):
            seen.append((logits.size(-1), kwargs.get("classes")))
            return real(logits, *args, **kwargs)

        monkeypatch.setattr(tied, "next_token_nll", spy)
        for autocast in (False, True):
            for loss_of in (lambda h, t: model.lm_nll(h, t), lambda h, t: model.lm_token_nll(h, t).sum()):
                results = []
                for devices in ((), ("cpu",)):  # plain, then padded
                    monkeypatch.setattr(tied, "PADDED_HEAD_DEVICES", devices)
                    model.zero_grad()
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                        loss = loss_of(model(ids[:, :-1]), ids[:, 1:])
                    loss.backward()
                    results.append((loss.detach(), model.tok_emb.weight.grad.clone()))
                torch.testing.assert_close(results[1][0], results[0][0])
                torch.testing.assert_close(results[1][1], results[0][1])
    finally:
        set_kernels("auto")
    assert seen == [(101, None), (128, 101)] * 4  # the padded product really ran: 101 rows padded to 128
