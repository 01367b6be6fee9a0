"""Issue #17, data loss 2 and 3: `gpt1 prepare --overwrite` replaces only a corpus gpt1 prepared, never its inputs
or a folder of someone's files; a replacement that fails or is interrupted leaves the old corpus whole."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from gptcli.cli import main
from gptcli.files.outputs import kind_of
from tests.faults.conftest import cli_text as gpt1
from tests.faults.conftest import snapshot

PREP = ["--vocab-size", "120", "--workers", "1"]


def write_books(d: Path, data: Path) -> Path:
    """Two short real books (4,000 characters of each Gutenberg text)."""
    d.mkdir(parents=True)
    for name in ("pg11_alice_in_wonderland.txt", "pg84_frankenstein.txt"):
        text = (data / "books" / name).read_text(encoding="utf-8-sig")[2000:6000]
        (d / name).write_text(text, encoding="utf-8")
    return d


@pytest.fixture
def books(shared_data, tmp_path) -> Path:
    return write_books(tmp_path / "library" / "books", shared_data)


@pytest.fixture(scope="module")
def prepared(shared_data, tmp_path_factory) -> tuple[Path, Path]:
    """(books, a corpus prepared from them by the CLI)."""
    root = tmp_path_factory.mktemp("prepared")
    src = write_books(root / "books", shared_data)
    out = root / "corpus"
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(src), "--out", str(out), *PREP])
    assert e.value.code == 0
    return src, out


def no_leftovers(d: Path) -> bool:
    return not [p for p in d.iterdir() if p.name.startswith(".")]


def test_out_is_the_input_directory(books, capsys):
    before = snapshot(books)
    code, text = gpt1(capsys, "prepare", books, "--out", books, "--overwrite", *PREP)
    assert code == 1 and "is the input" in text and "choose an --out outside the inputs" in text
    assert snapshot(books) == before and no_leftovers(books.parent)


def test_out_is_the_parent_of_the_input(books, capsys):
    library = books.parent
    (library / "catalogue.txt").write_text("my catalogue of the library\n")
    before = snapshot(library)
    code, text = gpt1(capsys, "prepare", books, "--out", library, "--overwrite", *PREP)
    assert code == 1 and "contains the input" in text
    assert snapshot(library) == before


def test_out_inside_an_input_directory(books, capsys):
    before = snapshot(books)
    code, text = gpt1(capsys, "prepare", books, "--out", books / "corpus", *PREP)
    assert code == 1 and "is inside the input" in text
    assert snapshot(books) == before and not (books / "corpus").exists()


def test_out_holding_the_files_of_a_glob(books, capsys):
    before = snapshot(books)
    code, text = gpt1(capsys, "prepare", f"{books}/*.txt", "--out", books, "--overwrite", *PREP)
    assert code == 1 and "contains the input" in text
    assert snapshot(books) == before


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_folder_of_unrelated_files_is_refused(books, tmp_path, capsys, overwrite):
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work\n")
    (notes / ".hidden").write_bytes(b"\x00\x01")
    before = snapshot(notes)
    code, text = gpt1(capsys, "prepare", books, "--out", notes, *overwrite, *PREP)
    assert code == 1 and "is not something gpt1 wrote; refusing to touch it" in text
    assert snapshot(notes) == before


def test_a_reused_tokenizer_is_an_input(prepared, capsys):
    src, corpus = prepared
    before = snapshot(corpus)
    code, text = gpt1(capsys, "prepare", src, "--tokenizer", corpus, "--out", corpus, "--overwrite", *PREP)
    assert code == 1 and "is the input" in text
    assert snapshot(corpus) == before


def test_a_corpus_needs_overwrite_and_is_then_replaced(prepared, tmp_path, capsys):
    src, made = prepared
    corpus = tmp_path / "corpus"
    shutil.copytree(made, corpus)
    before = snapshot(corpus)
    code, text = gpt1(capsys, "prepare", src, "--out", corpus, *PREP)
    assert code == 1 and "already holds a prepared corpus (pass --overwrite" in text
    assert snapshot(corpus) == before
    code, text = gpt1(capsys, "prepare", src, "--out", corpus, "--overwrite", "--seed", "1", *PREP)
    assert code == 0, text
    assert snapshot(corpus) != before and kind_of(corpus) == "corpus"
    assert '"seed": 1' in (corpus / "manifest.json").read_text()
    assert no_leftovers(tmp_path)


@pytest.mark.parametrize(
    "fault, exit_code", [(OSError(errno.ENOSPC, "No space left on device"), 1), (KeyboardInterrupt(), 130)]
)
def test_the_old_corpus_survives_a_failed_or_interrupted_replacement(
    prepared, tmp_path, capsys, monkeypatch, fault, exit_code
):
    import gptcli.data.prepare as prep

    src, made = prepared
    corpus = tmp_path / "corpus"
    shutil.copytree(made, corpus)
    before = snapshot(corpus)

    def late_failure(*a, **k):  # after every shard of the new corpus was written
        raise fault

    monkeypatch.setattr(prep, "write_manifest", late_failure)
    code, text = gpt1(capsys, "prepare", src, "--out", corpus, "--overwrite", "--seed", "2", *PREP)
    assert code == exit_code
    assert "Traceback" not in text
    assert snapshot(corpus) == before and no_leftovers(tmp_path)
