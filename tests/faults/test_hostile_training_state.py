"""A resumed checkpoint's training state crafted to mislead, with its checksums recomputed so that only the values
give it away: a step of −5 or 10²⁰, an optimizer moment of the wrong shape. `pretrain --resume` refuses each in one
line instead of training on it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from error_lines import assert_one_line_error
from safetensors.torch import load_file, save_file

from tests.faults.conftest import TINY_ARGS, copy_of, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")


def _reseal(checkpoint: Path) -> None:
    """Recompute config.json's checksum table and digest, as someone crafting the files would."""
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    config["files"] = {
        p.relative_to(checkpoint).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and p.name != "config.json"
    }
    body = {k: v for k, v in config.items() if k != "config_sha256"}
    config["config_sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hexdigest()
    (checkpoint / "config.json").write_text(json.dumps(config), encoding="utf-8")


def _newest(run: Path) -> Path:
    return sorted((run / "checkpoints").iterdir())[-1]


def _resume(run: Path, capsys):
    return gpt1(["pretrain", "--out", run, "--resume", "--max-steps", "6", *TINY_ARGS], capsys)


@pytest.mark.parametrize("step", (-5, 10**20, 2.5, "4"))
def test_an_impossible_step_is_refused(step, run, tmp_path, capsys):
    mine = copy_of(run, tmp_path)
    state = _newest(mine) / "training_state.json"
    doc = json.loads(state.read_text(encoding="utf-8"))
    doc["step"] = step
    state.write_text(json.dumps(doc), encoding="utf-8")
    _reseal(_newest(mine))
    assert_one_line_error(_resume(mine, capsys), "training_state.json", f"step {step!r} is not a count of updates")


def test_an_optimizer_moment_of_the_wrong_shape_is_refused(run, tmp_path, capsys):
    mine = copy_of(run, tmp_path)
    path = _newest(mine) / "optimizer.safetensors"
    tensors = load_file(str(path))
    key = next(k for k in sorted(tensors) if k.endswith(".exp_avg") and tensors[k].dim() == 2)
    tensors[key] = torch.zeros(1, tensors[key].shape[1])  # would broadcast into every row's update
    save_file(tensors, str(path))
    _reseal(_newest(mine))
    assert_one_line_error(_resume(mine, capsys), "optimizer state does not match the model", "exp_avg of parameter")
