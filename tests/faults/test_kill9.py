"""kill -9 anywhere in a CPU pretraining run, then `--resume` to the end: the same final weights (sha256 of every
checkpoint file) and the same metrics.jsonl, bitwise, as a run never interrupted.

Two tests. One kills `python -m gptcli pretrain` (the real command) with SIGKILL at 12 seeded random moments —
two during start-up, ten a random time after the process saved its first new checkpoint, where with
``--save-every 1`` most of the time goes to writing checkpoints. The other kills a run deterministically inside
each step of a checkpoint write (a half-written model.safetensors, a half-written optimizer.safetensors, a complete
checkpoint not yet renamed into place, an old checkpoint half pruned): the previous checkpoint survives intact and
the run resumes from it.

The same for fine-tuning is tests/faults/test_kill9_finetune.py.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from gptcli.files.outputs import MARKER
from tests.faults.conftest import (
    TINY_ARGS,
    finish,
    kill_and_resume,
    kill_in_write,
    start_gpt1,
    step_numbers,
)

pytestmark = pytest.mark.slow

STEPS = 200
ARGS = ["--max-steps", str(STEPS), "--save-every", "1", "--keep-last", "2", *TINY_ARGS]


def _args(data: Path, out: Path) -> list[str]:
    # --resume from the very first start: with no checkpoint yet it starts fresh, so every start is the same line.
    return ["pretrain", "--data", str(data), "--out", str(out), *ARGS, "--resume"]


def _final(run: Path) -> tuple[dict, list, list]:
    """(the final checkpoint: sha256 of each file but training_state.json, which is compared parsed; train records'
    (step, loss, lr, grad_norm); eval records' (step, loss))."""
    from gptcli.checkpoint import list_checkpoints, verify_checkpoint

    newest = list_checkpoints(run)[-1]
    assert verify_checkpoint(newest) == []
    files: dict = {
        p.relative_to(newest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in newest.rglob("*")
        if p.is_file() and p.name not in ("config.json", "training_state.json")
    }
    state = json.loads((newest / "training_state.json").read_text())
    # Python's and numpy's global RNGs are recorded but never seeded or used by pretraining, so their state differs
    # between any two runs (interrupted or not); torch's, which dropout uses, is in optimizer.safetensors above.
    del state["rng"]["python"], state["rng"]["numpy"]
    files["training_state.json"] = state
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in recs if r["kind"] == "train"]
    evals = [(r["step"], r["loss"]) for r in recs if r["kind"] == "eval"]
    return files, train, evals


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> tuple[dict[str, str], list, list]:
    run = tmp_path_factory.mktemp("reference") / "run"
    finish(start_gpt1(_args(corpus, run)))
    files, train, evals = _final(run)
    assert [s for s, *_ in train] == list(range(1, STEPS + 1)) and len(evals) == 1
    return files, train, evals


def _assert_clean(run: Path) -> None:
    """Only the last two complete checkpoints remain: no temporary, no half-pruned directory."""
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [f"step-{STEPS - 1:07d}", f"step-{STEPS:07d}"], names
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == [MARKER]  # gpt1's marker, no temporaries


def test_kill_at_random_points_then_resume_is_bitwise_identical(corpus, reference, tmp_path):
    rng = random.Random(17)
    # (when, delay): "start" = seconds after launch (importing, opening the corpus, building the model, resuming);
    # "train" = seconds after the process saved its first new checkpoint (updates, checkpoint writes, pruning).
    schedule = [("start", rng.uniform(0.3, 2.0)) for _ in range(2)] + [
        ("train", rng.uniform(0.0, 0.12)) for _ in range(10)
    ]
    rng.shuffle(schedule)
    run = tmp_path / "run"
    # A "train" kill waits for the first checkpoint after the one the start resumes from, read just before it.
    moments = ((None if when == "start" else max(step_numbers(run), default=0) + 1, delay) for when, delay in schedule)
    kills = kill_and_resume(_args(corpus, run), run, moments)
    mid_write = sum(k.mid_write for k in kills)
    print(f"kills: {kills}; {mid_write} during a checkpoint write")
    assert len(kills) >= 10, kills
    assert max(k.newest for k in kills) < STEPS  # every kill landed before the end
    assert _final(run) == reference, (kills, mid_write)
    _assert_clean(run)


# --- deterministic kills inside a checkpoint write ------------------------------------------------------------------

# (what, in which checkpoint, the newest step checkpoint that must be left intact). step-0000018 is pruned once
# step-0000020 is in place (--keep-last 2).
KILLS = [
    ("model.safetensors", "step-0000005", 4),
    ("optimizer.safetensors", "step-0000009", 8),
    ("rename", "step-0000014", 13),
    ("prune", "step-0000018", 20),
]


def test_kill_inside_each_step_of_a_checkpoint_write(corpus, reference, tmp_path):
    from gptcli.checkpoint import list_checkpoints, verify_checkpoint

    run = tmp_path / "run"
    args = _args(corpus, run)
    for what, at, newest in KILLS:
        kill_in_write(args, what, at)
        # The checkpoint being written is not visible; the one before it is whole. (Killed while pruning, the new
        # checkpoint was already in place.)
        assert list_checkpoints(run)[-1].name == f"step-{newest:07d}", (what, at, list_checkpoints(run))
        assert verify_checkpoint(run / "checkpoints" / f"step-{newest:07d}") == []
    finish(start_gpt1(args))
    assert _final(run) == reference
    _assert_clean(run)
