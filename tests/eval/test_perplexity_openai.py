"""`gpt1 eval --data` for a checkpoint of OpenAI's original BPE (converted from Hugging Face `openai-gpt`): prepared
with `--tokenizer CKPT`, scored, and the number checked against Hugging Face's own forward pass on the same windows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from error_lines import gpt1

from gptcli.errors import GPT1Error


def _hf_checkpoint(path: Path, bpe: Path, n_positions: int) -> Path:
    """A random 2-layer, 32-wide Hugging Face OpenAIGPT over the released vocabulary, with its BPE files. Its
    matrices are scaled up from the 0.02 init, so that the logits depend on the context (a shifted window shows)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    cfg = transformers.OpenAIGPTConfig(vocab_size=40478, n_positions=n_positions, n_embd=32, n_layer=2, n_head=2)
    model = transformers.OpenAIGPTLMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    model.save_pretrained(path, safe_serialization=True)
    OpenAIBPETokenizer.from_dir(bpe).save_bpe_files(path)
    return path


def _hf_loss(hf_dir: Path, corpus: Path) -> tuple[float, int]:
    """Hugging Face's mean next-token NLL over the val shards, windows cut as docs/eval.md says (written here, not
    taken from gptcli): n + 1 tokens on a stride of n, the tail in one last window ending at the shard's end whose
    targets scored already are left out. Reads the shards with pyarrow alone."""
    import pyarrow as pa
    import torch
    import transformers

    model = transformers.OpenAIGPTLMHeadModel.from_pretrained(hf_dir).eval()
    n = model.config.n_positions
    total, count = 0.0, 0
    for e in json.loads((corpus / "manifest.json").read_text())["shards"]:
        if e["split"] != "val":
            continue
        column = pa.ipc.open_file(pa.memory_map(str(corpus / e["file"]))).read_all().column(0).combine_chunks()
        a = torch.from_numpy(column.values.to_numpy().astype(np.int64))
        starts, skips, s = [], [], 0
        while s + n + 1 <= len(a):
            starts.append(s), skips.append(0)
            s += n
        if s < len(a) - 1:
            starts.append(max(len(a) - n - 1, 0)), skips.append(s - max(len(a) - n - 1, 0))
        for start, skip in zip(starts, skips):
            w = a[start : start + n + 1]
            with torch.no_grad():
                logits = model(w[None, :-1]).logits[0].double()
            nll = torch.nn.functional.cross_entropy(logits, w[1:], reduction="none")[skip:]
            total, count = total + float(nll.sum()), count + len(nll)
    return total / count, count


def test_eval_data_scores_an_openai_bpe_checkpoint_as_hugging_face_does(shared_data, tmp_path, capsys):
    bpe, wiki = shared_data / "openai-gpt-bpe", shared_data / "wikitext-2" / "wiki.valid.tokens"
    text = wiki.read_text(encoding="utf-8")
    src = tmp_path / "wiki.valid.tokens"
    src.write_text(text[: text.index("\n", 40_000) + 1], encoding="utf-8")
    hf = _hf_checkpoint(tmp_path / "hf", bpe, n_positions=64)
    ck, corpus = tmp_path / "ck", tmp_path / "corpus"

    def run(*args: str) -> str:
        code, out, err = gpt1(args, capsys)
        assert code == 0, err  # gpt1 gives 0 for a bare exit and None for a traceback
        return out

    run("convert", str(hf), "--from", "hf", "--out", str(ck))
    run(
        "prepare",
        str(src),
        "--split-by",
        "wikitext",
        "--tokenizer",
        str(ck),
        "--val-fraction",
        "0.1",
        "--workers",
        "1",
        "--out",
        str(corpus),
    )
    assert "perplexity" in run("eval", "--checkpoint", str(ck), "--data", str(corpus), "--device", "cpu")

    from gptcli.eval.perplexity import corpus_perplexity

    hf_loss, hf_tokens = _hf_loss(hf, corpus)
    for mode in ("reference", "auto"):
        row = corpus_perplexity([ck], corpus, device="cpu", precision="fp32", kernels=mode)[0]
        assert row.tokens == hf_tokens > 1000
        assert row.loss == pytest.approx(hf_loss, rel=1e-5, abs=0)
        assert row.perplexity == pytest.approx(math.exp(hf_loss), rel=1e-4)
    assert hf_loss < math.log(40478) - 0.1 or hf_loss > math.log(40478) + 0.1  # not the uniform guess

    # A corpus prepared with another tokenizer is refused, and the advice given is a command that works.
    other = tmp_path / "other"
    run(
        "prepare",
        str(src),
        "--split-by",
        "wikitext",
        "--vocab-size",
        "300",
        "--val-fraction",
        "0.1",
        "--workers",
        "1",
        "--out",
        str(other),
    )
    with pytest.raises(GPT1Error, match=r"was trained with another tokenizer .* --tokenizer (\S+)\)$") as e:
        corpus_perplexity([ck], other, device="cpu")
    advised = str(e.value).rsplit("--tokenizer ", 1)[1].rstrip(")")
    run(
        "prepare",
        str(src),
        "--tokenizer",
        advised,
        "--val-fraction",
        "0.1",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "again"),
    )
    assert corpus_perplexity([ck], tmp_path / "again", device="cpu", max_batches=1)[0].tokens > 0
