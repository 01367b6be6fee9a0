"""Issue #17, data loss 3 for the commands that write results: `gpt1 eval --out` and `gpt1 zeroshot --out` replace
only earlier results of their own kind (as a re-run always did), never a checkpoint, a run, the task data or a
folder of someone's files; a re-run that fails or is interrupted leaves the earlier results whole."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from gptcli.cli import main
from gptcli.files.outputs import MARKER, kind_of
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
RUNTIME = ["--device", "cpu", "--precision", "fp32"]


@pytest.fixture(scope="module")
def made(shared_data, tmp_path_factory) -> Path:
    """Through the CLI: a real pretraining run (learned tokenizer, two updates) and an RTE fine-tuning run, with
    copies of the RTE and SST-2 data (a few rows of each)."""
    root = tmp_path_factory.mktemp("made")
    books = root / "books"
    books.mkdir()
    for name in ("pg11_alice_in_wonderland.txt", "pg84_frankenstein.txt"):
        text = (shared_data / "books" / name).read_text(encoding="utf-8-sig")[2000:6000]
        (books / name).write_text(text, encoding="utf-8")
    for task, folder in (("RTE", "RTE"), ("SST-2", "SST-2")):
        (root / folder).mkdir()
        for split in ("train", "dev"):
            lines = (shared_data / "glue" / task / f"{split}.tsv").read_text(encoding="utf-8").splitlines(True)
            (root / folder / f"{split}.tsv").write_text("".join(lines[:13]), encoding="utf-8")
    for args in (
        ["prepare", books, "--out", root / "corpus", "--vocab-size", "120", "--workers", "1"],
        ["pretrain", "--data", root / "corpus", "--out", root / "pre", *TINY, "--max-steps", "2"],
        ["finetune", "--init", root / "pre", "--out", root / "rte", "--data-dir", root / "RTE", *FT],
    ):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        assert e.value.code == 0, args
    return root


# --------------------------------------------------------------------------------------------------- gpt1 eval


def evaluate(capsys, made: Path, *args) -> tuple[int, str]:
    return gpt1(capsys, "eval", "--checkpoint", made / "rte", "--data-dir", made / "RTE", *RUNTIME, *args)


def test_eval_out_inside_the_checkpoint_or_the_data_is_refused(made, capsys):
    before = snapshot(made)
    code, text = evaluate(capsys, made, "--out", made / "rte" / "checkpoints" / "final")
    assert code == 1 and "is inside the input" in text
    code, text = evaluate(capsys, made, "--out", made / "RTE")
    assert code == 1 and "is inside the input" in text
    assert snapshot(made) == before


def test_eval_never_replaces_a_folder_it_did_not_write(made, tmp_path, capsys):
    notes = tmp_path / "my-notes"
    (notes / "rte" / "rte-dev").mkdir(parents=True)  # where these results would go
    (notes / "rte" / "rte-dev" / "draft.txt").write_text("years of work\n")
    (notes / "thesis.txt").write_text("more years of work\n")
    before = snapshot(notes)
    code, text = evaluate(capsys, made, "--out", notes)
    assert code == 1 and "not something gpt1 wrote; refusing to touch it" in text
    assert snapshot(notes) == before
    shutil.rmtree(notes / "rte")
    code, text = evaluate(capsys, made, "--out", notes)  # beside the notes is fine: they are left alone
    assert code == 0, text
    assert (notes / "thesis.txt").read_text() == "more years of work\n"
    assert kind_of(notes / "rte" / "rte-dev") == "eval"


def test_eval_replaces_its_earlier_results_and_they_survive_a_failed_rerun(made, tmp_path, capsys, monkeypatch):
    import gptcli.eval.tasks as te

    out = tmp_path / "ev"
    assert evaluate(capsys, made, "--out", out)[0] == 0
    leaf = out / "rte" / "rte-dev"
    (leaf / "notes.txt").write_text("x")  # the user's: a re-run refuses rather than delete it
    before = snapshot(out)
    code, text = evaluate(capsys, made, "--out", out)
    assert code == 1 and "files gpt1 did not write (notes.txt)" in text and snapshot(out) == before
    (leaf / "notes.txt").unlink()
    (leaf / "RTE.tsv").write_text("x")  # a submission file of an earlier run: gpt1's, replaced
    assert evaluate(capsys, made, "--out", out)[0] == 0
    assert kind_of(leaf) == "eval" and not (leaf / "RTE.tsv").exists()
    before = snapshot(out)

    def late_failure(*a, **k):  # every example scored; writing the new results fails
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(te, "write_text_atomic", late_failure)
    code, text = evaluate(capsys, made, "--out", out, "--max-examples", "3")
    assert code == 1 and "Traceback" not in text
    assert snapshot(out) == before and [p.name for p in (out / "rte").iterdir()] == ["rte-dev"]


# ----------------------------------------------------------------------------------------------- gpt1 zeroshot


def zeroshot(capsys, made: Path, *args) -> tuple[int, str]:
    return gpt1(
        capsys,
        "zeroshot",
        "--checkpoint",
        made / "pre",
        "--task",
        "sst2",
        "--data-dir",
        made / "SST-2",
        "--limit",
        "6",
        *RUNTIME,
        *args,
    )


def test_zeroshot_out_holding_or_inside_an_input_is_refused(made, capsys):
    before = snapshot(made)
    ckpt = next((made / "pre" / "checkpoints").iterdir())
    for out, where in ((made / "pre", "contains the input"), (ckpt, "is the input"), (made / "SST-2", "is the input")):
        code, text = zeroshot(capsys, made, "--out", out)
        assert code == 1 and where in text, text
    assert snapshot(made) == before


def test_zeroshot_never_replaces_another_kind_or_a_folder_it_did_not_write(made, tmp_path, capsys):
    run = tmp_path / "rte"
    shutil.copytree(made / "rte", run)  # a fine-tuning run has a results.json of its own
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "results.json").write_text('{"mine": true}\n')
    before = snapshot(tmp_path)
    code, text = zeroshot(capsys, made, "--out", run)
    assert code == 1 and "holds a fine-tuning run, not zero-shot results" in text
    code, text = zeroshot(capsys, made, "--out", notes)
    assert code == 1 and "not something gpt1 wrote; refusing to touch it" in text
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("curve", [[], ["--curve"]])
def test_zeroshot_replaces_its_earlier_results_and_they_survive_a_failed_rerun(
    made, tmp_path, capsys, monkeypatch, curve
):
    import gptcli.eval.zeroshot as zs

    out = tmp_path / "zs"
    assert zeroshot(capsys, made, "--out", out, *curve)[0] == 0
    (out / "thesis.tex").write_text("x")  # the user's: a re-run refuses rather than delete it
    before = snapshot(out)
    code, text = zeroshot(capsys, made, "--out", out, *curve)
    assert code == 1 and "files gpt1 did not write (thesis.tex)" in text and snapshot(out) == before
    (out / "thesis.tex").unlink()
    (out / "predictions-cola.jsonl").write_text("{}")  # an earlier run's: gpt1's, replaced
    assert zeroshot(capsys, made, "--out", out, *curve)[0] == 0
    assert kind_of(out) == "zeroshot" and not (out / "predictions-cola.jsonl").exists()
    assert (out / "curve.json").is_file() == bool(curve)
    before = snapshot(out)

    def interrupted(*a, **k):  # every task scored; the results are being written
        raise KeyboardInterrupt

    monkeypatch.setattr(zs, "json_safe", interrupted)
    code, text = zeroshot(capsys, made, "--out", out, "--limit", "4", *curve)
    assert code == 130 and "Traceback" not in text
    assert snapshot(out) == before and [p.name for p in tmp_path.iterdir()] == ["zs"]
    assert json.loads((out / MARKER).read_text()) == {"kind": "zeroshot"}


def test_only_a_marker_says_that_gpt1_wrote_a_folder(tmp_path, made, capsys):
    """File names are no evidence: a folder of the user's that looks like results (or a model downloaded from the
    Hub) was once taken for gpt1's and deleted by a re-run. Without a marker it is refused."""
    ev, zs, curve, hf = (tmp_path / n for n in ("ev", "zs", "curve", "hf"))
    layouts = {
        ev: ("results.json", "predictions.jsonl", "RTE.tsv"),
        zs: ("results.json", "predictions-sst2.jsonl"),
        curve: ("curve.json", "curve.png"),
        hf: ("config.json", "model.safetensors", "vocab.json"),
    }
    for d, files in layouts.items():
        d.mkdir()
        for f in files:
            (d / f).write_text('{"model_type": "openai-gpt"}')
    assert {kind_of(d) for d in layouts} == {None}
    before = snapshot(tmp_path)
    code, text = zeroshot(capsys, made, "--out", zs)
    assert code == 1 and "not something gpt1 wrote; refusing to touch it" in text
    assert snapshot(tmp_path) == before
