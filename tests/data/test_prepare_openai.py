"""`gpt1 prepare --tokenizer` with OpenAI's original BPE: the released files, a checkpoint's tokenizer, a run's."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from gptcli.data.documents import Problems, iter_documents
from gptcli.data.prepare import PrepareConfig, prepare
from gptcli.data.shards import open_corpus, tokenizer_fingerprint
from gptcli.errors import GPT1Error
from gptcli.progress import SILENT
from gptcli.tokenizers.openai import OpenAIBPETokenizer


@pytest.fixture(scope="module")
def wiki_slice(shared_data: Path, tmp_path_factory) -> Path:
    """The first ~60 kB of WikiText-2's valid file (its first articles), cut at a line break."""
    text = (shared_data / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("wiki") / "wiki.valid.tokens"
    path.write_text(text[: text.index("\n", 60_000) + 1], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def released(shared_data: Path) -> Path:
    return shared_data / "openai-gpt-bpe"


def _cfg(src: Path, out: Path, tokenizer: Path, **kw) -> PrepareConfig:
    kw = {"split_by": "wikitext", "val_fraction": 0.2, "workers": 1, **kw}
    return PrepareConfig(inputs=[str(src)], out=out, tokenizer=tokenizer, **kw)


def test_prepare_with_the_released_bpe_stores_what_encode_gives(wiki_slice, released, tmp_path):
    """Every stored document is the released ``TextEncoder.encode`` of its text (``OpenAIBPETokenizer.encode``), in
    the split the seed drew it for; 1 and 2 workers write the same shards; the manifest identifies the tokenizer."""
    runs = [prepare(_cfg(wiki_slice, tmp_path / f"w{w}", released, workers=w, chunk_bytes=4_000)) for w in (1, 2)]
    assert [s["sha256"] for s in runs[0].manifest["shards"]] == [s["sha256"] for s in runs[1].manifest["shards"]]
    tok = OpenAIBPETokenizer.from_dir(released)
    docs = list(iter_documents(wiki_slice, _cfg(wiki_slice, tmp_path, released), Problems(False, SILENT)))
    assert len(docs) > 3
    val = set(random.Random(0).sample(range(len(docs)), max(1, round(0.2 * len(docs)))))  # docs/formats.md's draw
    corpus = open_corpus(runs[0].out)
    for split, wanted in (
        ("train", [d for i, d in enumerate(docs) if i not in val]),
        ("val", [d for i, d in enumerate(docs) if i in val]),
    ):
        assert [d.tolist() for d in corpus.documents(split)] == [tok.encode(d) for d in wanted], split
    assert corpus.tokenizer.newline_id == 40477 and 40477 in next(iter(corpus.documents("train"))).tolist()
    m = runs[0].manifest
    assert m["settings"]["cased"] is False and m["dtype"] == "uint16"
    t = m["tokenizer"]
    assert (t["kind"], t["vocab_size"], t["total_vocab"], t["newline_id"], t["learned"]) == (
        "openai",
        40478,
        40481,
        40477,
        False,
    )
    assert t["model_sha256"] is None and t["source"] == str(released)
    tok.save(tmp_path / "saved")
    fingerprint = tokenizer_fingerprint(runs[0].out / "tokenizer")
    assert t["fingerprint"] == fingerprint == tokenizer_fingerprint(tmp_path / "saved")
    assert corpus.verify() == []
    vocab = json.loads((runs[1].out / "tokenizer" / "vocab.json").read_text(encoding="utf-8"))
    vocab["the</w>"], vocab["of</w>"] = vocab["of</w>"], vocab["the</w>"]  # another tokenizer under the same files
    (runs[1].out / "tokenizer" / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    assert [p for p in open_corpus(runs[1].out).verify() if "not the tokenizer" in p]


def test_a_checkpoint_or_run_directory_gives_its_tokenizer(wiki_slice, released, tmp_path):
    """--tokenizer CKPT (its tokenizer/), a run directory (its newest checkpoint's) and the released files are one
    tokenizer: the same shards, the same fingerprint (what `gpt1 eval` compares with a checkpoint's)."""
    from gptcli.checkpoint import save_checkpoint
    from gptcli.model.gpt import GPT, ModelConfig

    tok = OpenAIBPETokenizer.from_dir(released)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_ctx=8, n_embd=8, n_layer=1, n_head=2, n_inner=16)
    ck = save_checkpoint(tmp_path / "ck", GPT(cfg), tok, meta={"step": 1})
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(ck, tmp_path / "run" / "checkpoints" / "step-1")
    small = tmp_path / "small.tokens"
    small.write_text(wiki_slice.read_text(encoding="utf-8")[:8_000], encoding="utf-8")
    runs = {
        name: prepare(_cfg(small, tmp_path / f"c-{name}", src, split_by="paragraph"))
        for name, src in (
            ("released", released),
            ("ck", ck),
            ("run", tmp_path / "run"),
            ("tokenizer", ck / "tokenizer"),
        )
    }
    shards = {name: [s["sha256"] for s in r.manifest["shards"]] for name, r in runs.items()}
    assert len({tuple(s) for s in shards.values()}) == 1
    assert {r.manifest["tokenizer"]["fingerprint"] for r in runs.values()} == {tokenizer_fingerprint(ck / "tokenizer")}


def test_settings_that_disagree_with_the_openai_bpe_are_refused(wiki_slice, released, tmp_path):
    with pytest.raises(GPT1Error, match=r"^--vocab-size 500 disagrees with the reused tokenizer .*, which has 40,478"):
        prepare(_cfg(wiki_slice, tmp_path / "a", released, vocab_size=500))
    with pytest.raises(GPT1Error, match=r"^--cased disagrees with the reused tokenizer .*, which is uncased"):
        prepare(_cfg(wiki_slice, tmp_path / "b", released, cased=True))
    r = prepare(_cfg(wiki_slice, tmp_path / "c", released, vocab_size=500), given={"inputs", "tokenizer"})
    assert r.manifest["tokenizer"]["vocab_size"] == 40478  # a value the user did not set follows the tokenizer
    (tmp_path / "nothing").mkdir()
    with pytest.raises(
        GPT1Error,
        match=r"nothing: no tokenizer here \(pass a tokenizer directory, .* "
        r"encoder_bpe_40000\.json \+ vocab_40000\.bpe\)$",
    ):
        prepare(_cfg(wiki_slice, tmp_path / "d", tmp_path / "nothing"))
