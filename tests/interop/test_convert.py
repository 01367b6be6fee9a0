"""Weights in and out: Hugging Face openai-gpt and the original .npy release, through `gpt1 convert`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from error_lines import gpt1

from gptcli.checkpoint import load_checkpoint, save_checkpoint
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.tokenizers.openai import OpenAIBPETokenizer

transformers = pytest.importorskip("transformers")
from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel  # noqa: E402

N_CTX, N_EMBD, N_LAYER, N_HEAD = 16, 32, 2, 4


def tiny_tokenizer() -> OpenAIBPETokenizer:
    """A 60-entry BPE in the original format (needs no ../shared data)."""
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


def hf_model(vocab_size: int) -> OpenAIGPTLMHeadModel:
    """A random tiny OpenAIGPTLMHeadModel; every tensor (LayerNorm gains and biases too) perturbed, so any
    mis-mapped or untransposed tensor changes the logits."""
    cfg = OpenAIGPTConfig(
        vocab_size=vocab_size, n_positions=N_CTX, n_embd=N_EMBD, n_layer=N_LAYER, n_head=N_HEAD, afn="gelu"
    )
    torch.manual_seed(1)
    m = OpenAIGPTLMHeadModel(cfg).eval()
    with torch.no_grad():
        for _, p in m.named_parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


def ours_logits(ckpt: Path, idx: torch.Tensor) -> torch.Tensor:
    c = load_checkpoint(ckpt)
    with torch.no_grad():
        return c.model.lm_logits(c.model(idx))


IDX = torch.tensor([[5, 7, 1, 59, 30, 2, 11, 12, 44, 3, 0, 58]])


def test_from_hf_safetensors_logits_match(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    hf = hf_model(tok.vocab_size)
    hf.save_pretrained(tmp_path / "hf")
    tok.save_bpe_files(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert gpt1(["convert", "--from", "hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ck")]).code == 0
    with torch.no_grad():
        ref = hf(IDX).logits
    got = ours_logits(tmp_path / "ck", IDX)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, atol=1e-4), (got - ref).abs().max()
    c = load_checkpoint(tmp_path / "ck")
    assert c.kind == "lm" and c.meta["source"]["format"] == "hf"
    assert isinstance(c.tokenizer, OpenAIBPETokenizer) and c.tokenizer.encoder == tok.encoder
    assert c.config.n_special == 0 and c.config.vocab_size == tok.vocab_size


def test_from_hf_pytorch_bin(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    hf = hf_model(tok.vocab_size)
    d = tmp_path / "hf"
    d.mkdir()
    hf.config.save_pretrained(d)
    torch.save(hf.state_dict(), d / "pytorch_model.bin")
    tok.save_bpe_files(d)
    assert gpt1(["convert", "--from", "hf", str(d), "--out", str(tmp_path / "ck")]).code == 0
    with torch.no_grad():
        assert torch.allclose(ours_logits(tmp_path / "ck", IDX), hf(IDX).logits, atol=1e-4)


def test_to_hf_loads_in_transformers(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    torch.manual_seed(2)
    model = GPT(
        ModelConfig(
            vocab_size=tok.vocab_size, n_ctx=N_CTX, n_embd=N_EMBD, n_layer=N_LAYER, n_head=N_HEAD, n_inner=4 * N_EMBD
        )
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_checkpoint(tmp_path / "ck", model, tok)
    assert gpt1(["convert", "--to", "hf", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]).code == 0
    hf = OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        ours = model.lm_logits(model(IDX))
        theirs = hf(IDX).logits
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    hf_tok = transformers.OpenAIGPTTokenizer.from_pretrained(tmp_path / "hf")
    for word in ("the", "and", "than", "zebra"):
        assert hf_tok.encode(word, add_special_tokens=False) == list(tok.word_ids(word))
    # And back again: the special rows survive a round trip.
    model.add_special_tokens(3)
    save_checkpoint(tmp_path / "ck3", model, tok)
    assert gpt1(["convert", "--to", "hf", str(tmp_path / "ck3"), "--out", str(tmp_path / "hf3")]).code == 0
    assert json.loads((tmp_path / "hf3" / "config.json").read_text())["vocab_size"] == tok.vocab_size + 3
    assert gpt1(["convert", "--from", "hf", str(tmp_path / "hf3"), "--out", str(tmp_path / "back")]).code == 0
    back = load_checkpoint(tmp_path / "back")
    assert back.config.n_special == 3 and back.config.vocab_size == tok.vocab_size
    assert torch.equal(back.model.tok_emb.weight, model.tok_emb.weight)


def test_to_hf_without_tokenizer_says_so(tmp_path: Path, capsys) -> None:
    model = GPT(ModelConfig(vocab_size=40, n_ctx=N_CTX, n_embd=N_EMBD, n_layer=1, n_head=N_HEAD, n_inner=4 * N_EMBD))
    save_checkpoint(tmp_path / "ck", model, None)
    assert gpt1(["convert", "--to", "hf", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]).code == 0
    assert "no tokenizer" in capsys.readouterr().err
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {"config.json", "model.safetensors", ".gpt1-output"}
    OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "hf")


def write_openai_release(hf: OpenAIGPTLMHeadModel, out: Path, stacked_specials: int | None = None) -> None:
    """The released layout, written independently from an HF model: a flat float32 vector cut into 10 shards;
    positions first, then tokens, then 12 arrays per block with Conv1D weights as [1, in, out]. With
    ``stacked_specials``: one fine-tuning-graph matrix [tokens; specials; positions] instead."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.transformer.state_dict().items()}
    tokens, pos = sd["tokens_embed.weight"], sd["positions_embed.weight"]
    arrays = [np.concatenate([tokens, pos], 0)] if stacked_specials is not None else [pos, tokens]
    for i in range(hf.config.n_layer):
        p = f"h.{i}."
        for name in ("attn.c_attn", "attn.c_proj"):
            arrays += [sd[p + name + ".weight"][None], sd[p + name + ".bias"]]
        arrays += [sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]]
        for name in ("mlp.c_fc", "mlp.c_proj"):
            arrays += [sd[p + name + ".weight"][None], sd[p + name + ".bias"]]
        arrays += [sd[p + "ln_2.weight"], sd[p + "ln_2.bias"]]
    out.mkdir()
    (out / "params_shapes.json").write_text(json.dumps([list(a.shape) for a in arrays]))
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    for n, shard in enumerate(np.array_split(flat, 10)):
        np.save(out / f"params_{n}.npy", shard)


def test_from_openai_release_layout(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    hf = hf_model(tok.vocab_size)
    write_openai_release(hf, tmp_path / "rel")
    tok.save_bpe_files(tmp_path / "rel")
    # The original file names are accepted too.
    (tmp_path / "rel" / "vocab.json").rename(tmp_path / "rel" / "encoder_bpe_40000.json")
    (tmp_path / "rel" / "merges.txt").rename(tmp_path / "rel" / "vocab_40000.bpe")
    assert (
        gpt1(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "rel"),
                "--out",
                str(tmp_path / "ck"),
                "--n-head",
                str(N_HEAD),
            ]
        ).code
        == 0
    )
    with torch.no_grad():
        assert torch.allclose(ours_logits(tmp_path / "ck", IDX), hf(IDX).logits, atol=1e-4)
    c = load_checkpoint(tmp_path / "ck")
    assert c.meta["source"] == {"format": "openai", "path": str(tmp_path / "rel"), "layout": "separate", "shards": 10}
    assert c.tokenizer.encoder == tok.encoder


def test_from_openai_stacked_finetuning_matrix(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    hf = hf_model(tok.vocab_size + 3)  # 3 special rows after the vocabulary, as the fine-tuning graph has
    write_openai_release(hf, tmp_path / "rel", stacked_specials=3)
    tok.save_bpe_files(tmp_path / "rel")
    assert (
        gpt1(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "rel"),
                "--out",
                str(tmp_path / "ck"),
                "--n-head",
                str(N_HEAD),
            ]
        ).code
        == 0
    )
    c = load_checkpoint(tmp_path / "ck")
    assert (c.config.vocab_size, c.config.n_special, c.config.n_ctx) == (tok.vocab_size, 3, N_CTX)
    with torch.no_grad():
        assert torch.allclose(ours_logits(tmp_path / "ck", IDX), hf(IDX).logits, atol=1e-4)


def test_real_release_shapes_are_understood(shared_data: Path) -> None:
    shapes = json.loads((shared_data / "openai-gpt-bpe" / "params_shapes.json").read_text())
    assert shapes[0] == [512, 768] and shapes[1] == [40478, 768] and (len(shapes) - 2) == 12 * 12
    assert shapes[2] == [1, 768, 2304] and shapes[8] == [1, 768, 3072] and shapes[10] == [1, 3072, 768]
    assert sum(int(np.prod(s)) for s in shapes) == 116_534_784


# ----------------------------------------------------------------------------------------------- errors
def test_cli_errors(tmp_path: Path, capsys) -> None:
    def err(*args: str) -> str:
        assert gpt1(args).code == 1
        return capsys.readouterr().err

    out = str(tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "exactly one of --from" in err("convert", str(empty), "--out", out)
    assert "expected one of" in err("convert", "--from", "onnx", str(empty), "--out", out)
    assert "no config.json" in err("convert", "--from", "hf", str(empty), "--out", out)
    assert "no params_shapes.json" in err("convert", "--from", "openai", str(empty), "--out", out)
    assert "not a directory" in err("convert", "--from", "hf", str(tmp_path / "missing" / "x.bin"), "--out", out)
    assert "checkpoint not found" in err("convert", "--to", "hf", str(tmp_path / "nope"), "--out", out)
    # A release with a shard missing.
    tok = tiny_tokenizer()
    write_openai_release(hf_model(tok.vocab_size), tmp_path / "rel")
    (tmp_path / "rel" / "params_7.npy").unlink()
    assert "needs" in err("convert", "--from", "openai", str(tmp_path / "rel"), "--out", out)
    # An HF directory without weights; and --out is never clobbered silently.
    hf_model(tok.vocab_size).config.save_pretrained(tmp_path / "hf")
    assert "no model.safetensors or pytorch_model.bin" in err(
        "convert", "--from", "hf", str(tmp_path / "hf"), "--out", out
    )
    hf = str(tmp_path / "hf")
    assert "contains the input" in err("convert", "--from", "hf", hf, "--out", str(tmp_path), "--overwrite")
    assert "not something gpt1 wrote" in err(
        "convert", "--from", "hf", hf, "--out", str(tmp_path / "rel"), "--overwrite"
    )
    assert not (tmp_path / "out").exists() and (tmp_path / "rel" / "params_0.npy").exists()


def test_hub_id_unreachable_message(tmp_path: Path, monkeypatch, capsys) -> None:
    """A Hub id with no network and nothing cached: one line saying what to do (more in tests/interop/test_hub.py)."""
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import LocalEntryNotFoundError

    def unreachable(*a, **k):
        raise LocalEntryNotFoundError("Failed to resolve 'huggingface.co' (network unreachable)")

    monkeypatch.setattr(hub, "snapshot_download", unreachable)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    assert gpt1(["convert", "--from", "hf", "openai-community/openai-gpt", "--out", str(tmp_path / "ck")]).code == 1
    msg = " ".join(capsys.readouterr().err.split())
    assert "openai-community/openai-gpt: the Hugging Face Hub could not be reached" in msg and "HF_ENDPOINT" in msg
    assert not (tmp_path / "ck").exists()


def test_to_hf_with_a_non_openai_tokenizer_says_it_is_not_exported(tmp_path: Path, capsys) -> None:
    toy = pytest.importorskip("toy_tokenizer")  # tests/toy_tokenizer.py: a Tokenizer of another kind
    model = GPT(ModelConfig(vocab_size=97, n_ctx=N_CTX, n_embd=N_EMBD, n_layer=1, n_head=N_HEAD, n_inner=4 * N_EMBD))
    save_checkpoint(tmp_path / "ck", model, toy.ToyTokenizer(97))
    assert gpt1(["convert", "--to", "hf", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]).code == 0
    assert "tokenizer kind 'toy' is not exported" in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "hf" / "vocab.json").exists()
    hf = OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([[1, 5, 96]])
    with torch.no_grad():
        assert torch.allclose(hf(idx).logits, model.eval().lm_logits(model(idx)), atol=1e-4)


def test_from_hf_reads_the_tokenizer_json_transformers_5_saves(tmp_path: Path, capsys) -> None:
    """transformers 5 saves openai-gpt's tokenizer as tokenizer.json alone (no vocab.json + merges.txt): its BPE is
    imported with the model; a tokenizer.json of another kind is named in a warning instead."""
    tok = tiny_tokenizer()
    tok.save_bpe_files(tmp_path / "bpe")
    d = tmp_path / "hf"
    hf_model(tok.vocab_size).save_pretrained(d)
    transformers.OpenAIGPTTokenizer.from_pretrained(tmp_path / "bpe").save_pretrained(d)
    assert (d / "tokenizer.json").is_file() and not (d / "vocab.json").exists()
    assert gpt1(["convert", "--from", "hf", str(d), "--out", str(tmp_path / "ck")]).code == 0
    c = load_checkpoint(tmp_path / "ck")
    assert isinstance(c.tokenizer, OpenAIBPETokenizer)
    assert c.tokenizer.encoder == tok.encoder and c.tokenizer.merges == tok.merges
    assert c.tokenizer.encode("the band") == tok.encode("the band")

    body = json.loads((d / "tokenizer.json").read_text())
    body["model"] = {"type": "WordPiece", "vocab": body["model"]["vocab"]}
    (d / "tokenizer.json").write_text(json.dumps(body))
    capsys.readouterr()
    assert gpt1(["convert", "--from", "hf", str(d), "--out", str(tmp_path / "ck2")]).code == 0
    assert load_checkpoint(tmp_path / "ck2").tokenizer is None
    assert "tokenizer.json: not GPT-1's BPE" in capsys.readouterr().err
