"""Weights & Biases beside metrics.jsonl (``--wandb[=PROJECT]``, gptcli/train/runlog.py), offline: the run files W&B
writes hold the scalars of metrics.jsonl, the run's config and its checkpoint paths; a resumed run continues the same
W&B run; ``--wandb`` alone means the ``gpt1`` project."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

if os.environ.get("CI"):  # CI installs the dev extra: wandb missing there is an error, not a skipped module
    import wandb
else:
    wandb = pytest.importorskip("wandb", reason="wandb is part of the dev extra (pip install -e '.[dev]')")

from corpus_helpers import random_corpus  # noqa: E402
from error_lines import gpt1  # noqa: E402
from run_helpers import TINY_ARGS  # noqa: E402
from wandb_helpers import logged, offline_runs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


_offline = pytest.fixture(autouse=True)(offline_runs)


def test_pretrain_logs_the_same_scalars_config_and_checkpoints_offline(tmp_path, capsys):
    data = random_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    args = [
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(run),
        *TINY_ARGS,
        "--max-steps",
        "4",
        "--save-every",
        "2",
        "--eval-every",
        "2",
        "--log-every",
        "1",
    ]
    code, _, err = gpt1([*args, "--wandb"], capsys)
    assert code == 0, err
    history, summary, config = logged(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == {1, 2, 3, 4} and any(r["kind"] == "eval" for r in records)
    for r in records:
        row = history[r["step"]]
        for k, v in r.items():
            if k not in ("kind", "step", "split"):
                assert row[f"{r['kind']}/{k}"] == pytest.approx(v), (r["step"], k)
    assert summary["_project"] == "gpt1"  # --wandb alone
    assert config["lr"] == pytest.approx(2.5e-4) and config["max_steps"] == 4 and config["wandb"] == "gpt1"
    ckpts = sorted(str(p) for p in (run / "checkpoints").iterdir() if p.is_dir())
    assert summary["checkpoints"] == ckpts and summary["last_checkpoint"] == ckpts[-1]

    # Resumed for two more updates: the same W&B run (its id is kept in RUN/wandb); a project given by name.
    run_id = summary["_run_id"]
    code, _, err = gpt1(
        [*args[:-6], "--max-steps", "6", "--save-every", "2", "--log-every", "1", "--resume", "--wandb=gpt1"], capsys
    )
    assert code == 0, err
    history, summary, _ = logged(run)
    assert summary["_run_id"] == run_id and summary["_project"] == "gpt1"
    assert {5, 6} <= set(history)


def test_without_wandb_installed_the_option_says_what_to_install(tmp_path, monkeypatch):
    import builtins

    from gptcli.errors import GPT1Error
    from gptcli.train.runlog import RunLogger

    real = builtins.__import__

    def no_wandb(name, *a, **k):
        if name == "wandb":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(GPT1Error, match=r"pip install 'gpt1\[wandb\]'"):
        RunLogger(tmp_path, wandb="gpt1")
    assert not (tmp_path / "metrics.jsonl").exists() or (tmp_path / "metrics.jsonl").read_text() == ""


def test_finetune_logs_the_same_records(pretrained, tmp_path, capsys):
    from run_helpers import sst2_folder

    run = tmp_path / "ft"
    code, _, err = gpt1(
        [
            "finetune",
            "--task",
            "sst2",
            "--init",
            str(pretrained),
            "--out",
            str(run),
            "--data-dir",
            str(sst2_folder(tmp_path / "SST-2")),
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--log-every",
            "1",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "-q",
            "--wandb=ft",
        ],
        capsys,
    )
    assert code == 0, err
    history, summary, config = logged(run)
    assert summary["_project"] == "ft" and config["task"] == "sst2"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert train and all(history[r["step"]]["train/loss"] == pytest.approx(r["loss"]) for r in train)
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals and all(history[r["step"]]["eval/accuracy"] == pytest.approx(r["accuracy"]) for r in evals)
    # The step checkpoints as the run wrote them (final is written after the log closes, in the run directory named).
    assert summary["run_dir"] == str(run) and Path(summary["last_checkpoint"]).name.startswith("step-")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["pretrain", "--wandb"], ["pretrain", "--wandb=gpt1"]),
        (["pretrain", "--wandb", "--quiet"], ["pretrain", "--wandb=gpt1", "--quiet"]),
        (["pretrain", "--wandb", "mine"], ["pretrain", "--wandb", "mine"]),
        (["pretrain", "--wandb=mine"], ["pretrain", "--wandb=mine"]),
    ],
)
def test_wandb_alone_means_the_default_project(argv, expected):
    from gptcli.cli import _optional_values
    from gptcli.train.runlog import DEFAULT_WANDB_PROJECT

    assert _optional_values(argv) == expected and DEFAULT_WANDB_PROJECT == "gpt1"
