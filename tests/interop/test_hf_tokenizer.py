"""``gpt1 convert --to hf`` with a learned tokenizer: ``AutoTokenizer`` loads it without remote code, its ids are
gpt1's on real text (a floor under the share measured in docs/convert.md), and a model pretrained by ``gpt1 pretrain``
on a book generates the same greedy ids through ``transformers`` as through ``gpt1 generate``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptcli.checkpoint import save_checkpoint  # noqa: E402
from gptcli.interop.convert import to_hf  # noqa: E402
from gptcli.model.gpt import GPT, ModelConfig  # noqa: E402
from gptcli.tokenizers.text import strip_gutenberg, word_lines  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
BOOK = "pg11_alice_in_wonderland.txt"
FLOOR = 98.0
"""Percent of texts id-identical, per source (250 texts each): 98.4 % at the lowest, book paragraphs, since a
contraction or possessive before a period splits as gpt1's does (97.2 % before)."""


def book_text(shared_data: Path, name: str = BOOK) -> str:
    return strip_gutenberg((shared_data / "books" / name).read_text(encoding="utf-8-sig"))[0]


def real_texts(shared_data: Path, n: int = 250) -> dict[str, list[str]]:
    """Samples of WikiText-2 valid lines, book paragraphs and GLUE sentences (the benchmark's three sources)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "hf_tokenizer_agreement", Path(__file__).resolve().parents[2] / "benchmarks" / "hf_tokenizer_agreement.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    rng = random.Random(1)
    return {k: rng.sample(v, min(n, len(v))) for k, v in bench.texts(shared_data).items()}


def export(tmp: Path, tok, **shape) -> Path:
    cfg = dict(n_ctx=64, n_embd=32, n_layer=1, n_head=2, n_inner=128) | shape
    torch.manual_seed(0)
    save_checkpoint(tmp / "ck", GPT(ModelConfig(vocab_size=tok.vocab_size, **cfg)), tok)
    path, warnings = to_hf(tmp / "ck", tmp / "hf")
    assert not any("not exported" in w for w in warnings), warnings
    return path


@pytest.fixture(scope="module")
def learned(shared_data):
    from gptcli.tokenizers.learned import LearnedBPETokenizer

    lines = word_lines(book_text(shared_data)) + word_lines(book_text(shared_data, "pg84_frankenstein.txt"))
    return LearnedBPETokenizer.train(lines, vocab_size=2000, seed=0)


@pytest.mark.parametrize("kind", ["sentencepiece", "openai"])
def test_exported_tokenizer_reproduces_gpt1_ids_on_real_text(kind, learned, shared_data, tmp_path):
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    tok = learned if kind == "sentencepiece" else OpenAIBPETokenizer.from_dir(shared_data / "openai-gpt-bpe")
    hf = transformers.AutoTokenizer.from_pretrained(export(tmp_path, tok))  # no trust_remote_code
    shares = {}
    for source, texts in real_texts(shared_data).items():
        ours = tok.encode_batch(texts)
        shares[source] = (
            100 * sum(a == hf.encode(t, add_special_tokens=False) for a, t in zip(ours, texts)) / len(texts)
        )
    assert min(shares.values()) >= FLOOR, shares


@pytest.mark.parametrize("kind", ["sentencepiece", "openai"])
def test_a_clitic_before_a_period_splits_as_gpt1_s(kind, learned, shared_data, tmp_path):
    """spaCy splits the final period first, then the clitic ("wasn't." is was|n't|.): the export used to keep
    "n't." or "'s." together, the most common difference on book text."""
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    tok = learned if kind == "sentencepiece" else OpenAIBPETokenizer.from_dir(shared_data / "openai-gpt-bpe")
    hf = transformers.AutoTokenizer.from_pretrained(export(tmp_path, tok))
    for text in (
        "It wasn't.",
        "Caroline's.",
        "I'm here. I'm.",
        "they'll.",
        "It wasn't:",
        "the dogs'.",
        "He can't.\" she said",
        "It's Bob's.'",
        "wasn't...",
        "don't.\n",
    ):
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text), text


def test_export_files_name_the_context_and_the_special_tokens(learned, tmp_path):
    d = export(tmp_path, learned)
    config = json.loads((d / "config.json").read_text())
    assert config["model_max_length"] == 64 and config["n_positions"] == 64
    assert config["gpt1_special_tokens"] == {"<s>": 2000, "$": 2001, "<e>": 2002}
    assert config["bos_token_id"] is None and config["eos_token_id"] is None
    tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_cfg["model_max_length"] == 64
    hf = transformers.AutoTokenizer.from_pretrained(d)
    assert hf.model_max_length == 64 and hf.unk_token_id == 0
    assert hf.pad_token_id == 0  # batched pipelines refuse to pad without one
    batch = hf(["Alice said.", "The end of the longer text."], padding=True)
    assert len(set(map(len, batch["input_ids"]))) == 1 and 0 in batch["attention_mask"][0]
    text = "Alice said: 'I don't know <unk>!'\n\n\nThe end. Mr. Smith paid $5 (10%)."
    assert hf.encode(text, add_special_tokens=False) == learned.encode(text)
    assert learned.newline_id in hf.encode(text, add_special_tokens=False)
    assert hf.decode(learned.encode(text)) == learned.decode(learned.encode(text))
    assert hf.encode("$", add_special_tokens=False) == learned.encode("$")  # the text "$" is not the delimiter


@pytest.fixture(scope="module")
def pretrained_on_a_book(tmp_path_factory, shared_data) -> Path:
    """``gpt1 prepare`` on a book (a learned BPE), then ``gpt1 pretrain`` for a few updates."""
    from run_helpers import tiny_config

    from gptcli.data.prepare import PrepareConfig, prepare
    from gptcli.train.pretrain import pretrain

    d = tmp_path_factory.mktemp("book-run")
    (d / "books").mkdir()
    (d / "books" / BOOK).write_text(book_text(shared_data), encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(d / "books")], out=d / "corpus", vocab_size=600, workers=1, val_fraction=0.05))
    cfg = tiny_config(
        d / "corpus",
        d / "run",
        model={"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 128, "n_ctx": 32},
        seq_len=32,
        max_steps=6,
        save_every=6,
    )
    pretrain(cfg)
    return d / "run"


def test_export_of_a_pretrained_model_generates_as_gpt1_generate(pretrained_on_a_book, tmp_path):
    from gptcli.model.generate import GenerateConfig
    from gptcli.pipelines.generate import start_generation

    path, _ = to_hf(pretrained_on_a_book, tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    compared = 0
    for prompt in ("Alice was beginning to get very tired", "The Queen said", "Down the rabbit hole, she went!"):
        gen = start_generation(
            GenerateConfig(checkpoint=pretrained_on_a_book, prompt=prompt, greedy=True, max_new_tokens=12, device="cpu")
        )
        list(gen.stream())
        ids = hf_tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        if ids[0].tolist() != gen.ids:
            continue  # the tokenizations differ: the comparison would be meaningless
        with torch.no_grad():
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
        assert out[0, ids.size(1) :].tolist() == gen.generated, prompt
        compared += 1
    assert compared >= 2
    pipe = transformers.pipeline("text-generation", model=str(path), tokenizer=str(path))
    text = pipe("alice was", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert text.startswith("alice was")
