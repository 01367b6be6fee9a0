"""The run machinery every training run shares (gptcli/train/run/): the update loop's order and sync points, stopping
on a signal or a deadline, the resume rules, the run directory's plan and metrics cut-back, and the one non-finite
policy — tested on a stand-in job (no model), and for fine-tuning, which before it had a policy of its own."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gptcli.errors import GPT1Error
from gptcli.files.outputs import mark
from gptcli.model.gpt import ModelConfig
from gptcli.progress import RecordingProgress
from gptcli.train.run.directory import RunKind, finished_results, open_run, plan_run_dir, reopen_metrics
from gptcli.train.run.loop import Due, GracefulStop, NonFiniteLossError, RunState, train
from gptcli.train.run.resume import SettingRules, check_resume
from gptcli.train.trainer import Parallel

pytestmark = pytest.mark.usefixtures("one_thread")


class Job:
    """A job with no model: its losses are given, and it records what the loop asks of it, in order."""

    resumable = True

    def __init__(self, losses, every=(2, 3, 4), epoch_end=None, evaluate_ok=True, signal_after=None) -> None:
        self.losses, (self.log_every, self.eval_every, self.save_every) = list(losses), every
        self.state = RunState(torch.device("cpu"), len(self.losses), checkpoints=None)
        self.par, self.model = Parallel(), torch.nn.Linear(2, 2)
        self.calls: list[str] = []
        self.evaluate_ok, self.signal_after, self.resume_due = evaluate_ok, signal_after, None

    def next_update(self):
        self.state.step += 1
        self.calls.append(f"update {self.state.step}")
        if self.signal_after == self.state.step:
            signal.raise_signal(signal.SIGTERM)
        return torch.tensor(self.losses[self.state.step - 1])

    def after_update(self):
        s, last = self.state.step, self.state.step == self.state.total
        return Due(
            log=s % self.log_every == 0 or last,
            evaluate=s % self.eval_every == 0 or last,
            save=s % self.save_every == 0 or last,
        )

    def due_on_resume(self):
        return self.resume_due

    def read_figures(self):
        self.calls.append(f"read {self.state.step}")

    def log(self, report, due):
        if due.log:
            self.calls.append(f"log {self.state.step}")

    def evaluate(self, report, stop):
        self.calls.append(f"evaluate {self.state.step}")
        return self.evaluate_ok

    def position(self):
        return self.state.step

    def save(self):
        self.calls.append(f"save {self.state.step}")
        return Path(f"step-{self.state.step}")


def _run(job, **kw) -> str | None:
    with GracefulStop() as stop:
        return train(job, stop, RecordingProgress(), **kw)


def test_the_loop_reads_only_at_sync_points_and_follows_one_order():
    job = Job([1.0] * 6)
    assert _run(job) is None
    assert job.calls == [
        "update 1",
        "update 2",
        "read 2",
        "log 2",
        "update 3",
        "read 3",
        "evaluate 3",
        "update 4",
        "read 4",
        "log 4",
        "save 4",
        "update 5",
        "update 6",
        "read 6",
        "log 6",
        "evaluate 6",
        "save 6",
    ]
    assert job.state.saved == 6 and job.state.last_checkpoint == Path("step-6")


def test_a_signal_stops_after_the_update_with_a_checkpoint_unless_one_holds_it():
    job = Job([1.0] * 6, signal_after=3)
    assert _run(job) == "SIGTERM"
    assert job.calls[-3:] == ["read 3", "evaluate 3", "save 3"]
    job = Job([1.0] * 6, signal_after=4)  # update 4 is saved anyway: no second checkpoint
    assert _run(job) == "SIGTERM" and job.calls.count("save 4") == 1 and job.calls[-1] == "save 4"
    job = Job([1.0] * 6, signal_after=5)  # not a sync point: read first (never checkpoint past a divergence)
    assert _run(job) == "SIGTERM" and job.calls[-2:] == ["read 5", "save 5"]


def test_an_evaluation_cut_short_by_a_signal_checkpoints_where_the_run_stands():
    job = Job([1.0] * 6, evaluate_ok=False)
    assert _run(job) == "signal"
    assert job.calls[-2:] == ["evaluate 3", "save 3"] and job.state.step == 3


def test_what_a_restored_position_owes_comes_first():
    job = Job([1.0] * 2)
    job.resume_due = Due(evaluate=True, save=True)
    _run(job)
    assert job.calls[:2] == ["evaluate 0", "save 0"]


def test_the_deadline_ends_the_run_as_its_last_update_would(monkeypatch):
    job = Job([1.0] * 50)
    rec = RecordingProgress()
    with GracefulStop() as stop:
        assert train(job, stop, rec, max_minutes=1e-9) is None
    assert job.calls == ["evaluate 0", "save 0"]  # nothing to read: no update ran
    [warning] = [n["message"] for n in rec.of("note") if n["level"] == "warn"]
    assert warning.startswith("stopped at the time limit") and "after update 0 of 50" in warning


@pytest.mark.parametrize("at, named", [(5, "loss became nan at update 5"), (6, "loss became inf at update 6")])
def test_a_non_finite_loss_is_caught_at_the_next_sync_point_and_named(tmp_path, at, named):
    losses = [1.0] * 8
    losses[at - 1] = float("nan") if at == 5 else float("inf")
    job = Job(losses, every=(4, 100, 2))
    job.state.checkpoints = tmp_path / "checkpoints"
    with pytest.raises(NonFiniteLossError, match=named) as e:
        _run(job)
    assert "no checkpoint was saved before the divergence" in str(e.value)
    assert "save 4" in job.calls and f"read {at}" not in job.calls and "save 6" not in job.calls


def test_non_finite_weights_are_never_saved():
    job = Job([1.0] * 6)
    with torch.no_grad():
        job.model.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match="the weights became non-finite at update 4"):
        _run(job)
    assert not [c for c in job.calls if c.startswith("save")]


# --- resume rules -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Cfg:
    out: str = "run"
    seed: int = 0
    lr: float = 1.0
    new: str = "x"
    log_every: int = 10


RULES = SettingRules(
    defining=("seed", "new"), adjustable=("lr",), silent=("out", "log_every"), older_runs={"new": "old"}
)


def _header(**model):
    from gptcli.model.build import arch_of

    return SimpleNamespace(arch=arch_of(ModelConfig()), model={"n_layer": 2, "attn_pdrop": 0.1, **model})


def test_a_resume_names_every_defining_change_and_notes_the_adjustable_ones():
    mcfg = ModelConfig(n_layer=2, attn_pdrop=0.1)
    saved = {"seed": 0, "lr": 1.0, "new": "x"}
    assert check_resume("run", RULES, Cfg(lr=0.5), saved, _header(), mcfg) == [
        "resuming with changed settings: lr 1.0 → 0.5"
    ]
    with pytest.raises(GPT1Error) as e:
        check_resume("run", RULES, Cfg(seed=3), saved, _header(n_layer=4), mcfg, inputs=["data a → b"])
    assert str(e.value) == (
        "run: cannot resume with changed settings: data a → b, model n_layer 4 → 2, seed 0 → 3 "
        "(these define the run: resume without changing them, or start a new run with another "
        "--out)"
    )
    # A setting a run recorded before it existed is compared against what such runs did, not today's default.
    with pytest.raises(GPT1Error, match="new old → x"):
        check_resume("run", RULES, Cfg(), {"seed": 0, "lr": 1.0}, _header(), mcfg)
    # Dropout is regularisation, not shape: noted. A difference the job cannot attribute, only when nothing else is.
    assert check_resume("run", RULES, Cfg(), saved, _header(attn_pdrop=0.0), mcfg) == [
        "resuming with changed settings: model attn_pdrop 0.0 → 0.1"
    ]
    with pytest.raises(GPT1Error, match="changed settings: tokenizer a → b"):
        check_resume("run", RULES, Cfg(), saved, _header(), mcfg, unexplained="tokenizer a → b")
    with pytest.raises(GPT1Error, match="changed settings: seed 0 → 3 \\("):
        check_resume("run", RULES, Cfg(seed=3), saved, _header(), mcfg, unexplained="tokenizer a → b")


def test_a_defining_value_of_an_adjustable_setting_is_refused_to_and_from():
    # An adjustable setting with a value that changes what the run computes (fine-tuning's layout "shared"):
    # changes among the other values are noted, a change to or from that value is refused.
    rules = dataclasses.replace(RULES, defining_values={"lr": (9.0,)})
    mcfg, saved = ModelConfig(n_layer=2, attn_pdrop=0.1), {"seed": 0, "lr": 1.0, "new": "x"}
    assert check_resume("run", rules, Cfg(lr=0.5), saved, _header(), mcfg) == [
        "resuming with changed settings: lr 1.0 → 0.5"
    ]
    with pytest.raises(GPT1Error, match=r"changed settings: lr 1\.0 → 9\.0 \(these define the run"):
        check_resume("run", rules, Cfg(lr=9.0), saved, _header(), mcfg)
    with pytest.raises(GPT1Error, match=r"changed settings: lr 9\.0 → 1\.0 \(these define the run"):
        check_resume("run", rules, Cfg(lr=1.0), {**saved, "lr": 9.0}, _header(), mcfg)
    assert check_resume("run", rules, Cfg(lr=9.0), {**saved, "lr": 9.0}, _header(), mcfg) == []


@pytest.mark.parametrize("module", ["gptcli.train.pretrain_config", "gptcli.train.finetune_config"])
def test_every_setting_of_every_run_is_classified_once(module):
    import importlib

    mod = importlib.import_module(module)
    config = next(v for k, v in vars(mod).items() if k.endswith("Config") and dataclasses.is_dataclass(v))
    rules = mod.RULES
    groups = rules.defining + rules.adjustable + rules.silent
    assert sorted(groups) == sorted(f.name for f in dataclasses.fields(config))


# --- the run directory ------------------------------------------------------------------------------------------


def _step(out: Path, step: int) -> Path:
    from toy_model import save_tiny_pretrained

    return save_tiny_pretrained(out, step=step)


def test_the_plan_for_out_is_the_same_rule_for_every_kind(tmp_path):
    pre = RunKind("pretrain-run", "pretraining run", overwrite=False)
    fine = RunKind(
        "finetune-run", "fine-tuning run", overwrite=True, final="a fine-tuned checkpoint", results="results.json"
    )
    kw = dict(inputs=[], report=RecordingProgress())
    assert plan_run_dir(pre, tmp_path / "new", resume=False, overwrite=False, **kw).mode == "fresh"
    run = tmp_path / "run"
    _step(run, 2), _step(run, 4)
    mark(run, "pretrain-run")
    with pytest.raises(GPT1Error, match="already holds checkpoints \\(pass --resume to continue it, or choose another"):
        plan_run_dir(pre, run, resume=False, overwrite=False, **kw)
    mark(run, "finetune-run")
    plan = plan_run_dir(fine, run, resume=True, overwrite=False, **kw)
    assert plan.mode == "resume" and [c.name for c in plan.steps] == ["step-0000002", "step-0000004"]
    with pytest.raises(
        GPT1Error,
        match="holds an unfinished fine-tuning run with checkpoints \\(pass --resume to "
        "continue it, or --overwrite to start it over\\)",
    ):
        plan_run_dir(fine, run, resume=False, overwrite=False, **kw)
    assert plan_run_dir(fine, run, resume=False, overwrite=True, **kw).mode == "replace"


@dataclasses.dataclass
class _Settings:
    seed: int = 0
    lr: float = 0.1


def test_a_finished_run_resumed_is_opened_with_its_results_once_its_settings_match(tmp_path):
    """open_run reads a finished run's results back and compares the settings they record (finished_results); a
    changed defining setting, or unreadable results, is refused naming the file and --overwrite."""
    rules = SettingRules(defining=("seed",), adjustable=("lr",), silent=())
    fine = RunKind(
        "finetune-run", "fine-tuning run", overwrite=True, final="a fine-tuned checkpoint", results="results.json"
    )
    run = tmp_path / "run"
    (run / "checkpoints" / "final").mkdir(parents=True)
    (run / "checkpoints" / ".step-0000002.tmp-1").mkdir()  # a kill's leftover, removed by rank 0
    mark(run, "finetune-run")
    results = run / "results.json"
    results.write_text(json.dumps({"config": {"seed": 1, "lr": 0.1}, "steps": 3}), encoding="utf-8")
    settings = _Settings(seed=1, lr=0.2)
    assert finished_results(results, rules, settings)["steps"] == 3  # an adjustable change is no refusal
    with pytest.raises(GPT1Error, match="the run is finished with other settings: seed 1 → 2 \\(pass --overwrite"):
        finished_results(results, rules, _Settings(seed=2, lr=0.1))
    rec = RecordingProgress()
    kw = dict(resume=True, overwrite=False, verify=True, inputs=[], par=Parallel(), report=rec)
    with open_run(fine, run, settings=settings, rules=rules, **kw) as opened:
        assert opened.mode == "done" and opened.results is not None and opened.results["steps"] == 3
    assert not list((run / "checkpoints").glob(".*")) and "already finished" in rec.of("note")[-1]["message"]
    results.write_text("{", encoding="utf-8")
    with pytest.raises(GPT1Error, match="results.json: unreadable results of a finished run .*--overwrite"):
        finished_results(results, rules, settings)


@pytest.mark.parametrize("locked", ["run", "checkpoints"])
def test_an_unwritable_run_directory_is_refused_before_training(locked, tmp_path, monkeypatch):
    """A resume (or a fresh start) into a run directory, or a checkpoints/ folder, it may not write in is refused
    by the plan, naming it: the run used to train first and fail at its first checkpoint. Root writes anywhere,
    so the permission is simulated (os.access, as the check asks it)."""
    import gptcli.train.run.directory as directory

    run = tmp_path / "run"
    _step(run, 2)
    mark(run, "pretrain-run")
    denied = run if locked == "run" else run / "checkpoints"
    real = os.access
    monkeypatch.setattr(directory.os, "access", lambda p, mode, **k: Path(p) != denied and real(p, mode, **k))
    kind = RunKind("pretrain-run", "pretraining run", overwrite=False)
    kw = dict(overwrite=False, inputs=[], report=RecordingProgress())
    with pytest.raises(GPT1Error, match=f"^cannot write in {re.escape(str(denied))}: .*\\(make it writable, or copy"):
        plan_run_dir(kind, run, resume=True, **kw)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()  # nothing to resume: a fresh start into it is refused alike
    with pytest.raises(GPT1Error, match="\\(make it writable, or choose another --out\\)"):
        plan_run_dir(kind, run, resume=False, **kw)


def test_a_resume_skips_a_damaged_checkpoint_and_says_so(tmp_path):
    run = tmp_path / "run"
    _step(run, 2)
    newest = _step(run, 4)
    (newest / "model.safetensors").write_bytes(b"damaged")
    mark(run, "pretrain-run")
    rec = RecordingProgress()
    kind = RunKind("pretrain-run", "pretraining run", overwrite=False)
    kw = dict(resume=True, overwrite=False, verify=True, inputs=[], par=Parallel(), report=rec)
    with open_run(kind, run, **kw) as opened:
        assert opened.resume_from is not None and opened.resume_from.name == "step-0000002"
    [warning] = [n["message"] for n in rec.of("note")]
    assert warning.startswith("skipping checkpoint step-0000004: ")
    (run / "checkpoints" / "step-0000002" / "model.safetensors").write_bytes(b"damaged")
    with pytest.raises(GPT1Error, match="no intact checkpoint .*\\(restore a checkpoint, or pass --no-verify"):
        with open_run(kind, run, **kw):
            pass


def test_metrics_are_cut_back_to_what_the_checkpoint_had_seen(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"kind": "train", "step": 2},
        {"kind": "eval", "step": 2},
        {"kind": "train", "step": 4},
        {"kind": "eval", "step": 4},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    reopen_metrics(path, 3, 4, RecordingProgress())  # counted: an eval of step 4 the checkpoint never saw goes
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:3]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    reopen_metrics(path, None, 2, RecordingProgress())  # a checkpoint from before records were counted: by step
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:2]
    rec = RecordingProgress()
    reopen_metrics(path, 5, 4, rec)
    assert "3 of the 5 records the checkpoint had seen are missing" in rec.of("note")[0]["message"]


# --- fine-tuning under the one policy -----------------------------------------------------------------------------


def test_fine_tuning_stops_on_a_nan_naming_the_checkpoint_before_it(pretrained, shared_data, tmp_path, monkeypatch):
    """Fine-tuning had its own policy (a plain error, no checkpoint named); now the one every run has."""
    from gptcli.train.finetune import FinetuneConfig, finetune
    from gptcli.train.finetune_job import TaskLoss

    real, calls = TaskLoss.__call__, {"n": 0}

    def poisoned(self, model, batch):
        calls["n"] += 1
        loss = real(self, model, batch)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(TaskLoss, "__call__", poisoned)
    run = tmp_path / "ft"
    cfg = FinetuneConfig(
        task="sst2",
        init=str(pretrained),
        out=str(run),
        data_dir=str(shared_data / "glue/SST-2"),
        max_train_examples=40,
        max_eval_examples=8,
        batch_size=4,
        epochs=1,
        log_every=3,
        save_every=2,
        device="cpu",
        precision="fp32",
    )
    with pytest.raises(NonFiniteLossError) as e:
        finetune(cfg)
    msg = str(e.value)
    assert "loss became nan at update 5" in msg and "\n" not in msg
    # Update 5's loss came from the weights after update 4: step-4 holds them, step-2 is the one to resume from.
    assert f"the newest checkpoint from before the divergence is {run / 'checkpoints' / 'step-0000002'}" in msg
    assert "move away the later step-0000004, then resume with --resume" in msg
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]


def _tiny_pretraining(tmp_path: Path) -> tuple[Path, dict]:
    from corpus_helpers import random_corpus

    corpus, run = random_corpus(tmp_path / "corpus"), tmp_path / "run"
    return run, dict(
        data=corpus,
        out=run,
        preset="tiny",
        model={"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16},
        seq_len=16,
        batch_size=4,
        warmup_steps=1,
        eval_every=2,
        save_every=2,
        log_every=1,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )


def test_a_finished_pretraining_run_resumed_as_it_was_validates_and_writes_nothing_new(tmp_path):
    from gptcli.train.pretrain import PretrainConfig, pretrain

    run, kw = _tiny_pretraining(tmp_path)
    first = pretrain(PretrainConfig(max_steps=2, **kw))
    again = pretrain(PretrainConfig(max_steps=2, resume=True, **kw))
    assert again.step == 2 and again.final_val_loss == first.final_val_loss
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002"]


def test_an_old_pretraining_checkpoint_without_a_record_count_still_resumes(tmp_path):
    """Checkpoints written before the run machinery counted metrics records cut metrics.jsonl back by step."""
    from gptcli.train.pretrain import PretrainConfig, pretrain

    run, kw = _tiny_pretraining(tmp_path)
    pretrain(PretrainConfig(max_steps=2, **kw))
    state = run / "checkpoints" / "step-0000002" / "training_state.json"
    doc = json.loads(state.read_text())
    assert doc.pop("records") == 3  # two train lines and an eval line
    state.write_text(json.dumps(doc))
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "train", "step": 3}) + "\n")  # written after the checkpoint by a killed run
    res = pretrain(PretrainConfig(max_steps=4, resume=True, verify_data=False, **kw))
    assert res.step == 4
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 2, 3, 4, 4]
