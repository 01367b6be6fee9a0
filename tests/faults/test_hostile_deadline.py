"""Issue #31, the quickstart's minutes: pretraining is sized from a few timed updates, and a machine that gets busier
meanwhile used to overrun the promise (6 min 39 s with one other process, past 10 with three). Now the plan comes
with a deadline: ``PretrainConfig.max_minutes``, which stops pretraining there — validated and saved as at the end,
with a warning saying so — and the quickstart sets it to what its budget leaves for pretraining.

No test measures wall-clock time: a deadline far shorter than the plan must stop the run early, and say so.
"""

from __future__ import annotations

import pytest

from gptcli.errors import GPT1Error
from gptcli.progress import RecordingProgress
from tests.faults.conftest import MODEL

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pretraining_stops_at_its_time_limit_saved_validated_and_said(corpus, tmp_path):
    from gptcli.train.pretrain import PretrainConfig, pretrain

    rec = RecordingProgress()
    out = tmp_path / "run"
    res = pretrain(
        PretrainConfig(
            data=corpus,
            out=out,
            preset="tiny",
            model=dict(MODEL),
            seq_len=16,
            batch_size=4,
            max_steps=1_000_000,
            warmup_steps=1,
            eval_every=0,
            eval_batches=1,
            save_every=0,
            log_every=1000,
            device="cpu",
            precision="fp32",
            peak_flops=1e11,
            max_minutes=1e-6,
        ),
        progress=rec,
    )
    assert res.step < res.total_steps and res.stopped_by is None
    assert res.final_val_loss is not None and res.last_checkpoint is not None and res.last_checkpoint.is_dir()
    notes = [n["message"] for n in rec.of("note") if n.get("level") == "warn"]
    assert any("stopped at the time limit" in n and f"of {res.total_steps}" in n for n in notes), notes


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_an_impossible_time_limit_is_refused(bad):
    from gptcli.config import check_setting

    with pytest.raises(GPT1Error, match="--max-minutes .* is impossible"):
        check_setting("max_minutes", bad)


def test_the_quickstart_gives_pretraining_a_deadline_within_its_minutes(tmp_path, monkeypatch):
    """Timed updates that promise far more than the machine delivers (1 µs each): the plan is huge, the deadline is
    what holds the promise."""
    import gptcli.train.pretrain as pretrain_module
    from gptcli.pipelines import budget
    from gptcli.pipelines.quickstart import QuickstartConfig, quickstart
    from tests.pipelines.test_quickstart import TINY

    seen = {}

    class Planned(Exception):
        pass

    def fake_pretrain(pc, progress=None, **_):
        seen["pc"] = pc
        raise Planned

    monkeypatch.setattr(budget, "time_update", lambda *a, **k: 1e-6)
    monkeypatch.setattr(pretrain_module, "pretrain", fake_pretrain)
    cfg = {k: v for k, v in TINY.items() if k != "pretrain_steps"}
    with pytest.raises(Planned):
        quickstart(QuickstartConfig(out=tmp_path / "qs", **{**cfg, "minutes": 2.0}))
    pc = seen["pc"]
    assert pc.max_minutes is not None and 0 < pc.max_minutes < 2.0
    assert pc.max_steps * 1e-6 / 60 <= 2.0  # the plan itself fits at the timed speed; the deadline caps the rest


def test_one_budget_across_every_stage_and_a_starved_stage_says_so(tmp_path, monkeypatch):
    """A machine far slower than its timed updates (a clock running 200× fast): the budget is spent before
    pretraining, which gets its minimum and is flagged; fine-tuning gets a hard time limit from what is left (its
    minimum, here) and the summary marks the figures pretraining starved as meaning nothing."""
    import time

    import gptcli.train.finetune as finetune_module
    from gptcli.pipelines import budget
    from gptcli.pipelines.quickstart import (
        LEARNING_UPDATES,
        MIN_FINETUNE_SECONDS,
        QuickstartConfig,
        quickstart,
        summary_rows,
    )
    from tests.pipelines.test_quickstart import TINY

    t0 = time.monotonic()
    monkeypatch.setattr(budget, "clock", lambda: t0 + 200 * (time.monotonic() - t0))
    limits = []
    real_finetune = finetune_module.finetune

    def finetune(fc, progress=None, **kw):
        limits.append(fc.max_minutes)
        return real_finetune(fc, progress=progress, **kw)

    monkeypatch.setattr(finetune_module, "finetune", finetune)
    rec = RecordingProgress()
    cfg = {k: v for k, v in TINY.items() if k != "pretrain_steps"}
    res = quickstart(QuickstartConfig(out=tmp_path / "qs", **cfg), rec)
    n = res.numbers
    assert n["pretrain_starved"] and n["pretrain_steps"] < LEARNING_UPDATES and not n["finetune_starved"]
    assert limits == [MIN_FINETUNE_SECONDS / 60.0]  # the budget was spent: fine-tuning's floor, as a hard limit
    warns = [m["message"] for m in rec.of("note") if m["level"] == "warn"]
    assert any("mean nothing" in w and "pretraining" in w for w in warns), warns
    summaries = [e["summary"] for e in rec.of("end") if "updates;" in e["summary"]]
    assert "these figures mean nothing" in summaries[-2] and "mean nothing" not in summaries[-1]  # the stages' lines
    rows = {what: meaning for what, _, meaning in summary_rows(n)}
    assert rows["validation perplexity, after pretraining"].startswith("MEANS NOTHING")
    assert rows["zero-shot MCC, after pretraining"].startswith("MEANS NOTHING")
    assert not rows["fine-tuned test MCC"].startswith("MEANS NOTHING")


def test_fine_tuning_stops_at_its_time_limit_and_a_starved_one_says_so(tmp_path, monkeypatch):
    """Fine-tuning's share far below one epoch's updates: it stops at its time limit, and its figures are flagged."""
    from gptcli.pipelines import quickstart as qs
    from tests.pipelines.test_quickstart import TINY

    monkeypatch.setattr(qs, "MIN_FINETUNE_SECONDS", 1e-3)  # what fine-tuning gets once the budget is spent
    monkeypatch.setattr(qs.budget.Deadline, "left", lambda self: -1.0)  # spent from the start
    cfg = {k: v for k, v in TINY.items() if k != "pretrain_steps"}
    rec = RecordingProgress()
    res = qs.quickstart(qs.QuickstartConfig(out=tmp_path / "qs", **{**cfg, "max_train_examples": 256}), rec)
    assert res.numbers["finetune_starved"]
    warns = [m["message"] for m in rec.of("note") if m["level"] == "warn"]
    assert any("stopped at the time limit" in w for w in warns), warns
    assert any("fine-tuning" in w and "mean nothing" in w for w in warns), warns
    rows = {what: meaning for what, _, meaning in qs.summary_rows(res.numbers)}
    assert rows["fine-tuned test MCC"].startswith("MEANS NOTHING")


def test_a_long_step_without_progress_of_its_own_shows_its_elapsed_time(tmp_path, monkeypatch):
    """The CPU kernels' first compile (minutes on a busy 2-core machine) once sat behind a heading with no sign of
    life: while it runs, its stage hears the elapsed time."""
    import time

    from gptcli.model import kernels
    from gptcli.pipelines import quickstart as qs
    from tests.pipelines.test_quickstart import TINY

    def slow_compile(device, progress):
        progress.stage("compile the CPU kernels for this machine (once)")
        time.sleep(0.5)
        progress.end()

    class Stop(Exception):
        pass

    def collect_text(run):
        raise Stop

    monkeypatch.setattr(qs, "TICK_SECONDS", 0.05)
    monkeypatch.setattr(kernels, "prepare", slow_compile)
    monkeypatch.setattr(qs, "collect_text", collect_text)
    rec = RecordingProgress()
    with pytest.raises(Stop):
        qs.quickstart(qs.QuickstartConfig(**{**TINY, "out": str(tmp_path / "qs")}), rec)
    ticks = [a for a in rec.of("advance") if "elapsed" in a]
    assert len(ticks) >= 3, rec.events


def test_ctrl_c_of_the_quickstart_exits_130_keeping_nothing(tmp_path, capsys, monkeypatch):
    """Ctrl-C during pretraining: the run checkpoints and stops, and the quickstart (all or nothing) ends as every
    interrupted command does — exit 130, one line — instead of an error with exit 1."""
    import signal

    from error_lines import assert_one_line_error

    import gptcli.train.pretrain as pretrain_module
    from gptcli.config import save_config
    from gptcli.pipelines.quickstart import QuickstartConfig
    from gptcli.progress import SILENT
    from tests.faults.conftest import gpt1
    from tests.pipelines.test_quickstart import TINY

    real = pretrain_module.pretrain

    class CtrlC(type(SILENT)):  # the user's Ctrl-C at the first update
        def advance(self, n=0, **status):
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(pretrain_module, "pretrain", lambda pc, progress=None, **kw: real(pc, CtrlC(), **kw))
    cfg = tmp_path / "qs.toml"
    save_config(QuickstartConfig(**TINY), cfg)
    out = tmp_path / "qs"
    res = gpt1(["quickstart", "--config", cfg, "--out", out], capsys)
    assert_one_line_error(res, "pretraining stopped by SIGINT", "kept nothing", code=130)
    assert not out.exists()
