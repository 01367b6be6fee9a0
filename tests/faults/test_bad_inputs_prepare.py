"""`gpt1 prepare` on inputs a user really has: empty, binary and latin-1 files, a folder of nothing usable, .jsonl and
.parquet files with bad rows or not .jsonl/.parquet at all, a --text-field the records lack.

Alone, each bad input is a one-line error (exit 1) and leaves nothing behind: no output directory, no hidden
``.out.partial-*``. Beside good inputs it is a warning that names the file, and the corpus is made from the rest;
with ``--strict`` the warning becomes that one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import assert_nothing_new, gpt1, tree

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up.\n" * 20


def _parquet(path: Path, columns: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def _write(d: Path, name: str) -> Path:
    """One bad input, by name."""
    p = d / name
    if name == "empty.txt":
        p.write_bytes(b"")
    elif name == "blank.txt":
        p.write_text(" \n\t\n\n")
    elif name == "binary.txt":
        p.write_bytes(bytes(range(256)) * 8)
    elif name == "latin1.txt":
        p.write_bytes("Caf\xe9 cr\xe8me, na\xefve fa\xe7ade.\n".encode("latin-1") * 20)
    elif name == "utf16.txt":
        p.write_bytes(TEXT.encode("utf-16"))
    elif name == "bad-rows.jsonl":
        p.write_text('not json\n{"text": 3}\n{"other": "x"}\n[1, 2]\n{"text": null}\n')
    elif name == "not-json.jsonl":
        p.write_bytes(bytes(range(256)) * 4)
    elif name == "bad-rows.parquet":
        _parquet(p, {"text": [None, None]})
    elif name == "numbers.parquet":
        _parquet(p, {"text": [1, 2, 3]})
    elif name == "no-text-column.parquet":
        _parquet(p, {"body": [TEXT, TEXT]})
    elif name == "not-parquet.parquet":
        p.write_text(TEXT)
    elif name == "truncated.parquet":
        _parquet(p, {"text": [TEXT] * 5})
        p.write_bytes(p.read_bytes()[:-40])
    else:  # pragma: no cover
        raise ValueError(name)
    return p


BAD = (
    "empty.txt",
    "blank.txt",
    "binary.txt",
    "latin1.txt",
    "utf16.txt",
    "bad-rows.jsonl",
    "not-json.jsonl",
    "bad-rows.parquet",
    "numbers.parquet",
    "no-text-column.parquet",
    "not-parquet.parquet",
    "truncated.parquet",
)


def _prepare(inputs, out: Path, *extra: str) -> list:
    return ["prepare", *inputs, "--out", out, "--vocab-size", "40", "--workers", "1", "--val-fraction", "0.3", *extra]


def _goods(d: Path) -> list[Path]:
    goods = []
    for i in range(3):
        goods.append(d / f"good{i}.txt")
        goods[-1].write_text(TEXT + f"document {i}\n")
    return goods


@pytest.mark.parametrize("name", BAD)
def test_a_bad_input_alone_is_a_one_line_error(name, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    bad = _write(inputs, name)
    before = tree(tmp_path)
    res = gpt1(_prepare([bad], tmp_path / "out"), capsys)
    assert_one_line_error(res, "no usable documents")
    assert name in res.err  # the warning above the error says which file and why
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("name", BAD)
def test_a_bad_input_beside_good_ones_is_skipped_with_a_warning(name, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    goods = _goods(inputs)
    _write(inputs, name)
    res = gpt1(_prepare([inputs], tmp_path / "out"), capsys)
    assert res.code == 0 and "Traceback" not in res.err, res.err[-3000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert any(name in w for w in manifest["warnings"]), manifest["warnings"]
    assert sum(s["documents"] for s in manifest["splits"].values()) == len(goods)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # no temporary left beside it


@pytest.mark.parametrize("name", BAD)
def test_strict_turns_a_bad_input_into_a_one_line_error(name, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    _goods(inputs)
    _write(inputs, name)
    before = tree(tmp_path)
    res = gpt1(_prepare([inputs], tmp_path / "out", "--strict"), capsys)
    assert_one_line_error(res, name)
    assert_nothing_new(tmp_path, before)


def test_a_directory_of_nothing_usable(tmp_path, capsys):
    inputs = tmp_path / "in"
    (inputs / "sub").mkdir(parents=True)
    (inputs / "notes.md").write_text(TEXT)
    (inputs / "table.csv").write_text("a,b\n1,2\n")
    (inputs / "sub" / "image.png").write_bytes(b"\x89PNG\r\n")
    before = tree(tmp_path)
    res = gpt1(_prepare([inputs], tmp_path / "out"), capsys)
    assert_one_line_error(res, str(inputs), "no .txt, .jsonl or .parquet file")
    assert_nothing_new(tmp_path, before)
    # ... and one whose only usable-looking files are all empty
    for i in range(3):
        (inputs / f"empty{i}.txt").write_bytes(b"")
    before = tree(tmp_path)
    res = gpt1(_prepare([inputs], tmp_path / "out"), capsys)
    assert_one_line_error(res, "no usable documents in 3 input files")
    assert_nothing_new(tmp_path, before)


def test_a_text_field_the_records_lack(tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    with open(inputs / "docs.jsonl", "w") as f:
        for i in range(5):
            f.write(json.dumps({"text": TEXT + str(i)}) + "\n")
    _parquet(inputs / "docs.parquet", {"text": [TEXT + "p1", TEXT + "p2"]})
    before = tree(tmp_path)
    res = gpt1(_prepare([inputs], tmp_path / "out", "--text-field", "body"), capsys)
    assert_one_line_error(res, "no usable documents")
    assert "body" in res.err  # the warnings say which field was missing
    assert_nothing_new(tmp_path, before)
    res = gpt1(_prepare([inputs], tmp_path / "out"), capsys)  # the control: the default field works
    assert res.code == 0, res.err[-3000:]


@pytest.mark.parametrize(
    "spec,message",
    [
        ("missing.txt", "no such file or directory"),
        ("*.nothing", "no files match"),
        ("table.csv", "unsupported file type"),
    ],
)
def test_inputs_that_name_nothing(spec, message, tmp_path, capsys):
    (tmp_path / "table.csv").write_text("a,b\n")
    before = tree(tmp_path)
    res = gpt1(_prepare([tmp_path / spec], tmp_path / "out"), capsys)
    assert_one_line_error(res, message)
    assert_nothing_new(tmp_path, before)


def test_an_input_appended_to_while_it_is_read_is_refused(tmp_path, capsys, monkeypatch):
    # A log being written: after the scan counted its one document, more lines arrive. Once, this exited 0 with a
    # manifest matching neither what was encoded nor the file, and a validation tail of most of the tokens.
    import gptcli.data.prepare as prepare_module

    book = tmp_path / "book.txt"
    book.write_text(TEXT)
    real = prepare_module.iter_documents
    appended = []

    def growing(path, cfg, problem):
        yield from real(path, cfg, problem)
        if not appended:  # after the first full read, another writer appends to the file
            appended.append(True)
            with open(path, "a", encoding="utf-8") as f:
                f.write("A line written while prepare was reading.\n" * 200)

    monkeypatch.setattr(prepare_module, "iter_documents", growing)
    before = tree(tmp_path)
    res = gpt1(_prepare([book], tmp_path / "out"), capsys)
    assert_one_line_error(res, str(book), "changed while prepare read it", "bytes", "a copy")
    assert_nothing_new(tmp_path, before)


def test_a_whole_document_taking_most_tokens_as_validation_is_a_warning(tmp_path, capsys):
    """Two books and --val-fraction 0.1: one whole book is held out, half the tokens, not a tenth. Said in one line
    (kept in the manifest); cut into paragraphs, the same books give a validation split near the fraction asked."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(2):
        paragraphs = [f"Paragraph {j} of book {i}. " + TEXT.strip() for j in range(20)]
        (inputs / f"book{i}.txt").write_text("\n\n".join(paragraphs) + "\n")
    res = gpt1(["prepare", inputs, "--out", tmp_path / "whole", "--vocab-size", "80", "--workers", "1"], capsys)
    assert res.code == 0 and "Traceback" not in res.err, res.err[-3000:]
    warned = [x for x in res.err.splitlines() if x.startswith("warning: ") and "validation split holds" in x]
    assert len(warned) == 1 and "--split-by paragraph" in warned[0], res.err[-3000:]
    manifest = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert any("validation split holds" in w for w in manifest["warnings"]), manifest["warnings"]

    args = ["--vocab-size", "80", "--workers", "1", "--val-fraction", "0.1", "--split-by", "paragraph"]
    res = gpt1(["prepare", inputs, "--out", tmp_path / "paragraphs", *args], capsys)
    assert res.code == 0 and "validation split holds" not in res.err, res.err[-3000:]
