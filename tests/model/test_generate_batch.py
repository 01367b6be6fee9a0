"""Batch decoding (N continuations of one prompt as one batch), the faster samplers, and greedy parity with
Hugging Face's ``generate()`` at batch 1 and 8.

Single-prompt decoding is tested in test_generate.py; these tests add what a batch changes."""

from __future__ import annotations

import pytest
import torch

from gptcli.model.build import build_model, preset
from gptcli.model.generate import (
    GenerateConfig,
    SamplingConfig,
    _new_state,
    filter_logits,
    generate,
    generate_batch,
    iter_generate_batch,
    next_token_top_k,
)
from gptcli.model.gpt import GPT, ModelConfig

V = 60
PROMPT = [5, 9, 14, 2]


def tiny(arch: str = "transformer", n_special: int = 3):
    """A small model with weights large enough that greedy output varies along the sequence."""
    torch.manual_seed(4)
    if arch == "transformer":
        m = GPT(ModelConfig(vocab_size=V, n_special=n_special, n_ctx=32, n_embd=32, n_layer=2, n_head=4, n_inner=128))
    else:
        m = build_model(preset("lstm-tiny", vocab_size=V, n_special=n_special, n_ctx=32, n_embd=32, n_hidden=48))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".ln_" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_batch_shapes_and_seed_determinism(arch):
    m = tiny(arch)
    cfg = SamplingConfig(max_new_tokens=12, temperature=2.0, top_k=20, top_p=0.95, seed=7)
    rows = generate_batch(m, PROMPT, cfg, samples=5)
    assert len(rows) == 5 and all(len(r) == 12 for r in rows)
    assert all(0 <= t < V for r in rows for t in r)
    assert rows == generate_batch(m, PROMPT, cfg, samples=5)  # same seed, same samples
    assert len({tuple(r) for r in rows}) > 1  # rows are sampled independently
    assert rows != generate_batch(
        m, PROMPT, SamplingConfig(max_new_tokens=12, temperature=2.0, top_k=20, top_p=0.95, seed=8), samples=5
    )
    full = SamplingConfig(max_new_tokens=12, temperature=2.0, seed=7)  # no top-k: the full-vocabulary sampler
    assert generate_batch(m, PROMPT, full, samples=3) == generate_batch(m, PROMPT, full, samples=3)


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_greedy_rows_equal_the_single_run_and_the_uncached_reference(arch):
    m = tiny(arch)
    single = generate(m, PROMPT, SamplingConfig(max_new_tokens=20, greedy=True))
    rows = generate_batch(m, PROMPT, SamplingConfig(max_new_tokens=20, greedy=True), samples=4)
    assert rows[0] == single and all(r == single for r in rows) and len(set(single)) > 1
    uncached = generate_batch(m, PROMPT, SamplingConfig(max_new_tokens=20, greedy=True, use_cache=False), samples=4)
    assert uncached == rows
    sampled = SamplingConfig(max_new_tokens=10, top_k=30, seed=3)
    assert generate_batch(m, PROMPT, sampled, samples=3) == generate_batch(
        m, PROMPT, SamplingConfig(max_new_tokens=10, top_k=30, seed=3, use_cache=False), samples=3
    )


def test_batch_of_one_is_the_single_prompt_path_and_limits_hold():
    m = tiny()
    cfg = SamplingConfig(max_new_tokens=10, top_k=8, top_p=0.9, seed=2)
    assert generate_batch(m, PROMPT, cfg, samples=1) == [generate(m, PROMPT, cfg)]
    steps = list(iter_generate_batch(m, list(range(28)), SamplingConfig(max_new_tokens=50, greedy=True), samples=3))
    assert len(steps) == 4 and all(len(s) == 3 for s in steps)  # stops at the 32-token context
    assert all(
        t < V - 10
        for r in generate_batch(m, PROMPT, SamplingConfig(max_new_tokens=8, seed=0), samples=4, vocab_limit=V - 10)
        for t in r
    )
    with pytest.raises(ValueError, match="samples"):
        list(iter_generate_batch(m, PROMPT, cfg, samples=0))
    with pytest.raises(ValueError, match="samples"):
        GenerateConfig(samples=0).validate()
    assert not m.training


def _full_sort_filter(logits, top_k, top_p):
    """filter_logits as it was written before the top-k shortcut: sort the whole row."""
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))


def test_top_k_then_top_p_equals_the_full_sort():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(3, 500, generator=g) * 3
        for k, p in ((40, 0.9), (5, 0.5), (100, 0.99)):
            assert torch.equal(filter_logits(logits, top_k=k, top_p=p), _full_sort_filter(logits, k, p))
    tied = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])  # ties at the k-th value: all of them survive top-k
    assert torch.isfinite(filter_logits(tied, top_k=2)).tolist() == [[True, True, True, True, False, False]]
    assert torch.equal(filter_logits(tied, top_k=2, top_p=0.99), _full_sort_filter(tied, 2, 0.99))


def test_top_k_sampler_draws_from_the_filtered_distribution():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 200, generator=g) * 2
    cfg = SamplingConfig(top_k=10, top_p=0.8, temperature=0.7)
    want = torch.softmax(filter_logits(logits, 0.7, 10, 0.8), dim=-1)[0]
    draws = next_token_top_k(logits.expand(20000, -1), cfg, torch.Generator().manual_seed(2))
    freq = torch.bincount(draws, minlength=200).float() / draws.numel()
    assert set(draws.tolist()) == set(torch.nonzero(want).flatten().tolist())
    assert (freq - want).abs().max() < 0.015
    tied = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]]).expand(3000, -1)  # falls back: every tied id is drawn
    drawn = next_token_top_k(tied, SamplingConfig(top_k=2), torch.Generator().manual_seed(3))
    assert set(drawn.tolist()) == {0, 1, 2, 3}


def test_decoding_state_is_sized_to_the_run_and_kept_in_the_autocast_dtype():
    m = tiny()
    state = _new_state(m, 10)
    assert state.k[0].shape[2] == 10 and state.k[0].dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _new_state(m, 10).k[0].dtype == torch.bfloat16
        out = generate_batch(m, PROMPT, SamplingConfig(max_new_tokens=6, greedy=True), samples=2)
    assert len(out) == 2 and out[0] == out[1]


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_tokens_equal_transformers_generate(batch):
    """Our KV-cached greedy decoding reproduces ``OpenAIGPTLMHeadModel.generate(do_sample=False)`` on the same
    weights (converted with gptcli.interop.hf), for one row and for eight."""
    transformers = pytest.importorskip("transformers")
    from gptcli.interop.hf import config_to_hf, state_dict_to_hf

    ours = tiny(n_special=0)  # HF's vocabulary would include special rows, which we never emit
    cfg = ours.config
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
    )
    hf = transformers.OpenAIGPTLMHeadModel(hf_cfg).eval()
    hf.load_state_dict(state_dict_to_hf(ours.state_dict(), cfg.n_layer), strict=False)
    n = 16
    rows = generate_batch(ours, PROMPT, SamplingConfig(max_new_tokens=n, greedy=True), samples=batch)
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([PROMPT] * batch), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0
        )[:, len(PROMPT) :].tolist()
    assert rows == theirs and len(set(rows[0])) > 1
