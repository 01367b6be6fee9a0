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
