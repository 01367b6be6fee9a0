"""Settings that used to get past the checks: ``--dropout 1.0`` was refused under a preset field the user never typed,
a weight decay with ``lr × weight_decay ≥ 1`` trained to "done" while zeroing every weight, ``GPT1_CPU_PEAK_FLOPS=abc``
and an unknown ``gpt1 lmeval`` task ended in tracebacks. Each is one line naming what the user typed."""

from __future__ import annotations

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import TINY_ARGS, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(*drop: str) -> list[str]:
    """TINY_ARGS less the options in ``drop`` (each with its value)."""
    out, skip = [], False
    for a in TINY_ARGS:
        if skip:
            skip = False
        elif a in drop:
            skip = True
        else:
            out.append(a)
    return out


def test_dropout_one_is_refused_as_typed(corpus, tmp_path, capsys):
    args = ["pretrain", "--data", corpus, "--out", tmp_path / "run", *_tiny("--dropout"), "--dropout", "1.0"]
    line = assert_one_line_error(gpt1(args, capsys), "--dropout 1.0 is impossible")
    assert "pdrop" not in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args",
    (
        ["pretrain", "--lr", "0.001", "--weight-decay", "1000"],
        ["finetune", "--task", "rte", "--init", "none", "--lr", "0.5", "--weight-decay", "3"],
    ),
    ids=("pretrain", "finetune"),
)
def test_a_weight_decay_that_would_zero_the_weights_is_refused(args, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT1_DATA", str(tmp_path))
    extra = ["--data", corpus] if args[0] == "pretrain" else []
    res = gpt1([*args, *extra, "--out", tmp_path / "run"], capsys)
    assert_one_line_error(res, "--weight-decay", "their product must be below 1")
    assert not (tmp_path / "run").exists()


def test_a_sane_weight_decay_passes_the_rule():
    from gptcli.config import check_together

    check_together({"lr": 2.5e-4, "weight_decay": 0.01})
    check_together({"lr": 0.5, "weight_decay": 1.5})  # 0.75: strong, but still a decay


def test_a_cpu_peak_flops_that_is_not_a_number_is_one_line(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT1_CPU_PEAK_FLOPS", "abc")
    args = ["pretrain", "--data", corpus, "--out", tmp_path / "run", *_tiny("--peak-flops"), "--max-steps", "1"]
    assert_one_line_error(gpt1(args, capsys), "GPT1_CPU_PEAK_FLOPS='abc'", "unset it to measure")


def test_an_unknown_lmeval_task_is_one_line(run, capsys):
    pytest.importorskip("lm_eval")
    args = ["lmeval", "--model", "gpt1", "--model_args", f"checkpoint={run}", "--tasks", "no_such_task"]
    assert_one_line_error(gpt1(args, capsys), "Tasks not found: no_such_task", "gpt1 lmeval ls tasks")
