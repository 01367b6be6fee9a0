"""Any text in: a single file prepares (its validation split is the document's tail, disjoint from training),
``--split-by`` cuts a text file into documents (paragraphs, lines, WikiText articles), and the result inspects and
pretrains."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from gptcli.cli import main
from gptcli.data.documents import split_text, tail_cut
from gptcli.data.prepare import PrepareConfig, prepare
from gptcli.data.shards import open_corpus
from gptcli.train.pretrain import PretrainConfig, pretrain

MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 32}


def _cfg(inputs, out, **kw) -> PrepareConfig:
    return PrepareConfig(inputs=[str(i) for i in inputs], out=out, **{"vocab_size": 400, "workers": 1, **kw})


@pytest.fixture(scope="module")
def shakespeare(shared_data) -> Path:
    return shared_data / "tinyshakespeare" / "input.txt"


@pytest.fixture(scope="module")
def one_file(shakespeare, tmp_path_factory):
    return prepare(_cfg([shakespeare], tmp_path_factory.mktemp("shakespeare") / "corpus"))


def _docs(corpus, split):
    return [d.tolist() for d in corpus.documents(split)]


def test_one_file_is_cut_into_a_training_head_and_a_validation_tail(one_file, shakespeare):
    m = one_file.manifest
    assert m["settings"]["validation"] == "tail" and m["settings"]["split_by"] == "file"
    assert m["inputs"][0]["documents"] == 1
    assert m["splits"]["train"]["documents"] == m["splits"]["val"]["documents"] == 1
    corpus = open_corpus(one_file.out)
    tok = corpus.tokenizer
    [train], [val] = _docs(corpus, "train"), _docs(corpus, "val")
    # Found by content, not by asking prepare where it cut: the raw line where the tail starts is the one whose
    # text from there on encodes to the validation document; everything before it encodes to the training one.
    text = shakespeare.read_text(encoding="utf-8")
    first_line = val[: val.index(tok.newline_id)]
    starts = [i + 1 for i, c in enumerate(text) if c == "\n" and len(text) - i < 0.05 * len(text)]
    starts = [s for s in starts if text[s : s + 1].strip() and tok.encode(text[s : text.index("\n", s)]) == first_line]
    tail_starts = [s for s in starts if tok.encode(text[s:]) == val]
    assert len(tail_starts) == 1, tail_starts
    at = tail_starts[0]
    assert tok.encode(text[:at]) == train  # head + tail = the whole file, each character in exactly one split
    assert 0.005 < (len(text) - at) / len(text) < 0.015  # about val_fraction (1%) of the characters
    assert text[:at].endswith("\n\n")  # cut at a paragraph break (a speech ends), not inside one


def test_one_file_is_the_same_whatever_the_worker_count(shared_data, tmp_path):
    book = shared_data / "books" / "pg1952_yellow_wallpaper.txt"
    runs = [
        prepare(_cfg([book], tmp_path / f"w{w}", workers=w, chunk_bytes=5_000, strip_gutenberg=True, val_fraction=0.1))
        for w in (1, 2)
    ]
    hashes = [[(s["file"], s["sha256"]) for s in r.manifest["shards"]] for r in runs]
    assert hashes[0] == hashes[1]
    assert runs[0].manifest["tokenizer"]["model_sha256"] == runs[1].manifest["tokenizer"]["model_sha256"]
    assert runs[0].manifest["splits"]["val"]["documents"] == 1


def test_one_file_inspects_and_pretrains(one_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(one_file.out)])
    assert e.value.code in (0, None), capsys.readouterr().err
    assert "val" in capsys.readouterr().out
    res = pretrain(
        PretrainConfig(
            data=one_file.out,
            out=tmp_path / "run",
            preset="tiny",
            model=dict(MODEL),
            seq_len=32,
            batch_size=8,
            max_steps=6,
            warmup_steps=2,
            lr=3e-3,
            eval_every=0,
            eval_batches=4,
            save_every=0,
            log_every=3,
            device="cpu",
            precision="fp32",
            peak_flops=1e11,
        )
    )
    assert res.step == 6 and res.final_val_loss is not None and math.isfinite(res.final_val_loss)
    assert res.final_val_loss < math.log(400)  # 6 updates already beat a uniform guess over the 400 ids


def _titles(path: Path) -> list[str]:
    """WikiText article titles counted without prepare's pattern: ' = Title = ' lines that are not ' = = ...'."""
    out = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        s = line.strip()
        if s.startswith("= ") and s.endswith(" =") and not s.startswith("= =") and not s.endswith("= ="):
            out.append(line)
    return out


def test_wikitext_file_splits_into_its_articles(shared_data, tmp_path):
    src = shared_data / "wikitext-2" / "wiki.valid.tokens"  # a .tokens file named directly is read as text
    titles = _titles(src)
    assert len(titles) > 50
    r = prepare(_cfg([src], tmp_path / "wiki", split_by="wikitext", val_fraction=0.05))
    m = r.manifest
    assert m["inputs"][0]["documents"] == len(titles) and m["settings"]["validation"] == "documents"
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == len(titles)
    assert m["splits"]["val"]["documents"] == round(0.05 * len(titles))
    corpus = open_corpus(r.out)
    tok = corpus.tokenizer
    firsts = sorted(tuple(d[: d.index(tok.newline_id)]) for d in _docs(corpus, "train") + _docs(corpus, "val"))
    assert firsts == sorted(tuple(tok.encode(t)) for t in titles)  # every document starts with its own title


def test_split_text_paragraphs_lines_and_articles():
    text = "one a\r\none b\r\n\r\n  \r\ntwo\n\n\nthree\n"
    assert list(split_text(text, "file")) == [text]
    assert list(split_text(text, "paragraph")) == ["one a\r\none b\r", "two", "three\n"]
    assert list(split_text(text, "line")) == ["one a\r", "one b\r", "two", "three"]
    wiki = "preface\n = A = \n a text \n = = Sub = = \n more \n\n = B = \n b text \n"
    assert list(split_text(wiki, "wikitext")) == [
        "preface",
        " = A = \n a text \n = = Sub = = \n more \n",
        " = B = \n b text \n",
    ]


def test_tail_cut_prefers_a_paragraph_break_near_the_target():
    text = "".join(f"line {i}\n" + ("\n" if i % 10 == 9 else "") for i in range(100))
    at = tail_cut(text, 0.1)
    assert text[:at].endswith("\n\n") and text[at:].startswith("line 90\n")
    no_paragraphs = "".join(f"line {i}\n" for i in range(100))
    assert no_paragraphs[tail_cut(no_paragraphs, 0.1) :].startswith("line 90\n")
    assert tail_cut("a single line with no break", 0.1) is None
    assert tail_cut("\n\ntext only after breaks\n\n", 0.5) is None  # no cut leaves text on both sides


def test_one_line_document_is_refused_and_split_by_line_rescues_it(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("alpha beta gamma delta. " * 50, encoding="utf-8")
    with pytest.raises(Exception, match="only one usable document, on a single line"):
        prepare(_cfg([f], tmp_path / "o", vocab_size=40))
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"record {i} alpha beta\n" for i in range(20)), encoding="utf-8")
    r = prepare(_cfg([lines], tmp_path / "l", vocab_size=40, split_by="line", val_fraction=0.1))
    assert r.manifest["splits"]["train"]["documents"] == 18 and r.manifest["splits"]["val"]["documents"] == 2


def test_cli_split_by(tmp_path, capsys):
    src = tmp_path / "stories.txt"
    src.write_text("".join(f"Story {i} begins.\nIt ends.\n\n" for i in range(10)), encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main(
            [
                "prepare",
                str(src),
                "--split-by",
                "paragraph",
                "--vocab-size",
                "40",
                "-j",
                "1",
                "--out",
                str(tmp_path / "c"),
                "--val-fraction",
                "0.2",
            ]
        )
    assert e.value.code in (0, None), capsys.readouterr().err
    assert open_corpus(tmp_path / "c").manifest["splits"]["val"]["documents"] == 2
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(src), "--split-by", "chapter", "--out", str(tmp_path / "d")])
    assert e.value.code == 2  # a usage error: the choices are listed by --help
    shutil.rmtree(tmp_path / "c")
