"""The tied output layer (gptcli/model/tied.py)."""

from __future__ import annotations

import torch

from gptcli.model.losses import next_token_nll


def test_padded_output_product_gives_the_same_logits_and_gradients(monkeypatch):
    """The fp32 CPU output layer pads the embedding for large batches: same values, same gradients, only the memory
    layout differs."""
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
