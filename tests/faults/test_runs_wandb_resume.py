"""W&B across a crash and ``--resume`` (gptcli/train/runlog.py): the resumed run continues the same W&B run and, where
W&B could not resume it (offline: each process writes its own local run, and syncing one replaces the last), the
newest W&B run still holds the whole history, each step once, as metrics.jsonl does. A run started afresh over an
unfinished one gets a new W&B run, not the old one whose steps W&B would drop as already logged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

wandb = pytest.importorskip("wandb", reason="wandb is part of the dev extra (pip install -e '.[dev]')")

from wandb_helpers import logged, offline_runs, wandb_records  # noqa: E402

from tests.faults.conftest import TINY_ARGS, gpt1  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

_offline = pytest.fixture(autouse=True)(offline_runs)


def pretrain(corpus: Path, run: Path, steps: int, *extra: str) -> list[str]:
    return [
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(run),
        *TINY_ARGS,
        "--max-steps",
        str(steps),
        "--save-every",
        "2",
        "--keep-last",
        "0",
        "--wandb",
        *extra,
    ]


def crashed_after_step_4(corpus: Path, run: Path, capsys) -> None:
    """A run that logged 4 updates but whose last checkpoint is step 2 (killed before its step-4 checkpoint)."""
    assert gpt1(pretrain(corpus, run, 4), capsys).code == 0
    shutil.rmtree(run / "checkpoints" / "step-0000004")


def history_steps(run: Path) -> list[int]:
    """The step of every history row of the newest offline W&B run, in the order logged."""
    newest = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))[-1]
    return [r.history.step.num for r in wandb_records(newest) if r.WhichOneof("record_type") == "history"]


def test_resumed_offline_run_holds_the_whole_history_once(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    crashed_after_step_4(corpus, run, capsys)
    _, first, _ = logged(run)
    res = gpt1([*pretrain(corpus, run, 6), "--resume"], capsys)
    assert res.code == 0, res.err[-3000:]
    history, summary, _ = logged(run, newest_only=True)
    assert summary["_run_id"] == first["_run_id"]  # the same W&B run
    assert history_steps(run) == [1, 2, 3, 4, 5, 6]  # before the crash too, and steps 3-4 once
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert history[r["step"]][f"{r['kind']}/loss"] == pytest.approx(r["loss"]), r


class FakeRun:
    """What gpt1 uses of a W&B run, recording the steps it is given (once each: a step's train and evaluation
    records are one row)."""

    def __init__(self, resumed: bool, log: list) -> None:
        self.resumed, self.steps, self.summary = resumed, log, {}

    def log(self, scalars, step):
        if step not in self.steps[-1:]:
            self.steps.append(step)

    def finish(self):
        pass


@pytest.fixture
def inits(monkeypatch):
    """``wandb.init`` patched: each call's arguments, and the steps its run is given; ``resumed`` says what W&B
    answers (online, a run it already holds is resumed)."""
    calls: list[SimpleNamespace] = []
    answer = SimpleNamespace(resumed=False)

    def init(**kw):
        calls.append(SimpleNamespace(kw=kw, steps=[]))
        return FakeRun(answer.resumed, calls[-1].steps)

    monkeypatch.setattr(wandb, "init", init)
    return SimpleNamespace(calls=calls, answer=answer)


def test_resume_continues_the_same_id_and_a_resumed_run_gets_only_new_steps(corpus, tmp_path, capsys, inits):
    run = tmp_path / "run"
    crashed_after_step_4(corpus, run, capsys)
    inits.answer.resumed = True  # online: W&B holds steps 1-4 already
    assert gpt1([*pretrain(corpus, run, 6), "--resume"], capsys).code == 0
    first, again = inits.calls
    assert again.kw["id"] == first.kw["id"] and again.kw["resume"] in ("allow", "must")
    assert again.steps == [3, 4, 5, 6]


def test_a_run_started_afresh_is_a_new_wandb_run(corpus, tmp_path, capsys, inits):
    run = tmp_path / "run"
    assert gpt1(pretrain(corpus, run, 2), capsys).code == 0
    shutil.rmtree(run / "checkpoints")  # an unfinished run without checkpoints: started over, from step 1
    assert gpt1(pretrain(corpus, run, 2), capsys).code == 0
    first, again = inits.calls
    assert again.kw["id"] != first.kw["id"] and again.steps == [1, 2]
