"""Issue #17, data loss 3 and 5: `gpt1 finetune --out` never writes into its --init run or its data, never
replaces another kind of directory (a pretraining run, a folder of notes), replaces a finished fine-tuning run
only with --overwrite — and then atomically: the old run survives a failed or interrupted replacement."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from gptcli.cli import main
from gptcli.files.outputs import kind_of
from tests.faults.conftest import cli_text as gpt1
from tests.faults.conftest import snapshot

pytestmark = pytest.mark.usefixtures("one_thread")

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
    "64",
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
FT = [
    "--task",
    "rte",
    "--max-train-examples",
    "8",
    "--max-eval-examples",
    "4",
    "--batch-size",
    "4",
    "--epochs",
    "1",
    "--device",
    "cpu",
    "--precision",
    "fp32",
    "--quiet",
]


@pytest.fixture(scope="module")
def made(shared_data, tmp_path_factory) -> Path:
    """A real pretraining run (learned tokenizer, two updates), a copy of RTE, and a fine-tuning run, all made
    through the CLI."""
    root = tmp_path_factory.mktemp("made")
    books = root / "books"
    books.mkdir()
    for name in ("pg11_alice_in_wonderland.txt", "pg84_frankenstein.txt"):
        text = (shared_data / "books" / name).read_text(encoding="utf-8-sig")[2000:6000]
        (books / name).write_text(text, encoding="utf-8")
    shutil.copytree(shared_data / "glue" / "RTE", root / "RTE")
    for args in (
        ["prepare", books, "--out", root / "corpus", "--vocab-size", "120", "--workers", "1"],
        ["pretrain", "--data", root / "corpus", "--out", root / "pre", *TINY, "--max-steps", "2"],
        ["finetune", "--init", root / "pre", "--out", root / "rte", "--data-dir", root / "RTE", *FT],
    ):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        assert e.value.code == 0, args
    return root


@pytest.fixture
def pre(made, tmp_path) -> Path:
    shutil.copytree(made / "pre", tmp_path / "pre")
    return tmp_path / "pre"


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_finetune_into_its_own_pretraining_run_is_refused_before_anything_is_written(made, pre, capsys, overwrite):
    before = snapshot(pre)
    code, text = gpt1(capsys, "finetune", "--init", pre, "--out", pre, "--data-dir", made / "RTE", *FT, *overwrite)
    assert code == 1 and "is the input" in text
    assert snapshot(pre) == before  # config.toml included: `pretrain --resume` still reads its own settings
    assert [p.name for p in pre.parent.iterdir()] == ["pre"]


def test_a_pretraining_run_is_not_a_fine_tuning_run(made, pre, capsys):
    before = snapshot(pre)
    ckpt = next((made / "pre" / "checkpoints").iterdir())  # --init elsewhere: the run dir is only the output
    code, text = gpt1(capsys, "finetune", "--init", ckpt, "--out", pre, "--data-dir", made / "RTE", *FT, "--overwrite")
    assert code == 1 and "holds a pretraining run, not a fine-tuning run; refusing to replace it" in text
    assert snapshot(pre) == before


def test_out_inside_the_init_run_or_the_data_is_refused(made, pre, tmp_path, capsys):
    data = tmp_path / "RTE"
    shutil.copytree(made / "RTE", data)
    before = snapshot(tmp_path)
    code, text = gpt1(capsys, "finetune", "--init", pre, "--out", pre / "rte", "--data-dir", data, *FT)
    assert code == 1 and "is inside the input" in text
    code, text = gpt1(capsys, "finetune", "--init", pre, "--out", data, "--data-dir", data, *FT, "--overwrite")
    assert code == 1 and "is the input" in text
    assert snapshot(tmp_path) == before


def test_a_folder_of_unrelated_files_is_refused(made, tmp_path, capsys):
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work\n")
    (notes / "config.toml").write_text('task = "mine"\n')
    before = snapshot(notes)
    code, text = gpt1(
        capsys, "finetune", "--init", made / "pre", "--out", notes, "--data-dir", made / "RTE", *FT, "--overwrite"
    )
    assert code == 1 and "not something gpt1 wrote; refusing to touch it" in text
    assert snapshot(notes) == before


def test_a_finished_run_needs_overwrite_and_is_then_replaced_whole(made, tmp_path, capsys):
    run = tmp_path / "rte"
    shutil.copytree(made / "rte", run)
    (run / "stale.txt").write_text("from the old run")
    before = snapshot(run)
    args = ["finetune", "--init", made / "pre", "--out", run, "--data-dir", made / "RTE", *FT]
    code, text = gpt1(capsys, *args)
    assert code == 1 and "already holds a fine-tuned checkpoint (pass --overwrite to replace it)" in text
    assert snapshot(run) == before
    code, text = gpt1(capsys, *args, "--overwrite", "--seed", "7")  # the user's file would go with the run
    assert code == 1 and "files gpt1 did not write (stale.txt); replacing it would delete them" in text
    assert snapshot(run) == before
    (run / "stale.txt").unlink()
    (run / "eval" / "rte-dev").mkdir(parents=True)  # what `gpt1 eval` of the old run wrote goes with it
    code, text = gpt1(capsys, *args, "--overwrite", "--seed", "7")
    assert code == 0, text
    assert kind_of(run) == "finetune-run" and not (run / "eval").exists()
    results = json.loads((run / "results.json").read_text())
    assert results["config"]["seed"] == 7 and results["checkpoint"] == str(run / "checkpoints" / "final")
    assert [p.name for p in tmp_path.iterdir()] == ["rte"]  # the hidden build directory was moved into place


@pytest.mark.parametrize(
    "fault, exit_code", [(OSError(errno.ENOSPC, "No space left on device"), 1), (KeyboardInterrupt(), 130)]
)
def test_the_old_run_survives_a_failed_or_interrupted_replacement(
    made, tmp_path, capsys, monkeypatch, fault, exit_code
):
    import gptcli.train.finetune as ft

    run = tmp_path / "rte"
    shutil.copytree(made / "rte", run)
    before = snapshot(run)

    real = ft.write_text_atomic

    def late_failure(path, text):  # training done and the new checkpoint saved; results.json is not written
        if Path(path).name == "results.json":
            raise fault
        return real(path, text)

    monkeypatch.setattr(ft, "write_text_atomic", late_failure)
    code, text = gpt1(
        capsys,
        "finetune",
        "--init",
        made / "pre",
        "--out",
        run,
        "--data-dir",
        made / "RTE",
        *FT,
        "--overwrite",
        "--seed",
        "7",
    )
    assert code == exit_code and "Traceback" not in text
    assert snapshot(run) == before and [p.name for p in tmp_path.iterdir()] == ["rte"]


def test_an_interrupted_first_run_is_marked_and_simply_run_again(made, tmp_path, capsys, monkeypatch):

    run = tmp_path / "rte"
    import gptcli.train.finetune_job as ft_job

    real = ft_job.evaluate_epoch

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ft_job, "evaluate_epoch", interrupted)
    args = ["finetune", "--init", made / "pre", "--out", run, "--data-dir", made / "RTE", *FT]
    assert gpt1(capsys, *args)[0] == 130
    assert kind_of(run) == "finetune-run" and not (run / "checkpoints").exists()
    monkeypatch.setattr(ft_job, "evaluate_epoch", real)
    code, text = gpt1(capsys, *args)  # nothing finished to lose: no --overwrite needed
    assert code == 0, text
    assert (run / "checkpoints" / "final").is_dir() and (run / "results.json").is_file()


def test_everything_gpt1_writes_is_listed_as_its_own(made):
    """outputs.OWNED lists what each kind writes: a file a run or a checkpoint gains without its name there would
    make every later --overwrite refuse the run (and save_checkpoint a damaged checkpoint) as holding user files."""
    from gptcli.files.outputs import foreign_entries

    assert foreign_entries(made / "corpus", "corpus") == []
    for kind, run in (("pretrain-run", made / "pre"), ("finetune-run", made / "rte")):
        assert foreign_entries(run, kind) == []
        for ckpt in (run / "checkpoints").iterdir():
            assert foreign_entries(ckpt, "checkpoint") == [], ckpt
