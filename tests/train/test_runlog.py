"""The run log's displays and TensorBoard after a resume: an MFU above 100 % (a peak measured too low) is not shown
as a figure, and the points a crashed process logged after its checkpoint are purged when the run resumes."""

from __future__ import annotations

import pytest

from gptcli.train.runlog import RunLogger, mfu_text


def test_mfu_above_one_is_not_shown_as_a_figure():
    assert mfu_text(None) == "n/a"
    assert mfu_text(0.4567) == "45.7%"
    assert mfu_text(1.7).startswith("n/a") and "--peak-flops" in mfu_text(1.7)


def _tensorboard_steps(run_dir) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, round(e.value, 3)) for e in acc.Scalars("train/loss")]


def test_a_resumed_run_purges_the_points_logged_after_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    crashed = RunLogger(tmp_path, tensorboard=True)
    for step in range(1, 6):  # the checkpoint was at step 3; steps 4 and 5 were logged, then the process died
        crashed.log({"kind": "train", "step": step, "loss": 10.0 - step})
    crashed.close()
    resumed = RunLogger(tmp_path, tensorboard=True, purge_step=4)
    for step in (4, 5):
        resumed.log({"kind": "train", "step": step, "loss": 1.0})
    resumed.close()
    assert _tensorboard_steps(tmp_path) == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 1.0), (5, 1.0)]
