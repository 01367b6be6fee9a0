"""Opening a run's newest checkpoint from every command that reads one (issue 17, items 7 and 10–11): an unreadable
config.json or a damaged file is one line naming the file, `--no-verify` loads a checkpoint whose checksums no longer
match, and a Hugging Face export is sent to `gpt1 convert`."""

from __future__ import annotations

import json
import shutil

import pytest
from corpus_helpers import random_corpus
from error_lines import assert_one_line_error, gpt1
from run_helpers import (
    flip_byte,
    snapshot,
    sst2_folder,
    tiny_config,
)

from gptcli.train.pretrain import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A corpus, a 4-update run on it (checkpoints at 2 and 4) and an SST-2 folder."""
    root = tmp_path_factory.mktemp("load")
    corpus = random_corpus(root / "corpus")
    run = root / "run"
    pretrain(tiny_config(corpus, run, max_steps=4))
    return corpus, run, sst2_folder(root / "SST-2")


def _damaged(setup, tmp_path, how):
    corpus, run, sst2 = setup
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    newest = copy / "checkpoints" / "step-0000004"
    if how == "config":
        (newest / "config.json").write_text("{not json", encoding="utf-8")
    else:
        flip_byte(newest / "model.safetensors")
    return corpus, copy, sst2


def _commands(corpus, run, sst2, tmp_path):
    """Every command that opens a run's newest checkpoint, as it is typed."""
    return {
        "finetune": [
            "finetune",
            "--init",
            str(run),
            "--task",
            "sst2",
            "--data-dir",
            str(sst2),
            "--out",
            str(tmp_path / "ft"),
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--eval-split",
            "",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--quiet",
        ],
        "eval": ["eval", "--checkpoint", str(run), "--data", str(corpus), "--device", "cpu"],
        "zeroshot": [
            "zeroshot",
            "--checkpoint",
            str(run),
            "--task",
            "sst2",
            "--data-dir",
            str(sst2),
            "--limit",
            "4",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ],
        "generate": ["generate", "--checkpoint", str(run), "--prompt", "hello", "-n", "3", "--device", "cpu"],
    }


@pytest.mark.parametrize("command", ["finetune", "eval", "zeroshot", "generate"])
def test_an_unreadable_config_json_in_the_newest_checkpoint_is_one_line(setup, tmp_path, capsys, command):
    corpus, run, sst2 = _damaged(setup, tmp_path, "config")
    before = snapshot(run)
    args = _commands(corpus, run, sst2, tmp_path)[command]
    for extra in ([], ["--no-verify"]):
        res = gpt1(args + extra, capsys)
        assert_one_line_error(
            res, f"{run}/checkpoints/step-0000004/config.json", "unreadable checkpoint config", alone=True
        )
    assert snapshot(run) == before
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("command", ["finetune", "eval", "zeroshot", "generate"])
def test_a_damaged_checkpoint_is_refused_unless_no_verify(setup, tmp_path, capsys, command):
    corpus, run, sst2 = _damaged(setup, tmp_path, "weights")
    args = _commands(corpus, run, sst2, tmp_path)[command]
    res = gpt1(args, capsys)
    assert_one_line_error(
        res, f"{run}/checkpoints/step-0000004/model.safetensors: checksum mismatch", "--no-verify", alone=True
    )
    assert not (tmp_path / "ft").exists()
    code, out, err = gpt1(args + ["--no-verify"], capsys)
    assert code == 0 and "error" not in err, err


def test_eval_on_tasks_honours_no_verify(setup, tmp_path, capsys):
    corpus, run, sst2 = setup
    ft = tmp_path / "ft"
    code, _, err = gpt1(_commands(corpus, run, sst2, tmp_path)["finetune"], capsys)
    assert code == 0, err
    flip_byte(ft / "checkpoints" / "final" / "model.safetensors")
    args = ["eval", "--checkpoint", str(ft), "--data-dir", str(sst2), "--device", "cpu", "--out", str(tmp_path / "e")]
    res = gpt1(args, capsys)
    assert_one_line_error(res, "model.safetensors: checksum mismatch", "--no-verify", alone=True)
    code, _, err = gpt1(args + ["--no-verify"], capsys)
    assert code == 0, err


def test_a_curve_over_a_run_honours_no_verify(setup, tmp_path, capsys):
    corpus, run, sst2 = _damaged(setup, tmp_path, "weights")
    args = [
        "zeroshot",
        "--checkpoint",
        str(run / "checkpoints" / "step-0000002"),
        "--checkpoint",
        str(run / "checkpoints" / "step-0000004"),
        "--task",
        "sst2",
        "--data-dir",
        str(sst2),
        "--limit",
        "4",
        "--device",
        "cpu",
        "--precision",
        "fp32",
    ]
    code, _, err = gpt1(args, capsys)
    assert code == 1 and "step-0000004/model.safetensors: checksum mismatch" in err and "Traceback" not in err
    code, _, err = gpt1(args + ["--no-verify"], capsys)
    assert code == 0, err


def test_a_hugging_face_export_is_sent_to_convert(setup, tmp_path, capsys):
    # The export's own files, as `gpt1 convert --to hf` writes them: a config.json with a model_type, no gpt1 format.
    export = tmp_path / "hf"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"model_type": "openai-gpt", "n_embd": 32}), encoding="utf-8")
    shutil.copy(setup[1] / "checkpoints" / "step-0000004" / "model.safetensors", export / "model.safetensors")
    for args in (
        ["generate", "--checkpoint", str(export), "--prompt", "hi"],
        ["eval", "--checkpoint", str(export), "--data", str(setup[0])],
        ["zeroshot", "--checkpoint", str(export), "--task", "sst2", "--data-dir", str(setup[2])],
    ):
        res = gpt1(args, capsys)
        assert_one_line_error(res, "Hugging Face export", f"gpt1 convert {export} --from hf", alone=True)
