"""Sampling: KV cache parity, greedy/top-k/top-p/temperature, special rows never emitted, context limit, CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from error_lines import gpt1

from gptcli.checkpoint import save_checkpoint
from gptcli.model.generate import SamplingConfig, filter_logits, generate, iter_generate
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.tokenizers.openai import OpenAIBPETokenizer


def tiny_tokenizer() -> OpenAIBPETokenizer:
    """A 60-entry BPE in the original format (needs no ../shared data); same as in test_convert."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = [
        "<unk>",
        *letters,
        *(c + "</w>" for c in letters),
        ".</w>",
        ",</w>",
        "\n</w>",
        "th",
        "the</w>",
        "an",
        "and</w>",
    ]
    merges = [("t", "h"), ("th", "e</w>"), ("a", "n"), ("an", "d</w>")]
    return OpenAIBPETokenizer({t: i for i, t in enumerate(vocab)}, merges)


V = 60  # tiny_tokenizer's vocabulary


def tiny_model(n_ctx: int = 32, n_special: int = 3) -> GPT:
    torch.manual_seed(4)
    m = GPT(ModelConfig(vocab_size=V, n_special=n_special, n_ctx=n_ctx, n_embd=32, n_layer=2, n_head=4, n_inner=128))
    with torch.no_grad():  # larger weights than the N(0, 0.02) init: greedy output then varies along the sequence
        for name, p in m.named_parameters():
            if ".ln_" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


PROMPT = [5, 9, 14, 2]


def naive_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model.lm_logits(model(torch.tensor([seq])))[0, -1, :V]
            seq.append(int(logits.argmax()))
    return seq[len(prompt) :]


def test_greedy_with_cache_equals_without() -> None:
    m = tiny_model()
    cached = generate(m, PROMPT, SamplingConfig(max_new_tokens=20, greedy=True))
    uncached = generate(m, PROMPT, SamplingConfig(max_new_tokens=20, greedy=True, use_cache=False))
    assert cached == uncached == naive_greedy(m, PROMPT, 20)
    assert len(set(cached)) > 1


def test_top_k_1_and_tiny_temperature_are_greedy() -> None:
    m = tiny_model()
    greedy = generate(m, PROMPT, SamplingConfig(max_new_tokens=15, greedy=True))
    assert generate(m, PROMPT, SamplingConfig(max_new_tokens=15, top_k=1, seed=1)) == greedy
    assert generate(m, PROMPT, SamplingConfig(max_new_tokens=15, temperature=1e-4, seed=2)) == greedy
    assert generate(m, PROMPT, SamplingConfig(max_new_tokens=15, top_p=1e-6, seed=3)) == greedy


def test_seed_reproducibility_and_cache_parity_when_sampling() -> None:
    m = tiny_model()
    cfg = SamplingConfig(max_new_tokens=25, temperature=2.0, seed=123)
    a = generate(m, PROMPT, cfg)
    assert a == generate(m, PROMPT, cfg)
    assert a == generate(m, PROMPT, SamplingConfig(max_new_tokens=25, temperature=2.0, seed=123, use_cache=False))
    assert a != generate(m, PROMPT, SamplingConfig(max_new_tokens=25, temperature=2.0, seed=124))


def test_filter_logits_top_k_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda x: torch.isfinite(x)[0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [True, True, False, False, False]
    assert kept(filter_logits(logits, top_p=0.5)) == [True, False, False, False, False]
    assert kept(filter_logits(logits, top_p=0.6)) == [True, True, False, False, False]
    assert kept(filter_logits(logits, top_p=0.86)) == [True, True, True, True, False]
    assert kept(filter_logits(logits, top_k=3, top_p=0.99)) == [True, True, True, False, False]
    t = filter_logits(logits, temperature=2.0)
    assert torch.allclose(t, logits / 2)


def test_top_k_restricts_samples() -> None:
    m = tiny_model()
    with torch.no_grad():
        first = m.lm_logits(m(torch.tensor([PROMPT])))[0, -1, :V]
    top3 = set(torch.topk(first, 3).indices.tolist())
    seen = {
        generate(m, PROMPT, SamplingConfig(max_new_tokens=1, top_k=3, temperature=5.0, seed=s))[0] for s in range(40)
    }
    assert seen <= top3 and len(seen) > 1


def test_special_rows_are_never_emitted(monkeypatch) -> None:
    m = tiny_model()
    real = m.lm_logits

    def rigged(h):  # make the special rows (and the last vocabulary ids) overwhelmingly likely
        out = real(h).clone()
        out[..., V - 5 :] += 1e4
        return out

    monkeypatch.setattr(m, "lm_logits", rigged)
    for cfg in (SamplingConfig(max_new_tokens=10, greedy=True), SamplingConfig(max_new_tokens=10, seed=0)):
        ids = generate(m, PROMPT, cfg)
        assert all(i < V for i in ids) and set(ids) <= set(range(V - 5, V))
    limited = generate(m, PROMPT, SamplingConfig(max_new_tokens=10, seed=0), vocab_limit=V - 5)
    assert all(i < V - 5 for i in limited)


def test_stops_at_context_limit() -> None:
    m = tiny_model(n_ctx=12)
    assert len(generate(m, PROMPT, SamplingConfig(max_new_tokens=100, greedy=True))) == 12 - len(PROMPT)
    assert generate(m, list(range(12)), SamplingConfig(max_new_tokens=5, greedy=True)) == []
    with pytest.raises(ValueError, match="context"):
        generate(m, list(range(13)), SamplingConfig(greedy=True))
    with pytest.raises(ValueError, match="empty"):
        generate(m, [], SamplingConfig(greedy=True))
    with pytest.raises(ValueError, match="temperature"):
        generate(m, PROMPT, SamplingConfig(temperature=0.0))


def test_streaming_callback_sees_every_token_in_order() -> None:
    m = tiny_model()
    seen: list[int] = []
    out = generate(m, PROMPT, SamplingConfig(max_new_tokens=8, seed=5), on_token=seen.append)
    assert seen == out and len(out) == 8


def test_iter_generate_yields_what_generate_returns_one_at_a_time() -> None:
    m = tiny_model()
    cfg = SamplingConfig(max_new_tokens=8, top_k=5, seed=3)
    it = iter_generate(m, PROMPT, cfg)
    first = next(it)  # a generator: the first id comes before the rest are computed
    assert [first, *it] == generate(m, PROMPT, cfg)
    bad = iter_generate(m, [], cfg)  # checked when the first id is asked for
    with pytest.raises(ValueError, match="empty"):
        next(bad)
    assert not m.training


def test_cli_generate_streams(tmp_path: Path, capsys) -> None:
    tok = tiny_tokenizer()
    save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    assert (
        gpt1(
            [
                "generate",
                "--checkpoint",
                str(tmp_path / "ck"),
                "--prompt",
                "The band and the",
                "-n",
                "6",
                "--greedy",
                "--device",
                "cpu",
            ]
        ).code
        == 0
    )
    cap = capsys.readouterr()
    assert cap.out.startswith("the band and the")
    assert "6 tokens in" in cap.err and "tokens/s" in cap.err
    m = tiny_model()
    expected = naive_greedy(m, tok.encode("The band and the"), 6)
    assert cap.out.rstrip("\n") == tok.decode(tok.encode("The band and the") + expected)


def test_cli_generate_errors(tmp_path: Path, capsys) -> None:
    assert gpt1(["generate", "--checkpoint", str(tmp_path / "none"), "--prompt", "hi"]).code == 1
    assert "checkpoint not found" in capsys.readouterr().err
    save_checkpoint(tmp_path / "notok", tiny_model(), None)
    assert gpt1(["generate", "--checkpoint", str(tmp_path / "notok"), "--prompt", "hi", "--device", "cpu"]).code == 1
    assert "no tokenizer" in capsys.readouterr().err
    save_checkpoint(tmp_path / "ck", tiny_model(), tiny_tokenizer())
    assert (
        gpt1(
            ["generate", "--checkpoint", str(tmp_path / "ck"), "--prompt", "hi", "--top-p", "0", "--device", "cpu"]
        ).code
        == 1
    )
    assert "--top-p 0.0 is impossible" in capsys.readouterr().err


# HF's golden greedy continuation of "the president is" for openai-gpt (its test_lm_generate_openai_gpt).
HF_GOLDEN = [481, 4735, 544, 246, 963, 870, 762, 239, 244, 40477, 244, 249, 719, 881, 487, 544, 240, 244, 603, 481]


def test_real_openai_gpt_golden_generation(tmp_path: Path) -> None:
    src = os.environ.get("GPT1_OPENAI_GPT_DIR")
    if not src:
        pytest.skip("set GPT1_OPENAI_GPT_DIR to a Hugging Face openai-gpt checkpoint directory to run this test")
    from gptcli.checkpoint import load_checkpoint
    from gptcli.interop.convert import convert_to_checkpoint, from_hf

    convert_to_checkpoint(from_hf(src), tmp_path / "ck")
    c = load_checkpoint(tmp_path / "ck")
    assert c.tokenizer.encode("the president is") == HF_GOLDEN[:3]
    out = generate(
        c.model, HF_GOLDEN[:3], SamplingConfig(max_new_tokens=17, greedy=True), vocab_limit=c.tokenizer.vocab_size
    )
    assert HF_GOLDEN[:3] + out == HF_GOLDEN


def test_greedy_matches_transformers_generate(tmp_path: Path) -> None:
    """Our converted model + KV-cache greedy loop reproduces transformers' own greedy generate."""
    transformers = pytest.importorskip("transformers")
    from gptcli.checkpoint import load_checkpoint
    from gptcli.interop.convert import convert_to_checkpoint, from_hf

    tok = tiny_tokenizer()
    cfg = transformers.OpenAIGPTConfig(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(5)
    hf = transformers.OpenAIGPTLMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".ln_" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(tmp_path / "hf")
    tok.save_bpe_files(tmp_path / "hf")
    convert_to_checkpoint(from_hf(tmp_path / "hf"), tmp_path / "ck")
    ours = generate(load_checkpoint(tmp_path / "ck").model, PROMPT, SamplingConfig(max_new_tokens=16, greedy=True))
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([PROMPT]), do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=0
        )[0, len(PROMPT) :].tolist()
    assert ours == theirs and len(set(ours)) > 1


def test_cli_config_file_and_long_prompt(tmp_path: Path, capsys) -> None:
    tok = tiny_tokenizer()
    save_checkpoint(tmp_path / "ck", tiny_model(n_ctx=8), tok)
    (tmp_path / "s.toml").write_text("max_new_tokens = 3\ngreedy = true\n")
    prompt = "a b c d e f g h i j"  # 10 tokens > the 8-token context: the last 7 are kept
    assert (
        gpt1(
            [
                "generate",
                "-c",
                str(tmp_path / "ck"),
                "-p",
                prompt,
                "--config",
                str(tmp_path / "s.toml"),
                "--device",
                "cpu",
            ]
        ).code
        == 0
    )
    cap = capsys.readouterr()
    assert "keeping the last 7" in cap.err and "1 tokens in" in cap.err  # 7 + 1 fills the context
    assert cap.out.startswith("d e f g h i j")
    (tmp_path / "bad.toml").write_text("max_new_tokens = 3\nbeam_width = 4\n")
    assert gpt1(["generate", "-c", str(tmp_path / "ck"), "-p", "a", "--config", str(tmp_path / "bad.toml")]).code == 1
    assert "unknown setting beam_width" in capsys.readouterr().err
