"""Issue #17, data loss 1 and 3, and item 11: `gpt1 convert --overwrite` replaces only an earlier conversion's
output of the same kind, never its source (a run, a checkpoint, a release) or a folder of someone's files; a
release whose width the default --n-head does not divide is a one-line error."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gptcli.cli import main
from gptcli.files.outputs import MARKER, kind_of
from tests.faults.conftest import cli_text as gpt1
from tests.faults.conftest import snapshot

TINY = [
    "--preset",
    "tiny",
    "--n-layer",
    "1",
    "--n-embd",
    "32",
    "--n-head",
    "2",
    "--n-inner",
    "128",
    "--n-ctx",
    "32",
    "--seq-len",
    "32",
    "--batch-size",
    "4",
    "--warmup-steps",
    "1",
    "--eval-batches",
    "1",
    "--device",
    "cpu",
    "--precision",
    "fp32",
    "--quiet",
]


@pytest.fixture(scope="module")
def made(shared_data, tmp_path_factory) -> Path:
    """A real pretraining run (learned tokenizer, two updates) made through the CLI, and its HF export."""
    root = tmp_path_factory.mktemp("made")
    books = root / "books"
    books.mkdir()
    for name in ("pg11_alice_in_wonderland.txt", "pg84_frankenstein.txt"):
        text = (shared_data / "books" / name).read_text(encoding="utf-8-sig")[2000:6000]
        (books / name).write_text(text, encoding="utf-8")
    for args in (
        ["prepare", books, "--out", root / "corpus", "--vocab-size", "120", "--workers", "1"],
        ["pretrain", "--data", root / "corpus", "--out", root / "run", *TINY, "--max-steps", "2"],
        ["convert", root / "run", "--to", "hf", "--out", root / "hf"],
    ):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        assert e.value.code == 0, args
    return root


@pytest.fixture
def run(made, tmp_path) -> Path:
    shutil.copytree(made / "run", tmp_path / "run")
    return tmp_path / "run"


def test_export_over_its_own_run_is_refused_and_the_run_survives_whole(run, capsys):
    before = snapshot(run)
    assert any(k.endswith("optimizer.safetensors") for k in before)  # a resumable run, learned tokenizer and all
    code, text = gpt1(capsys, "convert", run, "--to", "hf", "--out", run, "--overwrite")
    assert code == 1 and "is the input" in text and "warning" not in text
    assert snapshot(run) == before
    assert [p.name for p in run.parent.iterdir()] == ["run"]  # no temporary leftovers either


def test_export_into_a_checkpoint_of_the_run_or_around_it_is_refused(run, capsys):
    before = snapshot(run.parent)
    ckpt = next((run / "checkpoints").iterdir())
    code, text = gpt1(capsys, "convert", ckpt, "--to", "hf", "--out", ckpt, "--overwrite")
    assert code == 1 and "is the input" in text
    code, text = gpt1(capsys, "convert", ckpt, "--to", "hf", "--out", run, "--overwrite")
    assert code == 1 and "contains the input" in text
    code, text = gpt1(capsys, "convert", run, "--to", "hf", "--out", run / "hf")
    assert code == 1 and "is inside the input" in text
    assert snapshot(run.parent) == before


def test_nothing_is_written_into_a_runs_checkpoints_folder(made, run, capsys):
    """A converted checkpoint there (over a step checkpoint, or beside them) is what --resume would pick next, and
    it has no optimizer or training state: the run could no longer be resumed."""
    before = snapshot(run)
    step = next((run / "checkpoints").iterdir())
    for out, extra in ((step, ["--overwrite"]), (run / "checkpoints" / "step-9999999", [])):
        code, text = gpt1(capsys, "convert", "--from", "hf", made / "hf", "--out", out, *extra)
        assert code == 1 and "checkpoints folder of a pretraining run" in text, text
    assert snapshot(run) == before


def test_a_model_downloaded_from_the_hub_is_never_taken_for_an_export(made, tmp_path, capsys):
    """An unmarked folder with a Hugging Face config.json is the user's (a downloaded model), not gpt1's export."""
    mine = tmp_path / "my-openai-gpt"
    shutil.copytree(made / "hf", mine)
    (mine / MARKER).unlink()
    (mine / "README.md").write_text("card")
    before = snapshot(mine)
    code, text = gpt1(capsys, "convert", made / "run", "--to", "hf", "--out", mine, "--overwrite")
    assert code == 1 and "not something gpt1 wrote" in text
    assert snapshot(mine) == before


def test_import_over_its_source_is_refused(made, tmp_path, capsys):
    hf = tmp_path / "hf"
    shutil.copytree(made / "hf", hf)
    before = snapshot(hf)
    code, text = gpt1(capsys, "convert", "--from", "hf", hf, "--out", hf, "--overwrite")
    assert code == 1 and "is the input" in text
    assert snapshot(hf) == before


@pytest.mark.parametrize("direction", ["to-hf", "from-hf"])
def test_a_folder_of_unrelated_files_is_refused(made, tmp_path, capsys, direction):
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work\n")
    before = snapshot(notes)
    args = ["--to", "hf", made / "run"] if direction == "to-hf" else ["--from", "hf", made / "hf"]
    for overwrite in ([], ["--overwrite"]):
        code, text = gpt1(capsys, "convert", *args, "--out", notes, *overwrite)
        assert code == 1 and "not something gpt1 wrote; refusing to touch it" in text
    assert snapshot(notes) == before


def test_another_kind_of_gpt1_output_is_refused(made, run, tmp_path, capsys):
    before = snapshot(run)
    code, text = gpt1(capsys, "convert", "--from", "hf", made / "hf", "--out", run, "--overwrite")
    assert code == 1 and "holds a pretraining run, not a checkpoint" in text
    code, text = gpt1(capsys, "convert", made / "run", "--to", "hf", "--out", made / "corpus", "--overwrite")
    assert code == 1 and "holds a prepared corpus, not a Hugging Face export" in text
    assert snapshot(run) == before


def test_an_earlier_export_or_import_is_replaced_with_overwrite(made, tmp_path, capsys):
    out = tmp_path / "hf"
    shutil.copytree(made / "hf", out)
    (out / "README.md").write_text("my model card")  # the user's: --overwrite refuses rather than delete it
    code, text = gpt1(capsys, "convert", made / "run", "--to", "hf", "--out", out)
    assert code == 1 and "already holds a Hugging Face export (pass --overwrite" in text
    code, text = gpt1(capsys, "convert", made / "run", "--to", "hf", "--out", out, "--overwrite")
    assert code == 1 and "files gpt1 did not write (README.md)" in text
    (out / "README.md").unlink()
    (out / "merges.txt").write_text("#version: 0.2\n")  # gpt1's own (an export of an openai-BPE model): replaced
    code, text = gpt1(capsys, "convert", made / "run", "--to", "hf", "--out", out, "--overwrite")
    assert code == 0, text
    assert not (out / "merges.txt").exists() and json.loads((out / MARKER).read_text()) == {"kind": "hf-export"}
    ck = tmp_path / "ck"
    for extra in ([], ["--overwrite"]):
        code, text = gpt1(capsys, "convert", "--from", "hf", out, "--out", ck, *extra)
        assert code == 0, text
    assert kind_of(ck) == "checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "hf"]


@pytest.mark.parametrize(
    "fault, exit_code", [(OSError(errno.ENOSPC, "No space left on device"), 1), (KeyboardInterrupt(), 130)]
)
def test_the_old_export_survives_a_failed_or_interrupted_replacement(
    made, tmp_path, capsys, monkeypatch, fault, exit_code
):
    import gptcli.interop.convert as conv

    out = tmp_path / "hf"
    shutil.copytree(made / "hf", out)
    before = snapshot(out)

    def late_failure(*a, **k):  # the weights are written, the config is not
        raise fault

    monkeypatch.setattr(conv, "write_hf_config", late_failure)
    code, text = gpt1(capsys, "convert", made / "run", "--to", "hf", "--out", out, "--overwrite")
    assert code == exit_code and "Traceback" not in text
    assert snapshot(out) == before and [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_release_whose_width_the_default_n_head_does_not_divide(tmp_path, capsys):
    """Item 11: a 40-wide release with the default --n-head 12 (the release does not record the head count)."""
    rel = tmp_path / "release"
    rel.mkdir()
    n_vocab, n_ctx, d = 50, 8, 40
    shapes = [[n_ctx, d], [n_vocab, d]] + [
        [1, d, 3 * d],
        [3 * d],
        [1, d, d],
        [d],
        [d],
        [d],
        [1, d, 4 * d],
        [4 * d],
        [1, 4 * d, d],
        [d],
        [d],
        [d],
    ]
    rng = np.random.default_rng(0)
    flat = np.concatenate([rng.normal(0, 0.02, int(np.prod(s))).astype(np.float32) for s in shapes])
    for i, part in enumerate(np.array_split(flat, 10)):
        np.save(rel / f"params_{i}.npy", part)
    (rel / "params_shapes.json").write_text(json.dumps(shapes))
    code, text = gpt1(capsys, "convert", "--from", "openai", rel, "--out", tmp_path / "ck")
    line = text.strip()
    assert code == 1 and "\n" not in line and line.startswith("error:") and "Traceback" not in text
    assert "40 wide" in line and "--n-head 12" in line and "e.g. --n-head 10" in line
    assert not (tmp_path / "ck").exists()
    code, text = gpt1(capsys, "convert", "--from", "openai", rel, "--out", tmp_path / "ck", "--n-head", "10")
    assert code == 0, text
    assert kind_of(tmp_path / "ck") == "checkpoint"
