"""Resumable fine-tuning (issue #13, section 1): a run stopped anywhere — by SIGINT between updates, at an epoch
boundary, during the dev evaluation, or by a crash that saves nothing — and continued with ``resume=True`` ends
bitwise equal to the run never interrupted, on CPU in fp32: the final weights (sha256), results.json's scores and
history, and every metrics.jsonl record but its timing fields. Settings that would change the run are refused on
resume, naming each; harmless ones are allowed.

The kill -9 version, through the real command in a subprocess, is tests/faults/test_kill9_finetune.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
from pathlib import Path

import pytest
from run_helpers import signal_at_dev_score

import gptcli.train.finetune as ft
import gptcli.train.finetune_dev as ft_dev
import gptcli.train.finetune_job as ft_job
from gptcli.checkpoint import read_header, verify_checkpoint
from gptcli.errors import GPT1Error
from gptcli.progress import Progress, RecordingProgress
from gptcli.train.finetune import FinetuneConfig, finetune
from gptcli.train.finetune_config import RULES

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = (
    "good bad fine awful great poor nice dull bright dark warm cold happy sad calm loud fresh stale clever silly"
).split()
TIMING = ("tokens_per_s", "elapsed_s")


def _write_sst2(folder: Path, n_train: int = 40, n_dev: int = 12, seed: int = 0) -> Path:
    """An SST-2-format folder of random sentences (label: whether 'good' outnumbers 'bad'-ish words)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
            rows.append(f"{' '.join(words)}\t{int(sum(w in WORDS[::2] for w in words) * 2 > len(words))}")
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _write_sst2(tmp_path_factory.mktemp("sst2") / "SST-2")


def _cfg(pretrained: Path, data: Path, out: Path, **kw) -> FinetuneConfig:
    # 40 examples in batches of 8: 5 updates per epoch, 15 in all; records every 2 updates, so a resume must carry
    # the mean loss of an unlogged update across; the toy model has dropout, so the torch RNG must be restored.
    base = dict(
        task="sst2",
        init=str(pretrained),
        out=str(out),
        data_dir=str(data),
        batch_size=8,
        epochs=3,
        lr=1e-3,
        device="cpu",
        precision="fp32",
        log_every=2,
        save_every=0,
        keep_last=2,
    )
    base.update(kw)
    return FinetuneConfig(**base)


def outcome(run: Path) -> dict:
    """What must be bitwise equal: the final weights, results.json's scores, history and kept epoch, and the
    metrics records without their timing fields; and the run must be clean (only ``final`` left)."""
    results = json.loads((run / "results.json").read_text())
    records = [
        {k: v for k, v in json.loads(x).items() if k not in TIMING}
        for x in (run / "metrics.jsonl").read_text().splitlines()
    ]
    return {
        "weights": hashlib.sha256((run / "checkpoints" / "final" / "model.safetensors").read_bytes()).hexdigest(),
        "scores": results["scores"],
        "history": results["history"],
        "epoch": results["epoch"],
        "steps": results["steps"],
        "records": records,
        "checkpoints": sorted(p.name for p in (run / "checkpoints").iterdir()),
    }


@pytest.fixture(scope="module")
def reference(pretrained, data, tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("ref") / "run"
    res = finetune(_cfg(pretrained, data, run))
    ref = outcome(run)
    assert res.stopped_by is None and ref["checkpoints"] == ["final"] and ref["steps"] == 15
    assert [r["step"] for r in ref["records"] if r["kind"] == "train"] == [2, 4, 6, 8, 10, 12, 14, 15]
    assert [r["step"] for r in ref["records"] if r["kind"] == "eval"] == [5, 10, 15]
    return ref


class SignalAt(Progress):
    """Sends ``signum`` to this process at the given update numbers (counting from this process's first update)."""

    def __init__(self, *at: int, signum: int = signal.SIGINT) -> None:
        self.at, self.n, self.signum = set(at), 0, signum

    def advance(self, n: float = 0, **status) -> None:
        self.n += 1
        if self.n in self.at:
            os.kill(os.getpid(), self.signum)


class CrashAt(Progress):
    """Raises KeyboardInterrupt inside update number ``at``'s report: the process dies without saving anything."""

    def __init__(self, at: int) -> None:
        self.at, self.n = at, 0

    def advance(self, n: float = 0, **status) -> None:
        self.n += 1
        if self.n == self.at:
            raise KeyboardInterrupt


def _steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step-*"))


# --------------------------------------------------------------------------------------------- bitwise resumes


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_epoch_checkpoints_and_the_resume_is_bitwise(pretrained, data, reference, tmp_path, signum):
    run = tmp_path / "run"
    res = finetune(_cfg(pretrained, data, run), progress=SignalAt(3, signum=signum))
    assert res.stopped_by == signal.Signals(signum).name and res.step == 3 and res.total == 15
    assert res.checkpoint == run / "checkpoints" / "step-0000003" and verify_checkpoint(res.checkpoint) == []
    assert not (run / "results.json").exists() and not (run / "checkpoints" / "final").exists()
    rec = RecordingProgress()
    res = finetune(_cfg(pretrained, data, run, resume=True), progress=rec)
    assert res.stopped_by is None and outcome(run) == reference
    assert rec.of("stage")[0]["done"] == 3 and len(rec.of("advance")) == 12
    assert "resuming from step-0000003: update 3 of 15, epoch 1" in [n["message"] for n in rec.of("note")]


def test_crash_resumes_from_the_last_periodic_checkpoint(pretrained, data, reference, tmp_path):
    """A crash (an exception, as kill -9 would leave things) at update 9 after saves at 4 and 8 (and the epoch end
    at 5): the records the dead process wrote past update 8 are dropped, none is written twice."""
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        finetune(_cfg(pretrained, data, run, save_every=4, log_every=1), progress=CrashAt(9))
    assert _steps(run) == ["step-0000005", "step-0000008"]  # keep_last 2: step 4 pruned
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 9  # written after the last checkpoint: must not survive the resume
    finetune(_cfg(pretrained, data, run, save_every=4, log_every=1, resume=True))
    ref_run = tmp_path / "ref"
    finetune(_cfg(pretrained, data, ref_run, save_every=4, log_every=1))
    assert outcome(run) == outcome(ref_run)
    # And the log cadence is not part of the run: the weights and scores are the reference's.
    assert outcome(run)["weights"] == reference["weights"] and outcome(run)["history"] == reference["history"]


def test_signal_at_an_epoch_boundary_before_its_dev_score(pretrained, data, reference, tmp_path):
    run = tmp_path / "run"
    res = finetune(_cfg(pretrained, data, run), progress=SignalAt(5))  # the last update of epoch 1
    assert res.stopped_by == "SIGINT" and res.step == 5 and res.history == []  # stopped before scoring
    state = json.loads((run / "checkpoints" / "step-0000005" / "training_state.json").read_text())["finetune"]
    assert (state["epoch"], state["done_in_epoch"], state["evaluated"]) == (1, 5, False)
    finetune(_cfg(pretrained, data, run, resume=True))
    assert outcome(run) == reference


def test_signal_during_the_dev_evaluation_abandons_it_and_redoes_it(pretrained, data, reference, tmp_path, monkeypatch):
    real = signal_at_dev_score(monkeypatch, nth=2)  # epoch 2's evaluation: the signal lands before its first batch
    run = tmp_path / "run"
    res = finetune(_cfg(pretrained, data, run), progress=RecordingProgress())
    assert res.stopped_by == "SIGINT" and res.step == 10 and len(res.history) == 1
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert len(evals) == 1  # the abandoned evaluation logged nothing
    monkeypatch.setattr(ft_dev, "predict", real)
    finetune(_cfg(pretrained, data, run, resume=True))
    assert outcome(run) == reference


def test_signal_after_the_dev_score_stops_at_the_epoch_end_checkpoint(
    pretrained, data, reference, tmp_path, monkeypatch
):
    real = ft_job.score_predictions

    def score(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(ft_job, "score_predictions", score)
    run = tmp_path / "run"
    res = finetune(_cfg(pretrained, data, run))
    assert res.stopped_by == "SIGINT" and res.step == 5 and len(res.history) == 1 and _steps(run) == ["step-0000005"]
    monkeypatch.setattr(ft_job, "score_predictions", real)
    finetune(_cfg(pretrained, data, run, resume=True))
    assert outcome(run) == reference


def test_crash_between_an_epoch_score_and_its_checkpoint_logs_the_score_once(
    pretrained, data, reference, tmp_path, monkeypatch
):
    """Stopped before epoch 1's dev score (a checkpoint at update 5, not evaluated), resumed, and killed after the
    score was logged but before the epoch-end checkpoint replaced step 5: the record has update 5's step, yet the
    checkpoint had not seen it, so the next resume must drop it (records are kept by count, not by step)."""
    run = tmp_path / "run"
    finetune(_cfg(pretrained, data, run), progress=SignalAt(5))
    real = ft_job.FinetuneJob.save

    def crash(job):
        if job.evaluated:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(ft_job.FinetuneJob, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        finetune(_cfg(pretrained, data, run, resume=True))
    assert sum('"eval"' in x for x in (run / "metrics.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr(ft_job.FinetuneJob, "save", real)
    finetune(_cfg(pretrained, data, run, resume=True))
    assert outcome(run) == reference


def test_many_interruptions_in_a_row(pretrained, data, reference, tmp_path):
    run = tmp_path / "run"
    stops = []
    for at in (1, 4, 2, 3):  # updates 1, 5 (an epoch end), 7, 10 (another)
        res = finetune(_cfg(pretrained, data, run, resume=True), progress=SignalAt(at))
        stops.append(res.step)
    assert stops == [1, 5, 7, 10]
    finetune(_cfg(pretrained, data, run, resume=True))
    assert outcome(run) == reference


def test_best_epoch_weights_survive_a_resume(pretrained, data, tmp_path, monkeypatch):
    """select = best with epoch 2 the best of three: interrupted in epoch 3, the run must still keep epoch 2's
    weights, which only the checkpoint's best.safetensors holds by then."""
    scores = [60.0, 80.0, 70.0]
    n = {"calls": 0}

    def score(task, preds, examples):
        n["calls"] += 1
        return {"accuracy": scores[n["calls"] - 1]}

    monkeypatch.setattr(ft_job, "score_predictions", score)
    ref = tmp_path / "ref"
    finetune(_cfg(pretrained, data, ref))
    assert json.loads((ref / "results.json").read_text())["epoch"] == 2
    n["calls"] = 0
    run = tmp_path / "run"
    assert finetune(_cfg(pretrained, data, run), progress=SignalAt(12)).step == 12
    assert (run / "checkpoints" / "step-0000012" / "best.safetensors").is_file()
    n["calls"] = 2  # two epochs were scored before the interruption
    finetune(_cfg(pretrained, data, run, resume=True))
    assert outcome(run) == outcome(ref)


def test_kill_after_the_final_checkpoint_before_results(pretrained, data, reference, tmp_path, monkeypatch):
    """Killed while writing the outputs: the epoch-end checkpoint of the last epoch is still there, and the resume
    only writes the outputs again."""
    real = ft.write_text_atomic

    def die(path, text):
        if Path(path).name == "results.json":
            raise KeyboardInterrupt
        return real(path, text)

    monkeypatch.setattr(ft, "write_text_atomic", die)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        finetune(_cfg(pretrained, data, run))
    assert (run / "checkpoints" / "final").is_dir() and "step-0000015" in _steps(run)
    monkeypatch.setattr(ft, "write_text_atomic", real)
    with pytest.raises(GPT1Error, match="already holds a fine-tuned checkpoint"):
        finetune(_cfg(pretrained, data, run))  # without --resume, a run with a final checkpoint is kept
    rec = RecordingProgress()
    finetune(_cfg(pretrained, data, run, resume=True), progress=rec)
    assert outcome(run) == reference and rec.of("advance") == []


def test_damaged_newest_checkpoint_is_skipped_with_a_warning(pretrained, data, reference, tmp_path):
    run = tmp_path / "run"
    finetune(_cfg(pretrained, data, run, save_every=1), progress=SignalAt(7))
    assert _steps(run) == ["step-0000006", "step-0000007"]
    weights = run / "checkpoints" / "step-0000007" / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-5] ^= 0x01
    weights.write_bytes(bytes(blob))
    rec = RecordingProgress()
    finetune(_cfg(pretrained, data, run, save_every=1, resume=True), progress=rec)
    warns = [n["message"] for n in rec.of("note") if n["level"] == "warn"]
    assert len(warns) == 1 and "skipping checkpoint step-0000007" in warns[0] and "step-0000006" in warns[0]
    assert outcome(run) == reference


# --------------------------------------------------------------------------------------------- what a resume allows


@pytest.fixture
def stopped(pretrained, data, tmp_path) -> Path:
    """A run stopped by SIGINT at update 3."""
    run = tmp_path / "run"
    assert finetune(_cfg(pretrained, data, run), progress=SignalAt(3)).stopped_by == "SIGINT"
    return run


def test_changed_settings_are_refused_naming_each(pretrained, data, stopped):
    before = {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()}
    cfg = _cfg(
        pretrained,
        data,
        stopped,
        resume=True,
        batch_size=4,
        seed=7,
        lm_weight=0.0,
        epochs=4,
        lr=2e-3,
        max_train_examples=32,
    )
    with pytest.raises(GPT1Error) as e:
        finetune(cfg)
    msg = str(e.value)
    assert msg.startswith(f"{stopped}: cannot resume with changed settings: ") and "\n" not in msg
    for change in (
        "batch_size 8 → 4",
        "seed 42 → 7",
        "lm_weight 0.5 → 0.0",
        "epochs 3 → 4",
        "lr 0.001 → 0.002",
        "max_train_examples None → 32",
    ):
        assert change in msg, change
    assert msg.endswith("(these define the run: resume without changing them, or start a new run with another --out)")
    assert {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()} == before  # nothing was touched


def test_changed_data_file_is_refused(pretrained, data, stopped, tmp_path):
    other = tmp_path / "SST-2"
    import shutil

    shutil.copytree(data, other)
    finetune_ok = _cfg(pretrained, other, stopped, resume=True, save_every=0)
    (other / "dev.tsv").write_text((other / "dev.tsv").read_text() + "good good\t1\n")
    with pytest.raises(GPT1Error, match=r"data .* \(other files: dev\.tsv\)"):
        finetune(finetune_ok)
    # The same content in another folder is the same data: allowed.
    (other / "dev.tsv").write_bytes((data / "dev.tsv").read_bytes())
    assert finetune(finetune_ok).stopped_by is None


def test_changed_init_checkpoint_is_refused(pretrained, data, stopped, tmp_path):
    import torch
    from toy_model import save_tiny_pretrained

    from gptcli.checkpoint import load_checkpoint, save_checkpoint

    # The same weights in another place are the same init: allowed.
    other = save_tiny_pretrained(tmp_path / "other")  # seeded inside: the fixture's weights
    assert finetune(_cfg(pretrained, data, stopped, resume=True, init=str(other))).stopped_by is None
    # The init checkpoint changed in place (one weight), or another checkpoint: refused.
    run2 = tmp_path / "run2"
    finetune(_cfg(other, data, run2), progress=SignalAt(2))
    ck = load_checkpoint(other)
    with torch.no_grad():
        ck.model.tok_emb.weight[0, 0] += 1.0
    third = save_checkpoint(tmp_path / "third", ck.model, ck.tokenizer, meta={"step": 10})
    with pytest.raises(GPT1Error, match=r": init \S+ → \S+ \(other weights\) \(these"):
        finetune(_cfg(other, data, run2, resume=True, init=str(third)))
    save_checkpoint(other, ck.model, ck.tokenizer, meta={"step": 10})
    with pytest.raises(GPT1Error, match=r": init \S+ \(its weights changed since the run started\) \(these"):
        finetune(_cfg(other, data, run2, resume=True))


def test_harmless_settings_may_change(pretrained, data, stopped, reference):
    rec = RecordingProgress()
    res = finetune(
        _cfg(
            pretrained,
            data,
            stopped,
            resume=True,
            eval_batch_size=5,
            log_every=2,
            save_every=3,
            keep_last=1,
            verify=False,
        ),
        progress=rec,
    )
    assert res.stopped_by is None
    assert "resuming with changed settings: eval_batch_size None → 5" in [n["message"] for n in rec.of("note")]
    # log_every, save_every, keep_last and verify are not even mentioned; the weights are the reference's.
    assert outcome(stopped)["weights"] == reference["weights"]


def test_every_setting_is_classified_for_resume():
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    assert set(RULES.defining) | set(RULES.adjustable) | set(RULES.silent) == fields
    assert len(RULES.defining) + len(RULES.adjustable) + len(RULES.silent) == len(fields)


# --------------------------------------------------------------------------------------------- what --out may hold


def test_an_unfinished_run_with_checkpoints_needs_resume_or_overwrite(pretrained, data, stopped, reference):
    with pytest.raises(
        GPT1Error,
        match=r"unfinished fine-tuning run with checkpoints \(pass --resume to continue "
        r"it, or --overwrite to start it over\)",
    ):
        finetune(_cfg(pretrained, data, stopped))
    with pytest.raises(GPT1Error, match="pass one of them"):
        finetune(_cfg(pretrained, data, stopped, resume=True, overwrite=True))
    finetune(_cfg(pretrained, data, stopped, overwrite=True))  # starts over, replaced when complete
    assert outcome(stopped) == reference
    # --resume of a finished run has nothing to do: it returns the run's results (a requeued job succeeds), and
    # removes what a kill while the step checkpoints were being removed left ...
    (stopped / "checkpoints" / ".step-0000015.tmp-pruned-0123abcd").mkdir()
    rec = RecordingProgress()
    res = finetune(_cfg(pretrained, data, stopped, resume=True), progress=rec)
    assert res.results == json.loads((stopped / "results.json").read_text()) and res.step == 15
    assert res.checkpoint == stopped / "checkpoints" / "final" and outcome(stopped) == reference
    assert [n["message"] for n in rec.of("note")] == [f"{stopped}: the run is already finished; nothing to resume"]
    # ... unless it was asked with settings that define another run.
    with pytest.raises(GPT1Error, match=r"the run is finished with other settings: seed 42 → 3 \(pass --overwrite"):
        finetune(_cfg(pretrained, data, stopped, resume=True, seed=3))


def test_resume_without_a_checkpoint_starts_the_run(pretrained, data, reference, tmp_path):
    rec = RecordingProgress()
    finetune(_cfg(pretrained, data, tmp_path / "run", resume=True), progress=rec)
    assert outcome(tmp_path / "run") == reference
    assert any("no checkpoint to resume from" in n["message"] for n in rec.of("note"))


def test_step_checkpoints_are_loadable_task_models(pretrained, data, stopped):
    """While a run trains, its step checkpoints are fine-tuned checkpoints gpt1 eval can read, and they record
    the settings and inputs a resume compares."""
    header = read_header(stopped / "checkpoints" / "step-0000003")
    assert header.kind == "finetuned" and header.meta["task"] == "sst2" and header.meta["step"] == 3
    ident = header.meta["resume_identity"]
    assert set(ident["data_files"]) == {"train.tsv", "dev.tsv"} and len(ident["examples_sha256"]) == 64
    assert header.meta["finetune_config"]["resume"] is False and header.meta["finetune_config"]["seed"] == 42
    assert (stopped / "config.toml").read_text().count("resume = false") == 1


def test_sigint_through_the_command_line_exits_130_and_says_how_to_continue(
    pretrained, data, reference, tmp_path, capsys, monkeypatch
):
    from gptcli.cli import main

    real = signal_at_dev_score(monkeypatch)
    run = tmp_path / "run"
    args = [
        "finetune",
        "--task",
        "sst2",
        "--init",
        pretrained,
        "--out",
        run,
        "--data-dir",
        data,
        "--batch-size",
        "8",
        "--epochs",
        "3",
        "--lr",
        "1e-3",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--log-every",
        "2",
        "--save-every",
        "0",
        "-q",
    ]
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    assert e.value.code == 130 and "Traceback" not in err
    assert "stopped by SIGINT at update 5/15" in err and f"gpt1 finetune --out {run} --resume" in " ".join(err.split())
    monkeypatch.setattr(ft_dev, "predict", real)
    with pytest.raises(SystemExit) as e:  # the run's config.toml supplies every other setting
        main(["finetune", "--out", str(run), "--resume", "-q"])
    assert e.value.code == 0, capsys.readouterr().err
    assert outcome(run) == reference


def test_the_quickstart_treats_a_stopped_fine_tuning_as_an_error(tmp_path, monkeypatch):
    """The quickstart is all or nothing: fine-tuning stopped by a signal (and returning no results) must end it with
    a one-line error, not a KeyError on the missing scores."""
    from types import SimpleNamespace

    from gptcli.pipelines.quickstart import QuickstartConfig, finetune_model

    stopped = ft.FinetuneResult(tmp_path, tmp_path / "checkpoints" / "step-0000003", {}, [], "SIGINT", 3, 15)
    monkeypatch.setattr(ft, "finetune", lambda config, progress=None: stopped)
    run = SimpleNamespace(
        cfg=QuickstartConfig(pretrain_steps=3), out=tmp_path, progress=Progress(), paths={}, numbers={}
    )
    with pytest.raises(GPT1Error, match=r"fine-tuning stopped by SIGINT: the quickstart kept nothing"):
        finetune_model(run, SimpleNamespace(task_dir=tmp_path), SimpleNamespace(checkpoint=tmp_path))
