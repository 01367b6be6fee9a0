"""outputs.py: --overwrite replaces only what gpt1 wrote, and never an input of the same command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptcli.errors import GPT1Error
from gptcli.outputs import check_output, kind_of, mark


def _marked(path: Path, kind: str) -> Path:
    path.mkdir(parents=True)
    mark(path, kind)
    (path / "payload").write_text("x")
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


def test_outputs_from_before_markers_are_recognised(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "tokenizer").mkdir(parents=True)
    (corpus / "manifest.json").write_text("{}")
    assert kind_of(corpus) == "corpus"
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"format": 1, "model": {}}))
    (ck / "model.safetensors").write_bytes(b"")
    assert kind_of(ck) == "checkpoint"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "openai-gpt"}))
    assert kind_of(hf) == "hf-export"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text('data = "corpus"\n')
    assert kind_of(run) == "pretrain-run"
    (run / "config.toml").write_text('task = "rte"\n')
    assert kind_of(run) == "finetune-run"
    assert kind_of(tmp_path / "nothing") is None


def test_a_damaged_marker_counts_as_not_ours(tmp_path: Path) -> None:
    d = _marked(tmp_path / "d", "corpus")
    (d / ".gpt1-output").write_text("{broken")
    with pytest.raises(GPT1Error, match="not something gpt1 wrote"):
        check_output(d, "corpus", overwrite=True)
