"""Runs that must not silently become inconsistent (issue 17, items 4–8): `pretrain --resume` onto another tokenizer
or corpus, with changed settings, or over a damaged newest checkpoint; and a run directory that is not a pretraining
run. Every refusal is one line, exit 1, and leaves the run's files — config.toml and checkpoints included — as they
were."""

from __future__ import annotations

import json
import shutil

import pytest
from corpus_helpers import random_corpus
from error_lines import assert_one_line_error, gpt1
from run_helpers import (
    TINY_ARGS,
    flip_byte,
    learned_corpus,
    snapshot,
    tiny_config,
)

from gptcli.checkpoint import load_checkpoint, read_header, verify_checkpoint
from gptcli.errors import GPT1Error
from gptcli.files.outputs import kind_of, mark
from gptcli.progress import RecordingProgress
from gptcli.train.pretrain import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Two corpora whose learned tokenizers have the same size (60 + 3 specials) but not the same ids."""
    root = tmp_path_factory.mktemp("corpora")
    a = learned_corpus(root / "a", "the cat sat on a mat while dogs ran far away in green fields under blue sky")
    b = learned_corpus(root / "b", "zebra quartz jumps over lazy vixen kraken yodel whisky fjord glyph nymph crwth")
    return a, b


@pytest.fixture(scope="module")
def byte_corpus(tmp_path_factory):
    return random_corpus(tmp_path_factory.mktemp("bytes"))


@pytest.fixture(scope="module")
def finished(corpora, tmp_path_factory):
    """A 2-update run on corpus a; tests copy it before touching it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    pretrain(tiny_config(corpora[0], run, max_steps=2))
    return run


def _copy(run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def _losses(run):
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


def test_the_two_tokenizers_really_differ_only_in_ids(corpora):
    from gptcli.data.shards import open_corpus

    a, b = (open_corpus(c) for c in corpora)
    assert a.tokenizer.vocab_size == b.tokenizer.vocab_size == 60
    assert a.tokenizer.encode("the cat") != b.tokenizer.encode("the cat")
    assert a.tokenizer_fingerprint() != b.tokenizer_fingerprint()


def test_resume_onto_another_tokenizer_is_refused_naming_both(corpora, finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    before = snapshot(run)
    res = gpt1(
        ["pretrain", "--out", str(run), "--resume", "--data", str(corpora[1]), "--max-steps", "4", "--quiet"], capsys
    )
    assert_one_line_error(
        res,
        f"--data {corpora[1]}",
        "another tokenizer",
        f"{corpora[1]}/tokenizer",
        f"{run}/checkpoints/step-0000002/tokenizer",
        alone=True,
    )
    assert snapshot(run) == before  # config.toml not rewritten, no checkpoint added


def test_eval_on_another_tokenizer_is_refused_naming_both(corpora, finished, capsys):
    res = gpt1(["eval", "--checkpoint", str(finished), "--data", str(corpora[1]), "--device", "cpu"], capsys)
    assert_one_line_error(res, "another tokenizer", f"{corpora[1]}", f"{finished}/checkpoints/step-0000002", alone=True)
    code, out, err = gpt1(["eval", "--checkpoint", str(finished), "--data", str(corpora[0]), "--device", "cpu"], capsys)
    assert code == 0 and "perplexity on" in out, err


def test_resume_onto_another_corpus_with_the_same_tokenizer_is_refused(byte_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(tiny_config(byte_corpus, run, max_steps=2))
    other = random_corpus(tmp_path / "other", seed=1)  # the byte tokenizer again, other shards
    before = snapshot(run)
    res = gpt1(["pretrain", "--out", str(run), "--resume", "--data", str(other), "--max-steps", "4"], capsys)
    assert_one_line_error(
        res, "cannot resume with changed settings", f"data {byte_corpus} → {other} (another corpus)", alone=True
    )
    assert snapshot(run) == before
    # The same corpus under another path (moved, or a relative path) is the same corpus.
    moved = tmp_path / "moved"
    shutil.copytree(byte_corpus, moved)
    res = pretrain(tiny_config(moved, run, max_steps=3, resume=True))
    assert res.step == 3
    # Prepared again in place, with other shards: the path is the same, the corpus is not.
    shutil.rmtree(moved)
    random_corpus(moved, seed=2)
    before = snapshot(run)
    with pytest.raises(GPT1Error, match=r"data .*moved \(its shards changed since the run started\)"):
        pretrain(tiny_config(moved, run, max_steps=4, resume=True))
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--seq-len", "8"], ["seq_len 16 → 8"]),
        (["--batch-size", "8"], ["batch_size 4 → 8"]),
        (["--seed", "3", "--n-layer", "2"], ["seed 0 → 3", "n_layer 1 → 2"]),
        (
            ["--weight-decay", "0.1", "--decay", "released", "--beta2", "0.99"],
            ["weight_decay 0.01 → 0.1", "decay paper → released", "beta2 0.999 → 0.99"],
        ),
        (["--n-head", "4", "--n-inner", "128"], ["n_head 2 → 4", "n_inner 64 → 128"]),
    ],
)
def test_resume_with_settings_that_define_the_run_is_refused(finished, tmp_path, capsys, flags, named):
    run = _copy(finished, tmp_path)
    before = snapshot(run)
    res = gpt1(["pretrain", "--out", str(run), "--resume", "--max-steps", "4", "--quiet", *flags], capsys)
    assert_one_line_error(res, f"{run}: cannot resume with changed settings", *named, alone=True)
    assert "max_steps" not in res.err  # the run's length may change
    assert snapshot(run) == before


def test_resume_may_extend_the_run_and_adjust_its_recipe(corpora, finished, tmp_path):
    run = _copy(finished, tmp_path)
    rec = RecordingProgress()
    res = pretrain(
        tiny_config(
            corpora[0],
            run,
            max_steps=4,
            lr=1e-4,
            micro_batch_size=2,
            log_every=2,
            model={**tiny_config(corpora[0], run).model, "embd_pdrop": 0.0},
            resume=True,
        ),
        progress=rec,
    )
    assert res.step == 4
    notes = [n["message"] for n in rec.of("note") if n["message"].startswith("resuming with changed settings")]
    assert len(notes) == 1 and all(
        s in notes[0]
        for s in ("max_steps 2 → 4", "lr 0.00025 → 0.0001", "micro_batch_size None → 2", "embd_pdrop 0.1 → 0.0")
    )
    assert "log_every" not in notes[0]  # how a run is watched is not worth a note
    # The new values are the run's from now on: a later resume compares against them.
    assert read_header(run).meta["pretrain_config"]["lr"] == 1e-4
    assert (
        pretrain(
            tiny_config(
                corpora[0],
                run,
                max_steps=5,
                lr=1e-4,
                micro_batch_size=2,
                model={**tiny_config(corpora[0], run).model, "embd_pdrop": 0.0},
                resume=True,
            )
        ).step
        == 5
    )


def test_a_legacy_checkpoint_is_compared_with_the_runs_config_toml(finished, corpora, tmp_path, capsys):
    # Checkpoints written before they recorded their settings: config.toml is the reference.
    run = _copy(finished, tmp_path)
    for c in (run / "checkpoints").iterdir():
        cfg = json.loads((c / "config.json").read_text())
        del cfg["meta"]["pretrain_config"], cfg["meta"]["corpus_sha256"]
        del cfg["config_sha256"]  # checkpoints that old had no digest of their config either
        (c / "config.json").write_text(json.dumps(cfg))
    before = snapshot(run)
    res = gpt1(["pretrain", "--out", str(run), "--resume", "--seq-len", "8", "--quiet"], capsys)
    assert_one_line_error(res, "seq_len 16 → 8", alone=True)
    assert snapshot(run) == before
    with pytest.raises(GPT1Error, match="another tokenizer"):  # the tokenizer is compared from the checkpoint itself
        pretrain(tiny_config(corpora[1], run, max_steps=4, resume=True))


def test_resume_skips_a_damaged_newest_checkpoint_and_stays_bitwise_identical(byte_corpus, tmp_path):
    full = tmp_path / "full"
    pretrain(tiny_config(byte_corpus, full, max_steps=6))
    run = tmp_path / "run"
    pretrain(tiny_config(byte_corpus, run, max_steps=4))
    flip_byte(run / "checkpoints" / "step-0000004" / "model.safetensors")
    damaged = snapshot(run / "checkpoints" / "step-0000004")
    rec = RecordingProgress()
    res = pretrain(tiny_config(byte_corpus, run, max_steps=6, resume=True), progress=rec)
    warns = [n["message"] for n in rec.of("note") if n["level"] == "warn"]
    assert len(warns) == 1 and "skipping checkpoint step-0000004" in warns[0]
    assert "model.safetensors: checksum mismatch" in warns[0] and "resuming from step-0000002" in warns[0]
    assert rec.of("stage")[0]["done"] == 2 and res.step == 6
    assert _losses(run) == _losses(full)  # continued from step 2: updates 3–6 as an uninterrupted run's
    # Update 4 was done again, so its checkpoint was written again: whole, and no longer the damaged one.
    assert snapshot(run / "checkpoints" / "step-0000004") != damaged
    assert verify_checkpoint(run / "checkpoints" / "step-0000004") == []
    assert load_checkpoint(run).meta["step"] == 6


@pytest.mark.parametrize("damage", ["weights", "config", "training_state", "missing_tokenizer"])
def test_every_kind_of_damage_falls_back(byte_corpus, tmp_path, capsys, damage):
    run = tmp_path / "run"
    pretrain(tiny_config(byte_corpus, run, max_steps=4))
    newest = run / "checkpoints" / "step-0000004"
    if damage == "weights":
        flip_byte(newest / "model.safetensors")
    elif damage == "config":
        (newest / "config.json").write_text("{not json")
    elif damage == "training_state":
        flip_byte(newest / "training_state.json", 10)
    else:
        shutil.rmtree(newest / "tokenizer")
    code, _, err = gpt1(["pretrain", "--out", str(run), "--resume", "--max-steps", "5"], capsys)
    assert code == 0, err
    assert "warning: skipping checkpoint step-0000004" in err and "resuming from step-0000002" in err
    assert read_header(run / "checkpoints" / "step-0000005").meta["step"] == 5


def test_no_intact_checkpoint_is_one_line_and_no_verify_takes_the_newest(byte_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(tiny_config(byte_corpus, run, max_steps=4))
    for c in (run / "checkpoints").iterdir():
        flip_byte(c / "optimizer.safetensors")
    before = snapshot(run)
    res = gpt1(["pretrain", "--out", str(run), "--resume", "--max-steps", "5"], capsys)
    assert_one_line_error(res, "no intact checkpoint", "step-0000004", "step-0000002", "--no-verify", alone=True)
    assert snapshot(run) == before
    # --no-verify is the escape: the newest is resumed as it is (a flipped byte in an Adam moment loads fine).
    code, _, err = gpt1(["pretrain", "--out", str(run), "--resume", "--max-steps", "5", "--no-verify"], capsys)
    assert code == 0 and "warning" not in err, err
    assert load_checkpoint(run).meta["step"] == 5


def test_no_verify_with_an_unreadable_newest_config_is_one_line(byte_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(tiny_config(byte_corpus, run, max_steps=4))
    (run / "checkpoints" / "step-0000004" / "config.json").write_text("{not json")
    before = snapshot(run)
    res = gpt1(["pretrain", "--out", str(run), "--resume", "--max-steps", "5", "--no-verify"], capsys)
    assert_one_line_error(res, "step-0000004/config.json: unreadable checkpoint config", alone=True)
    assert snapshot(run) == before


def test_a_run_directory_belongs_to_pretraining(byte_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(tiny_config(byte_corpus, run, max_steps=2))
    assert kind_of(run) == "pretrain-run" and (run / ".gpt1-output").is_file()
    # A fine-tuning run, a folder of notes, the corpus itself or a folder inside it: refused before anything is written.
    ft = tmp_path / "ft"
    ft.mkdir()
    (ft / "config.toml").write_text('task = "rte"\ninit = "x"\n')
    (ft / "metrics.jsonl").write_text("")
    mark(ft, "finetune-run")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    for out, why in (
        (ft, "holds a fine-tuning run"),
        (notes, "is not something gpt1 wrote"),
        (byte_corpus, "is the input"),
        (byte_corpus / "sub", "is inside the input"),
    ):
        before = snapshot(out) if out.exists() else None
        for resume in ([], ["--resume"]):
            res = gpt1(
                ["pretrain", "--data", str(byte_corpus), "--out", str(out), *TINY_ARGS, "--max-steps", "1", *resume],
                capsys,
            )
            assert_one_line_error(res, f"--out {out}", why, alone=True)
        assert (snapshot(out) if out.exists() else None) == before
    # Existing checkpoints without --resume stay refused (pretraining has no --overwrite).
    before = snapshot(run)
    res = gpt1(["pretrain", "--data", str(byte_corpus), "--out", str(run), *TINY_ARGS, "--max-steps", "1"], capsys)
    assert_one_line_error(res, "already holds checkpoints", "--resume", alone=True)
    assert snapshot(run) == before


def _gpt1_procs(args: list[str]):
    """``python -m gptcli ARGS`` in a subprocess (a launcher must spawn its workers), from the checkout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPT1_DIST_TIMEOUT": "60", "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "gptcli", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_launched_run_records_the_users_settings_and_its_resumes_verify(corpora, tmp_path, capsys):
    # A --procs run once recorded its launcher's decisions (verify_data = false, device = "cpu") as the run's
    # settings: every later --resume then skipped the checksums and trained on a damaged checkpoint without a word.
    # The launcher checks the shards once and its workers skip that; the checkpoint each still verifies.
    from gptcli.config import read_config_file

    run = tmp_path / "run"
    tiny = [a for a in TINY_ARGS if a not in ("--device", "cpu")]  # the device left to the launcher
    args = ["pretrain", "--data", str(corpora[0]), "--out", str(run), *tiny, "--max-steps", "4", "--save-every", "2"]
    proc = _gpt1_procs([*args, "--procs", "2"])  # a sentencepiece corpus: workers need no test imports
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = read_config_file(run / "config.toml")
    assert recorded["verify_data"] is True and recorded["device"] == "auto", recorded
    flip_byte(run / "checkpoints" / "step-0000004" / "model.safetensors")
    alone = _copy(run, tmp_path / "alone")
    # Resumed as one process, as a one-process run's resume would be: the warning, and the previous checkpoint.
    code, _, err = gpt1(["pretrain", "--out", str(alone), "--resume", "--max-steps", "5"], capsys)
    assert code == 0 and "warning: skipping checkpoint step-0000004" in err, err
    assert "resuming from step-0000002" in err and read_header(alone).step == 5
    # Resumed with --procs 2: every rank skips it alike.
    proc = _gpt1_procs(["pretrain", "--out", str(run), "--resume", "--max-steps", "6", "--procs", "2", "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: skipping checkpoint step-0000004" in proc.stderr, proc.stderr[-3000:]
    assert read_header(run).step == 6 and verify_checkpoint(run / "checkpoints" / "step-0000006") == []
    assert read_config_file(run / "config.toml")["verify_data"] is True
