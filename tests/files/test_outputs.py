"""outputs.py: --overwrite replaces only what gpt1 wrote, and never an input of the same command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptcli.errors import GPT1Error
from gptcli.files.outputs import check_output, kind_of, mark


def _marked(path: Path, kind: str) -> Path:
    path.mkdir(parents=True)
    mark(path, kind)
    (path / "manifest.json").write_text("x")  # a file a corpus has
    return path


def test_a_new_or_empty_output_is_fine(tmp_path: Path) -> None:
    check_output(tmp_path / "new", "corpus", overwrite=False)
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", "corpus", overwrite=False)


def test_gpt1_output_needs_overwrite_and_the_right_kind(tmp_path: Path) -> None:
    corpus = _marked(tmp_path / "corpus", "corpus")
    with pytest.raises(GPT1Error, match="already holds a prepared corpus .*--overwrite"):
        check_output(corpus, "corpus", overwrite=False)
    check_output(corpus, "corpus", overwrite=True)
    with pytest.raises(GPT1Error, match="holds a prepared corpus, not a Hugging Face export; refusing"):
        check_output(corpus, "hf-export", overwrite=True)


def test_a_folder_gpt1_did_not_write_is_never_replaced(tmp_path: Path) -> None:
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work")
    with pytest.raises(GPT1Error, match="not something gpt1 wrote; refusing to touch it"):
        check_output(notes, "corpus", overwrite=True)


def test_output_may_not_contain_or_sit_inside_an_input(tmp_path: Path) -> None:
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("text")
    with pytest.raises(GPT1Error, match="is the input"):
        check_output(books, "corpus", overwrite=True, inputs=[books])
    with pytest.raises(GPT1Error, match="contains the input"):
        check_output(tmp_path, "corpus", overwrite=True, inputs=[books / "a.txt"])
    with pytest.raises(GPT1Error, match="is inside the input"):
        check_output(books / "out", "corpus", overwrite=True, inputs=[books])


def test_a_file_is_not_an_output_directory(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(GPT1Error, match="is a file"):
        check_output(f, "corpus", overwrite=True)


def test_only_a_marker_or_a_runs_checkpoint_is_recognised(tmp_path: Path) -> None:
    """File names are no evidence (a folder of the user's, a model from the Hub): a marker is, and so is a
    gpt1 checkpoint's own config.json (training writes step checkpoints without a marker)."""
    corpus = tmp_path / "corpus"
    (corpus / "tokenizer").mkdir(parents=True)
    (corpus / "manifest.json").write_text("{}")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"format": 1, "model": {}}))
    (ck / "model.safetensors").write_bytes(b"")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "openai-gpt"}))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text('data = "corpus"\n')
    assert [kind_of(d) for d in (corpus, ck, hf, run, tmp_path / "nothing")] == [None, "checkpoint", None, None, None]


def test_what_the_user_added_to_an_output_is_never_replaced_with_it(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    mark(corpus, "corpus")
    for name in ("manifest.json", "train-00000.arrow", ".manifest.json.tmp-1a2b", ".tokenizer.partial-9-ab"):
        (corpus / name).write_text("x")
    (corpus / "tokenizer").mkdir()
    check_output(corpus, "corpus", overwrite=True)  # all gpt1's, leftovers of an interrupted write included
    check_output(corpus, "corpus", overwrite=True, replacing=False)
    (corpus / "NOTES.md").write_text("mine")
    (corpus / ".git").mkdir()
    with pytest.raises(
        GPT1Error,
        match=r"files gpt1 did not write \(\.git, NOTES\.md\); replacing it would "
        r"delete them \(move them out of",
    ):
        check_output(corpus, "corpus", overwrite=True)
    check_output(corpus, "corpus", overwrite=True, replacing=False)  # a run that writes in place keeps them


def test_a_zeroshot_curve_owns_its_marked_per_checkpoint_folders(tmp_path: Path) -> None:
    curve = tmp_path / "curve"
    curve.mkdir()
    mark(curve, "zeroshot")
    (curve / "curve.json").write_text("{}")
    step = curve / "step-0000100"
    step.mkdir()
    mark(step, "zeroshot")
    check_output(curve, "zeroshot", overwrite=True)
    (step / "notes.txt").write_text("mine")  # inside the marked subfolder: the user's all the same
    with pytest.raises(GPT1Error, match=r"did not write \(step-0000100\)"):
        check_output(curve, "zeroshot", overwrite=True)
    (step / "notes.txt").unlink()
    (curve / "mine").mkdir()  # an unmarked folder is the user's
    with pytest.raises(GPT1Error, match=r"did not write \(mine\)"):
        check_output(curve, "zeroshot", overwrite=True)


def test_a_damaged_marker_counts_as_not_ours(tmp_path: Path) -> None:
    d = _marked(tmp_path / "d", "corpus")
    (d / ".gpt1-output").write_text("{broken")
    with pytest.raises(GPT1Error, match="not something gpt1 wrote"):
        check_output(d, "corpus", overwrite=True)
