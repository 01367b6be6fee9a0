"""End-to-end `prepare` on real books: output format, determinism, parallel == serial, bad inputs, atomic
output, tokenizer reuse, progress reports and `inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptcli.cli import main
from gptcli.data.inputs import resolve_inputs
from gptcli.data.prepare import PrepareConfig, prepare
from gptcli.data.shards import open_corpus
from gptcli.data.workers import text_chunks
from gptcli.errors import DataError, GPT1Error
from gptcli.files.fsutil import sha256_file
from gptcli.progress import RecordingProgress
from gptcli.tokenizers.text import strip_gutenberg, word_lines

BOOKS = ("pg1952_yellow_wallpaper.txt", "pg41_legend_of_sleepy_hollow.txt", "pg5200_metamorphosis.txt")


@pytest.fixture(scope="module")
def books(shared_data) -> list[Path]:
    return [shared_data / "books" / b for b in BOOKS]


def _cfg(inputs, out, **kw) -> PrepareConfig:
    base = dict(vocab_size=600, strip_gutenberg=True, val_fraction=0.3, workers=1)
    base.update(kw)
    return PrepareConfig(inputs=[str(i) for i in inputs], out=out, **base)


@pytest.fixture(scope="module")
def serial(books, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "corpus"
    return prepare(_cfg(books, out))


def _shard_hashes(manifest):
    return [(s["file"], s["sha256"]) for s in manifest["shards"]]


def test_output_layout_and_manifest(serial, books):
    out, m = serial.out, serial.manifest
    names = sorted(p.name for p in out.iterdir())
    assert names == [".gpt1-output", "manifest.json", "tokenizer", "train-00000.arrow", "val-00000.arrow"]
    assert not list(out.parent.glob(".corpus.*"))  # no temporary leftovers
    assert m["tool"]["name"] == "gpt1" and m["tool"]["version"]
    assert m["settings"]["vocab_size"] == 600 and m["settings"]["strip_gutenberg"] is True
    assert [i["sha256"] for i in m["inputs"]] == [sha256_file(b) for b in books]
    assert [i["bytes"] for i in m["inputs"]] == [b.stat().st_size for b in books]
    assert m["splits"]["val"]["documents"] == 1 and m["splits"]["train"]["documents"] == 2
    assert m["tokenizer"]["vocab_size"] == 600 and m["dtype"] == "uint16"
    for s in m["shards"]:
        assert sha256_file(out / s["file"]) == s["sha256"]
    corpus = open_corpus(out)
    assert corpus.verify() == []
    assert corpus.num_tokens("train") == m["splits"]["train"]["tokens"] > 10_000
    assert corpus.tokenizer.vocab_size == 600
    assert 2.0 < m["splits"]["train"]["text_bytes"] / m["splits"]["train"]["tokens"] < 6.0


def test_shards_hold_the_full_pipeline_encoding(serial, books):
    corpus = open_corpus(serial.out)
    tok = corpus.tokenizer
    docs = list(corpus.documents("train")) + list(corpus.documents("val"))
    expected = [tok.encode(strip_gutenberg(b.read_text(encoding="utf-8-sig"))[0]) for b in books]
    # every shard document is exactly the tokenizer's whole-document encoding (the pipeline cut it in chunks)
    assert sorted(d.tolist() for d in docs) == sorted(expected)
    # no Gutenberg boilerplate left, lowercased
    text = tok.decode(docs[0][:2000])
    assert "gutenberg" not in text and text == text.lower()


def test_parallel_equals_serial_and_is_deterministic(serial, books, tmp_path):
    # two workers and small work chunks (documents cut in many pieces) give byte-identical shards and tokenizer
    par = prepare(_cfg(books, tmp_path / "par", workers=2, chunk_bytes=20_000))
    assert _shard_hashes(par.manifest) == _shard_hashes(serial.manifest)
    assert par.manifest["tokenizer"]["model_sha256"] == serial.manifest["tokenizer"]["model_sha256"]
    again = prepare(_cfg(books, tmp_path / "again"))
    assert _shard_hashes(again.manifest) == _shard_hashes(serial.manifest)
    other_seed = prepare(_cfg(books, tmp_path / "seed", seed=5))
    assert _shard_hashes(other_seed.manifest) != _shard_hashes(serial.manifest)


def test_chunking_is_exact_even_with_html_state():
    doc = "Fish &amp; chips\nline two\n<b>tag</b> here\nmore &amp; more\n" * 3 + "end"
    whole = word_lines(doc)
    pieces = [word_lines(p, html_seen=seen) for p, seen, _ in text_chunks(doc, 10)]
    assert [line for p in pieces for line in p] == whole
    assert "fish & chips" in whole and "more & amp ; more" in whole  # unescaped only before the first "<"
    assert [last for *_, last in text_chunks(doc, 10)].count(True) == 1


def test_reuse_tokenizer(serial, books, tmp_path):
    rec = RecordingProgress()
    # vocab_size at its default (40,478): not set, so the reused tokenizer's own 600 ids are used.
    r = prepare(_cfg(books[:2], tmp_path / "reuse", tokenizer=serial.out, vocab_size=40478), rec)
    t = r.manifest["tokenizer"]
    assert t["learned"] is False and t["vocab_size"] == 600
    assert t["model_sha256"] == serial.manifest["tokenizer"]["model_sha256"]
    assert [s["name"] for s in rec.of("stage")] == ["scan", "words", "encode"]  # nothing to learn


def test_reused_tokenizer_refuses_learning_settings_that_disagree(serial, books, tmp_path, capsys):
    """They used to be ignored without a word (the tokenizer's 600 ids, uncased)."""
    reuse = dict(tokenizer=serial.out)
    with pytest.raises(
        GPT1Error,
        match=r"^--vocab-size 999 disagrees with the reused tokenizer .*, which has 600 ids "
        r"\(leave --vocab-size out",
    ):
        prepare(_cfg(books[:1], tmp_path / "a", vocab_size=999, **reuse))
    with pytest.raises(GPT1Error, match=r"^--cased disagrees with the reused tokenizer .*, which is uncased"):
        prepare(_cfg(books[:1], tmp_path / "b", cased=True, **reuse))
    # A value spelling the default is refused only when the caller says it was set (the command line does).
    with pytest.raises(GPT1Error, match=r"^--vocab-size 40478 disagrees"):
        prepare(_cfg(books[:1], tmp_path / "c", vocab_size=40478, **reuse), given={"vocab_size"})
    args = ["prepare", str(books[0]), "--tokenizer", str(serial.out), "--out", str(tmp_path / "d"), "-j", "1"]
    for extra, message in (
        (["--vocab-size", "40478"], "--vocab-size 40478 disagrees"),
        (["--no-cased", "--vocab-size", "500"], "--vocab-size 500 disagrees"),
    ):
        with pytest.raises(SystemExit) as e:
            main(args + extra)
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # refused before any work


def _by_stage(rec: RecordingProgress) -> dict[str, list[dict]]:
    """The advances of each stage, keyed by stage name (stages of prepare do not nest)."""
    out: dict[str, list[dict]] = {}
    current = None
    for kind, payload in rec.events:
        if kind == "stage":
            current = out.setdefault(payload["name"], [])
        elif kind == "end":
            current = None
        elif kind == "advance":
            assert current is not None, "an advance outside any stage"
            current.append(payload)
    return out


def test_progress_reports_stages_advances_and_warnings(bad_dir, tmp_path):
    rec = RecordingProgress()
    r = prepare(_cfg([bad_dir], tmp_path / "out", vocab_size=40, strip_gutenberg=False), progress=rec)
    m = r.manifest
    stages = rec.of("stage")
    assert [s["name"] for s in stages] == ["scan", "words", "learn BPE", "encode"]
    assert [s["unit"] for s in stages] == ["B", "B", "", "B"]
    assert stages[2]["total"] is None
    assert [k for k, _ in rec.events if k in ("stage", "end")] == ["stage", "end"] * 4  # each stage ended once
    input_bytes = sum(i["bytes"] for i in m["inputs"])
    assert stages[0]["total"] == stages[1]["total"] == input_bytes

    adv = _by_stage(rec)
    n_docs = sum(s["documents"] for s in m["splits"].values())
    n_tokens = sum(s["tokens"] for s in m["splits"].values())
    assert sum(a["n"] for a in adv["scan"]) == input_bytes and len(adv["scan"]) == len(m["inputs"])
    for name in ("scan", "words", "encode"):
        docs = [a["docs"] for a in adv[name]]
        assert docs == sorted(docs) and docs[-1] == n_docs  # running totals
    assert [a["docs"] for a in adv["encode"]] == list(range(1, n_docs + 1))
    tokens = [a["tokens"] for a in adv["encode"]]
    assert tokens == sorted(tokens) and tokens[-1] == n_tokens
    assert sum(a["n"] for a in adv["words"]) == sum(s["text_bytes"] for s in m["splits"].values())

    # every per-file problem is one warning, reported once (not again by the second read) and kept in the manifest
    notes = rec.of("note")
    assert [n["message"] for n in notes] == m["warnings"] and len(notes) == 6
    assert {n["level"] for n in notes} == {"warn"}


def test_progress_stages_end_when_prepare_fails(bad_dir, tmp_path):
    rec = RecordingProgress()
    with pytest.raises(DataError):
        prepare(_cfg([bad_dir / "good1.txt", bad_dir / "empty.txt"], tmp_path / "o", strict=True), rec)
    assert [k for k, _ in rec.events if k in ("stage", "end")] == ["stage", "end"]


def test_jsonl_and_parquet_inputs(tmp_path, books):
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = strip_gutenberg(books[0].read_text(encoding="utf-8-sig"))[0]
    paras = [p for p in text.split("\n\n") if p.strip()][:60]
    src = tmp_path / "in"
    src.mkdir()
    with open(src / "a.jsonl", "w") as f:
        for p in paras[:30]:
            f.write(json.dumps({"body": p, "id": 1}) + "\n")
    pq.write_table(pa.table({"body": paras[30:]}), src / "b.parquet")
    r = prepare(_cfg([src], tmp_path / "out", text_field="body", vocab_size=300, strip_gutenberg=False))
    assert [i["documents"] for i in r.manifest["inputs"]] == [30, len(paras) - 30]
    assert sum(s["documents"] for s in r.manifest["splits"].values()) == len(paras)
    assert r.manifest["warnings"] == []


@pytest.fixture
def bad_dir(tmp_path, books):
    d = tmp_path / "in"
    d.mkdir()
    (d / "good1.txt").write_text("The first good document.\nIt has two lines.\n")
    (d / "good2.txt").write_text("Another good document, quite short.\n")
    (d / "empty.txt").write_bytes(b"")
    (d / "blank.txt").write_text("   \n\n  \n")
    (d / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (d / "latin1.txt").write_bytes("caf\xe9 au lait\nna\xefve\n".encode("latin-1"))
    (d / "broken.txt").symlink_to(d / "does-not-exist.txt")
    (d / "bad.jsonl").write_text('{"text": "fine record"}\nnot json\n{"other": "x"}\n{"text": 3}\n')
    (d / "ignored.csv").write_text("a,b\n")
    return d


def test_bad_inputs_are_reported_and_skipped(bad_dir, tmp_path):
    r = prepare(_cfg([bad_dir], tmp_path / "out", vocab_size=40, strip_gutenberg=False))
    w = "\n".join(r.manifest["warnings"])
    assert f"{bad_dir / 'empty.txt'}: empty file" in w
    assert f"{bad_dir / 'blank.txt'}: no text in this file" in w
    assert f"{bad_dir / 'binary.txt'}: looks like a binary file" in w
    assert f"{bad_dir / 'latin1.txt'}:1: not valid UTF-8 (byte 0xe9 at offset 3)" in w
    assert f"{bad_dir / 'broken.txt'}: cannot read" in w
    assert f"{bad_dir / 'bad.jsonl'}:2: not valid JSON" in w and "(and 2 more bad lines)" in w
    assert len(r.manifest["inputs"]) == 8  # the .csv is not an input
    assert sum(s["documents"] for s in r.manifest["splits"].values()) == 3  # good1, good2, 1 jsonl record


@pytest.mark.parametrize(
    "name,message",
    [
        ("empty.txt", "empty file"),
        ("binary.txt", "binary"),
        ("latin1.txt", "not valid UTF-8"),
        ("broken.txt", "cannot read"),
        ("bad.jsonl", "not valid JSON"),
    ],
)
def test_strict_turns_warnings_into_errors(bad_dir, tmp_path, name, message):
    with pytest.raises(DataError, match=message) as e:
        inputs = [bad_dir / "good1.txt", bad_dir / "good2.txt", bad_dir / name]
        prepare(_cfg(inputs, tmp_path / "o", strict=True, strip_gutenberg=False))
    assert e.value.path == bad_dir / name
    assert not (tmp_path / "o").exists()


def test_zero_usable_documents_and_bad_paths(bad_dir, tmp_path):
    with pytest.raises(GPT1Error, match="no usable documents in 2 input files"):
        prepare(_cfg([bad_dir / "empty.txt", bad_dir / "binary.txt"], tmp_path / "o"))
    # one document of one line: nowhere to cut a validation tail (tests/data/test_prepare_one_file.py: the others)
    with pytest.raises(GPT1Error, match="only one usable document, on a single line"):
        prepare(_cfg([bad_dir / "good2.txt"], tmp_path / "o"))
    with pytest.raises(GPT1Error, match="no such file or directory"):
        resolve_inputs([tmp_path / "missing.txt"])
    with pytest.raises(GPT1Error, match="no files match"):
        resolve_inputs([str(tmp_path / "*.nothing")])
    with pytest.raises(GPT1Error, match="unsupported file type"):
        resolve_inputs([bad_dir / "ignored.csv"])
    assert resolve_inputs([str(bad_dir / "good*.txt")]) == [bad_dir / "good1.txt", bad_dir / "good2.txt"]
    assert not (tmp_path / "o").exists()


def test_existing_output_and_overwrite(bad_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    goods = [bad_dir / "good1.txt", bad_dir / "good2.txt"]
    for overwrite in (False, True):  # a folder gpt1 did not write is never replaced
        with pytest.raises(GPT1Error, match="not something gpt1 wrote"):
            prepare(_cfg(goods, out, vocab_size=40, overwrite=overwrite))
    assert (out / "keep.txt").read_text() == "x"
    (out / "keep.txt").unlink()
    prepare(_cfg(goods, out, vocab_size=40))  # an empty folder is fine
    with pytest.raises(GPT1Error, match="already holds a prepared corpus .*--overwrite"):
        prepare(_cfg(goods, out, vocab_size=40))
    first = (out / "manifest.json").read_text()
    prepare(_cfg(goods, out, vocab_size=40, seed=1, overwrite=True))
    assert (out / "manifest.json").read_text() != first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_failure_leaves_no_complete_looking_directory(bad_dir, tmp_path, monkeypatch):
    import gptcli.data.prepare as prep

    def boom(*a, **k):
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(prep, "write_manifest", boom)  # fails after every shard was written
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(_cfg([bad_dir / "good1.txt", bad_dir / "good2.txt"], tmp_path / "out", vocab_size=40))
    assert list(tmp_path.iterdir()) == [bad_dir]


def test_cli_prepare_inspect_and_checksum_mismatch(bad_dir, tmp_path, capsys):
    out = tmp_path / "c"
    args = ["prepare", str(bad_dir / "good1.txt"), str(bad_dir / "good2.txt"), "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        main(args + ["--vocab-size", "40", "--workers", "1"])
    assert e.value.code == 0
    assert "prepared" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 1 and "already holds a prepared corpus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(out)])
    text = capsys.readouterr().out
    assert e.value.code == 0 and "all 2 shard checksums match" in text and "bytes/token" in text
    shard = out / "train-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--inspect", str(out)])
    captured = capsys.readouterr()
    assert e.value.code == 1
    assert "checksum mismatch" in captured.out and "1 of 2 shards failed verification" in captured.err


def test_many_small_documents_parallel_equals_serial(tmp_path):
    # .jsonl records far smaller than a work unit travel in batches; order and content must not change
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    with open(tmp_path / "small.jsonl", "w") as f:
        for i in range(400):
            f.write(json.dumps({"text": " ".join(words[(i + k) % len(words)] for k in range(i % 9 + 1))}) + "\n")
    kw = dict(vocab_size=40, strip_gutenberg=False, val_fraction=0.05, chunk_bytes=500)
    one = prepare(_cfg([tmp_path / "small.jsonl"], tmp_path / "one", **kw))
    two = prepare(_cfg([tmp_path / "small.jsonl"], tmp_path / "two", workers=2, **kw))
    assert _shard_hashes(one.manifest) == _shard_hashes(two.manifest)
    assert one.manifest["splits"]["val"]["documents"] == 20
    corpus = open_corpus(two.out)
    tok = corpus.tokenizer
    first = next(iter(corpus.documents("train")))
    assert tok.decode(first) == "alpha"


def test_cli_config_file(bad_dir, tmp_path, capsys):
    cfg = tmp_path / "prep.toml"
    cfg.write_text(
        f'inputs = ["{bad_dir / "good1.txt"}", "{bad_dir / "good2.txt"}"]\nvocab_size = 40\nworkers = 1\n'
        "val_fraction = 0.5\n"
    )
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--config", str(cfg), "--out", str(tmp_path / "c"), "--seed", "3"])
    assert e.value.code == 0
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["settings"]["vocab_size"] == 40 and m["settings"]["seed"] == 3 and m["tokenizer"]["vocab_size"] == 40
    cfg.write_text("vocab_sise = 40\n")
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--config", str(cfg), "--out", str(tmp_path / "d")])
    assert e.value.code == 1 and "unknown setting vocab_sise" in capsys.readouterr().err
