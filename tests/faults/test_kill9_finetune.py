"""kill -9 anywhere in a CPU fine-tuning run, then `gpt1 finetune --resume` to the end: the same final weights
(sha256 of the final checkpoint's files), the same results.json scores and history, and the same metrics.jsonl
records (timing fields aside), bitwise, as a run never interrupted. The fine-tuning half of tests/faults/test_kill9.py.

Two tests on one small run (`python -m gptcli finetune`, the real command: a 1-block model with dropout on, a
64-id BPE, 96 SST-2-format sentences in batches of 4 for 2 epochs = 48 updates, ``--save-every 1``). One kills it
with SIGKILL at four seeded random moments — one during start-up, three in training at a random update of each third
of the run, a random few milliseconds after its checkpoint appeared, where most of the time goes to writing the
next checkpoint. The other kills it deterministically inside each step of a checkpoint write — a half-written
model.safetensors, optimizer.safetensors and best.safetensors (the best epoch's weights), a complete checkpoint not
yet renamed into place, an old checkpoint half pruned, a half-written final checkpoint, and the removal of the step
checkpoints once the run is complete: each time the previous checkpoint survives intact and the run resumes from it.
Eleven kills in all; every process start costs 2-3 s of imports, so the two tests take about 40 s on 2 CPU cores
(60 s when other jobs share them).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from gptcli.files.outputs import MARKER
from tests.faults.conftest import (
    finish,
    kill_and_resume,
    kill_in_write,
    sst2_inputs,
    start_gpt1,
    step_numbers,
)

pytestmark = pytest.mark.slow

EPOCHS, N_TRAIN, BATCH = 2, 96, 4
STEPS = EPOCHS * N_TRAIN // BATCH  # 48
TIMING = ("tokens_per_s", "elapsed_s")


@pytest.fixture(scope="module")
def inputs(corpus, tmp_path_factory) -> tuple[Path, Path]:
    """(a "pretrained" checkpoint with the corpus's real tokenizer, so a subprocess can load it; an SST-2 folder)."""
    return sst2_inputs(corpus, tmp_path_factory.mktemp("kill9-ft"), N_TRAIN, 16)


def _args(inputs: tuple[Path, Path], out: Path) -> list[str]:
    pre, data = inputs
    # --resume from the very first start: with no checkpoint yet it starts fresh, so every start is the same line.
    return [
        "finetune",
        "--task",
        "sst2",
        "--init",
        str(pre),
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--batch-size",
        str(BATCH),
        "--epochs",
        str(EPOCHS),
        "--lr",
        "1e-3",
        "--log-every",
        "1",
        "--save-every",
        "1",
        "--keep-last",
        "2",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--quiet",
        "--resume",
    ]


def _final(run: Path) -> tuple[dict, dict, list]:
    """(sha256 of each file of the final checkpoint but config.json, which names the run's own paths; results.json's
    scores, history, kept epoch and updates; the metrics records without their timing fields)."""
    from gptcli.checkpoint import verify_checkpoint

    final = run / "checkpoints" / "final"
    assert verify_checkpoint(final) == []
    files = {
        p.relative_to(final).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in final.rglob("*")
        if p.is_file() and p.name != "config.json"
    }
    r = json.loads((run / "results.json").read_text())
    results = {k: r[k] for k in ("scores", "history", "epoch", "steps")}
    records = [
        {k: v for k, v in json.loads(x).items() if k not in TIMING}
        for x in (run / "metrics.jsonl").read_text().splitlines()
    ]
    return files, results, records


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> tuple[dict, dict, list]:
    run = tmp_path_factory.mktemp("reference") / "run"
    finish(start_gpt1(_args(inputs, run)))
    files, results, records = _final(run)
    assert results["steps"] == STEPS and len(results["history"]) == EPOCHS
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, STEPS + 1))
    return files, results, records


def _assert_clean(run: Path) -> None:
    """Only the final checkpoint remains: no step checkpoint, no temporary, no half-pruned directory."""
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["final"]
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == [MARKER]  # gpt1's marker, no temporaries


def test_kill_at_random_points_then_resume_is_bitwise_identical(inputs, reference, tmp_path):
    rng = random.Random(13)
    # First a kill a random time after launch (importing, reading and encoding the task, building the model). Then
    # three in training: once the newest checkpoint reaches a random update in each third of the run (so the kills
    # land where they should however fast this machine is), a random 0-40 ms later — in an update, a dev score
    # (update 24 ends epoch 1), or, most of the time with --save-every 1, writing or pruning a checkpoint.
    schedule = [("start", 0, rng.uniform(0.3, 1.5))] + [
        ("train", rng.randint(lo, lo + 9), rng.uniform(0.0, 0.04)) for lo in (3, 18, 33)
    ]
    run = tmp_path / "run"
    kills = kill_and_resume(
        _args(inputs, run), run, [(None if when == "start" else target, delay) for when, target, delay in schedule]
    )
    mid_write = sum(k.mid_write for k in kills)
    print(f"kills: {kills}; {mid_write} during a checkpoint write")
    assert len(kills) == len(schedule), kills
    assert all(0 <= k.newest < STEPS for k in kills) and kills[-1].newest > 0  # every kill landed in training
    assert _final(run) == reference, (kills, mid_write)
    _assert_clean(run)


# --- deterministic kills inside a checkpoint write ------------------------------------------------------------------

# (what, in which checkpoint, the newest step checkpoint that must be left intact). Epoch 1 ends at update 24, so
# from update 25 on every checkpoint also holds epoch 1's weights (best.safetensors) unless epoch 2 beat it.
# step-0000021 is pruned while step-0000023 is saved (--keep-last 2); "final" is written after update 48, and the
# step checkpoints are removed (47 first) once results.json is written.
KILLS = [
    ("model.safetensors", "step-0000005", 4),
    ("optimizer.safetensors", "step-0000009", 8),
    ("rename", "step-0000014", 13),
    ("prune", "step-0000021", 23),
    ("best.safetensors", "step-0000030", 29),
    ("model.safetensors", "final", 48),
    ("prune", "step-0000047", 48),
]


def test_kill_inside_each_step_of_a_checkpoint_write(inputs, reference, tmp_path):
    from gptcli.checkpoint import verify_checkpoint

    run = tmp_path / "run"
    for what, at, newest in KILLS:
        kill_in_write(_args(inputs, run), what, at)
        # The checkpoint being written is not visible; the one before it is whole and is where --resume goes.
        assert max(step_numbers(run)) == newest, (what, at, step_numbers(run))
        assert verify_checkpoint(run / "checkpoints" / f"step-{newest:07d}") == []
    assert json.loads((run / "results.json").read_text())["steps"] == STEPS  # the last kill came after results.json
    finish(start_gpt1(_args(inputs, run)))
    assert _final(run) == reference
    _assert_clean(run)
