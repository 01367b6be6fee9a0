"""Arrow token shards: round trip, zero-copy reads, dtype choice, shard splitting, manifest, verification."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptcli.data.shards import (
    ShardWriter,
    open_corpus,
    read_shard,
    sha256_file,
    shard_name,
    summarize,
    token_dtype,
    write_manifest,
    write_shard,
)
from gptcli.errors import GPT1Error


def _docs(rng, n, vocab, max_len=50):
    return [rng.integers(0, vocab, size=rng.integers(0, max_len)).astype(np.int64) for _ in range(n)]


def test_dtype_choice():
    assert token_dtype(40478 + 3) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


@pytest.mark.parametrize("vocab", [40481, 70000])
def test_round_trip_zero_copy(tmp_path, vocab):
    rng = np.random.default_rng(0)
    docs = _docs(rng, 20, vocab)
    dtype = token_dtype(vocab)
    entry = write_shard(tmp_path / "s.arrow", docs, dtype)
    assert entry["documents"] == 20 and entry["tokens"] == sum(len(d) for d in docs)
    assert entry["sha256"] == sha256_file(tmp_path / "s.arrow")
    shard = read_shard(tmp_path / "s.arrow")
    assert shard.tokens.dtype == dtype and shard.num_documents == 20
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(shard.document(i), d)
    assert not shard.tokens.flags.writeable  # a view into the memory map, not a copy
    np.testing.assert_array_equal(shard.tokens, np.concatenate(docs))


def test_writer_splits_into_shards(tmp_path):
    rng = np.random.default_rng(1)
    docs = _docs(rng, 30, 1000, max_len=40)
    w = ShardWriter(tmp_path, "train", np.uint16, shard_tokens=100)
    for d in docs:
        w.add(d)
    entries = w.close()
    assert len(entries) > 3
    assert [e["file"] for e in entries] == [shard_name("train", i) for i in range(len(entries))]
    assert sum(e["documents"] for e in entries) == 30
    back = [read_shard(tmp_path / e["file"]) for e in entries]
    got = [s.document(i) for s in back for i in range(s.num_documents)]
    assert all(np.array_equal(a, b) for a, b in zip(got, docs))


def test_corpus_and_verify(tmp_path):
    rng = np.random.default_rng(2)
    w = ShardWriter(tmp_path, "train", np.uint16, shard_tokens=10**9)
    for d in _docs(rng, 5, 500):
        w.add(d)
    v = ShardWriter(tmp_path, "val", np.uint16)
    v.add(np.arange(7))
    manifest = {"shards": w.close() + v.close()}
    write_manifest(tmp_path, manifest)
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written.pop("manifest_sha256") and written == manifest  # the content, plus its own digest
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".arrow")) == ["manifest.json"]
    corpus = open_corpus(tmp_path)
    assert corpus.splits == ["train", "val"]
    assert corpus.num_documents("val") == 1 and corpus.num_tokens("val") == 7
    np.testing.assert_array_equal(corpus.arrays("val")[0], np.arange(7))
    assert corpus.verify() == []
    corpus.check_intact()
    # flip one byte of the token data: the checksum catches it
    path = tmp_path / shard_name("val", 0)
    data = bytearray(path.read_bytes())
    i = data.find(np.arange(7, dtype=np.uint16).tobytes())
    data[i + 2] ^= 0xFF
    path.write_bytes(bytes(data))
    problems = corpus.verify()
    assert len(problems) == 1 and "checksum mismatch" in problems[0] and "val-00000" in problems[0]
    with pytest.raises(GPT1Error, match=r"val-00000.*checksum mismatch"):
        corpus.check_intact()  # the first problem, as one line
    path.unlink()
    assert "missing" in corpus.verify()[0]
    with pytest.raises(GPT1Error, match="missing"):
        open_corpus(tmp_path).shards("val")  # a corpus maps each shard once: this one still reads its mapping
    with pytest.raises(GPT1Error, match="no 'test' split"):
        corpus.shards("test")


def test_open_corpus_errors(tmp_path):
    with pytest.raises(GPT1Error, match="not found"):
        open_corpus(tmp_path / "nope")
    with pytest.raises(GPT1Error, match="not a prepared corpus"):
        open_corpus(tmp_path)
    (tmp_path / "manifest.json").write_text("{bad")
    with pytest.raises(GPT1Error, match="corrupt manifest"):
        open_corpus(tmp_path)


def test_summarize_reads_the_manifest_for_the_commands(tmp_path):
    w = ShardWriter(tmp_path, "train", np.uint16, shard_tokens=5)
    for d in (np.arange(4), np.arange(3), np.arange(6)):
        w.add(d)
    v = ShardWriter(tmp_path, "val", np.uint16)
    v.add(np.arange(2))
    manifest = {
        "format_version": 1,
        "dtype": "uint16",
        "tool": {"name": "gpt1", "version": "9.9"},
        "settings": {"seed": 3, "workers": 2},
        "inputs": [{"bytes": 10}, {"bytes": 32}],
        "tokenizer": {"vocab_size": 40, "learned": False, "source": "elsewhere"},
        "splits": {"train": {"text_bytes": 52}, "val": {"text_bytes": 8}},
        "shards": w.close() + v.close(),
        "warnings": ["a: empty file"],
    }
    write_manifest(tmp_path, manifest)
    s = open_corpus(tmp_path).summary()
    assert s == summarize(manifest)
    assert [(x.name, x.documents, x.tokens, x.shards, x.text_bytes) for x in s.splits] == [
        ("train", 3, 13, 2, 52),
        ("val", 1, 2, 1, 8),
    ]
    assert (s.vocab_size, s.learned, s.tokenizer_source, s.inputs, s.input_bytes) == (40, False, "elsewhere", 2, 42)
    assert (s.tool_version, s.seed, s.workers, s.warnings, s.dtype) == ("9.9", 3, 2, 1, "uint16")
    old = summarize({"shards": manifest["shards"]})  # a bare manifest: what it lacks shows as unknown
    assert old.splits[0].text_bytes is None and old.tool_version == "?" and old.warnings == 0


def test_tokenizer_fingerprint_is_what_the_tokenizer_does(tmp_path):
    from gptcli.data.shards import tokenizer_fingerprint

    def saved(name, model: bytes, **meta):
        d = tmp_path / name
        d.mkdir()
        (d / "sentencepiece.model").write_bytes(model)
        (d / "tokenizer.json").write_text(json.dumps({"kind": "sentencepiece", "vocab_size": 60, **meta}))
        return d

    a = tokenizer_fingerprint(saved("a", b"merges-a", pipeline="v1 words"))
    assert a == tokenizer_fingerprint(saved("a2", b"merges-a", pipeline="v2 wording"))  # the description is free
    assert a != tokenizer_fingerprint(saved("b", b"merges-b", pipeline="v1 words"))  # same size, other merges
    assert a != tokenizer_fingerprint(saved("c", b"merges-a", pipeline="v1 words", cased=True))
    assert tokenizer_fingerprint(tmp_path / "none") is None


def test_openai_tokenizer_fingerprint_is_its_bpe_whatever_the_key_order(tmp_path):
    """OpenAI's BPE is identified by its tokens and merges: the released key order, Hugging Face's (sorted by name)
    and gpt1's save agree; another merge list differs; unparsable files are compared by their bytes."""
    from gptcli.data.shards import tokenizer_fingerprint
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    vocab = {"<unk>": 0, "l": 1, "o": 2, "w": 3, "lo": 4, "low</w>": 5, "o</w>": 6, "w</w>": 7, "l</w>": 8}
    tok = OpenAIBPETokenizer(vocab, [("l", "o"), ("lo", "w</w>")])
    tok.save(tmp_path / "a")
    tok.save(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.json").write_text(json.dumps(vocab, sort_keys=True, indent=2))  # HF's layout
    a = tokenizer_fingerprint(tmp_path / "a")
    assert a == tokenizer_fingerprint(tmp_path / "hf")
    assert (tmp_path / "a" / "vocab.json").read_bytes() != (tmp_path / "hf" / "vocab.json").read_bytes()
    OpenAIBPETokenizer(vocab, [("l", "o")]).save(tmp_path / "b")
    assert tokenizer_fingerprint(tmp_path / "b") != a
    (tmp_path / "hf" / "vocab.json").write_bytes(b"\xff{")
    assert tokenizer_fingerprint(tmp_path / "hf") not in (None, a)


def test_corpus_fingerprint_and_largest_ids(tmp_path):
    from corpus_helpers import write_corpus

    from gptcli.data.shards import open_corpus

    docs = {"train": [[np.array([1, 2, 300])], [np.array([5])]], "val": [[np.array([7, 8])]]}
    a, b = open_corpus(write_corpus(tmp_path / "a", docs)), open_corpus(write_corpus(tmp_path / "b", docs))
    assert a.fingerprint() == b.fingerprint()  # the same shards in another place
    other = open_corpus(write_corpus(tmp_path / "c", {**docs, "val": [[np.array([7, 9])]]}))
    assert other.fingerprint() != a.fingerprint()
    assert [m for _, m in a.max_token_ids("train")] == [300, 5]
    a.check_token_ids("train", 301)
    with pytest.raises(GPT1Error, match=r"train-00000.arrow: holds token id 300, outside the vocabulary of 300 ids"):
        a.check_token_ids("train", 300)


def test_a_changed_manifest_is_caught_by_its_digest(tmp_path):
    w = ShardWriter(tmp_path, "train", np.uint16)
    w.add(np.arange(9))
    write_manifest(tmp_path, {"format_version": 1, "tool": {"name": "gpt1"}, "shards": w.close()})
    open_corpus(tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["shards"][0]["tokens"] = 10  # a count edited, the shard untouched
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(GPT1Error, match="checksum mismatch"):
        open_corpus(tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["manifest_sha257"] = m.pop("manifest_sha256")  # the digest's own key damaged
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(GPT1Error, match="unexpected key 'manifest_sha257'"):
        open_corpus(tmp_path)
