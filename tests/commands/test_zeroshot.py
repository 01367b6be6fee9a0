"""`gpt1 zeroshot` as a command: --help panels and defaults, every old spelling, config precedence, the choice
between one checkpoint and the curve. The library calls are replaced by recorders, so nothing is scored here (the
end-to-end runs on real files are in tests/eval/test_zeroshot.py)."""

from __future__ import annotations

import re

import pytest
from error_lines import gpt1

from gptcli.eval.curve import Curve
from gptcli.eval.zeroshot import ZeroShotConfig

# A terminal wide enough that the lines the tests read do not wrap.
WIDE = {"COLUMNS": "200"}


@pytest.fixture
def calls(monkeypatch):
    """Record what the command asks of the library instead of scoring."""
    seen: dict = {}

    def zeroshot(cfg, progress=None):
        seen["zeroshot"] = cfg
        seen["progress"] = progress
        return {}, {}, {"checkpoint": cfg.checkpoint, "step": 7}

    def run_curve(cfg, checkpoints, *, sota=None, progress=None):
        seen["curve"] = (cfg, list(checkpoints), sota)
        return Curve([], [], {}, {})

    monkeypatch.setattr("gptcli.eval.zeroshot.zeroshot", zeroshot)
    monkeypatch.setattr("gptcli.eval.curve.run_curve", run_curve)
    # The names here are made up: pass them through instead of looking them up on the Hub (tests/interop/test_hub.py).
    monkeypatch.setattr("gptcli.commands.defaults.model", lambda spec, console, flag="": str(spec or "openai-gpt"))
    monkeypatch.setattr("gptcli.commands.defaults.task_data", lambda task, data_dir, console, **k: None)
    return seen


def test_help_shows_panels_and_defaults(capsys):
    code, out, _ = gpt1(["zeroshot", "--help"], capsys, env=WIDE)
    assert code == 0
    panels = re.findall(r"╭─ (\w+) ─", out)
    assert panels == ["Options", "Input", "Evaluation", "Runtime", "Output"]
    text = " ".join(out.split())
    for flag in (
        "--task",
        "--checkpoint",
        "--split",
        "--data-dir",
        "--out",
        "--threshold",
        "--batch-size",
        "--limit",
        "--precision",
        "--device",
        "--kernels",
        "--curve",
        "--no-curve",
        "--sota",
        "--config",
    ):
        assert flag in out, flag
    assert "[default: sst2]" in text and "[default: 32]" in text and text.count("[default: auto]") == 3
    assert "dprd test (train when only train.c.txt exists)" in text
    # Each option sits in its panel.
    blocks = dict(re.findall(r"╭─ (\w+) ─+╮\n(.*?)╰", out, re.S))
    assert "--task" in blocks["Input"] and "--checkpoint" in blocks["Input"] and "--split" in blocks["Input"]
    assert "--threshold" in blocks["Evaluation"] and "--sota" in blocks["Evaluation"]
    assert "--batch-size" in blocks["Runtime"] and "--out" in blocks["Output"]


def test_every_old_spelling_parses_into_the_config(calls, capsys):
    code, out, err = gpt1(
        [
            "zeroshot",
            "--task",
            "dprd,wsc",
            "--checkpoint",
            "runs/a",
            "--split",
            "dev",
            "--split",
            "DPRD=train",
            "--data-dir",
            "data",
            "--out",
            "zs",
            "--threshold",
            "-3.5",
            "--batch-size",
            "4",
            "--limit",
            "7",
            "--precision",
            "fp32",
            "--device",
            "cpu",
            "--no-curve",
        ],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    assert calls["zeroshot"] == ZeroShotConfig(
        task="dprd,wsc",
        checkpoint="runs/a",
        split="dev",
        splits={"dprd": "train"},
        data_dir="data",
        out="zs",
        threshold=-3.5,
        batch_size=4,
        limit=7,
        precision="fp32",
        device="cpu",
    )
    assert type(calls["progress"]).__name__ == "RichProgress"
    assert "step 7" in out and "wrote zs/results.json" in out


def test_defaults_when_only_the_checkpoint_is_given(calls, capsys):
    code, _, err = gpt1(["zeroshot", "--checkpoint", "ck"], capsys, env=WIDE)
    assert code == 0, err
    assert calls["zeroshot"] == ZeroShotConfig(checkpoint="ck")


def test_several_checkpoints_make_a_curve_with_sota_overrides(calls, capsys):
    code, out, err = gpt1(
        [
            "zeroshot",
            "--task",
            "all",
            "--checkpoint",
            "a",
            "--checkpoint",
            "b",
            "--sota",
            "dprd=70",
            "--sota",
            "wsc=61.5",
            "--split",
            "dprd=train",
        ],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    cfg, checkpoints, sota = calls["curve"]
    assert checkpoints == ["a", "b"] and sota == {"dprd": 70.0, "wsc": 61.5}
    assert cfg.task == "all" and cfg.splits == {"dprd": "train"} and "zeroshot" not in calls
    assert "zero-shot curve" in out


def test_curve_flag_and_run_directory(calls, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    # --task all over a run directory: the curve; --no-curve: its newest checkpoint only.
    assert gpt1(["zeroshot", "--task", "all", "--checkpoint", str(run)], capsys, env=WIDE)[0] == 0
    assert calls.pop("curve")[1] == [str(run)]
    assert gpt1(["zeroshot", "--task", "all", "--checkpoint", str(run), "--no-curve"], capsys, env=WIDE)[0] == 0
    assert calls.pop("zeroshot").checkpoint == str(run) and "curve" not in calls
    # --curve forces it for one checkpoint and one task.
    assert gpt1(["zeroshot", "--task", "sst2", "--checkpoint", "ck", "--curve"], capsys, env=WIDE)[0] == 0
    assert calls["curve"][1] == ["ck"]


def test_config_file_precedence(calls, tmp_path, capsys):
    """defaults < --config FILE < options typed (a typed value wins even when it equals the default)."""
    cfg = tmp_path / "zs.toml"
    cfg.write_text(
        'task = "dprd,wsc"\ncheckpoint = "from-file"\nsplit = "train"\nlimit = 7\nbatch_size = 8\n'
        'precision = "fp32"\n\n[splits]\nwsc = "test"\n',
        encoding="utf-8",
    )
    code, _, err = gpt1(
        ["zeroshot", "--config", str(cfg), "--limit", "9", "--batch-size", "32", "--split", "dprd=test"],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    got = calls.pop("zeroshot")
    assert (got.task, got.checkpoint, got.split, got.limit, got.batch_size, got.precision) == (
        "dprd,wsc",
        "from-file",
        "train",
        9,
        32,
        "fp32",
    )
    assert got.splits == {"wsc": "test", "dprd": "test"}  # the file's table, then the typed pairs
    code, _, err = gpt1(["zeroshot", "--config", str(cfg), "--checkpoint", "typed", "--split", "dev"], capsys, env=WIDE)
    assert code == 0, err
    got = calls.pop("zeroshot")
    assert (got.checkpoint, got.split, got.limit) == ("typed", "dev", 7)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint", "nowhere", "--split", "bogus=dev"], "--split bogus=…: unknown task 'bogus'"),
        (["--checkpoint", "nowhere", "--split", "=dev"], "--split: expected VALUE or TASK=VALUE, got '=dev'"),
        # A pair for a task not run was ignored without a word.
        (
            ["--checkpoint", "nowhere", "--task", "sst2", "--split", "cola=train"],
            "--split cola=train: cola is not among the tasks run (sst2; add it to --task or drop the pair)",
        ),
        (["--checkpoint", "nowhere", "--task", "bogus"], "unknown zero-shot task 'bogus'"),
        (["--checkpoint", "nowhere", "--batch-size", "0"], "--batch-size 0 is impossible (it must be at least 1)"),
        (
            ["--checkpoint", "nowhere", "--limit", "0"],
            "--limit 0 is impossible (it must be at least 1 (leave it unset for all))",
        ),
        (["--checkpoint", "a", "--checkpoint", "b", "--sota", "wsc=high"], "--sota wsc=high: not a number"),
    ],
)
def test_user_errors_are_one_line(args, message, capsys):
    """Checked before any checkpoint is opened (``nowhere`` does not exist)."""
    code, _, err = gpt1(["zeroshot", *args], capsys, env=WIDE)
    assert code == 1 and message in " ".join(err.split()), err
