"""Issue #31, classes 7 and 9: no result that should not be reported, and errors that say where they come from.

7. Weights holding NaN or ±inf are refused when a checkpoint is loaded (every score or perplexity from them would
   be a number without a meaning); zero-shot scoring of a fine-tuned checkpoint says that the heuristics are the
   paper's for language models.
9. A setting read from a file (``--config``, a resumed run's ``config.toml``) is named with that file when it is
   refused; a resumed run whose relative ``--data`` does not resolve from here says the path came from its
   ``config.toml``; ``finetune --resume`` of a folder without one says so, not "--task is required".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from error_lines import assert_one_line_error
from safetensors.torch import load_file, save_file

from gptcli import checkpoint as ckpt
from gptcli.files.fsutil import sha256_file
from tests.faults.conftest import TINY_ARGS, copy_of, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")

SCITAIL = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "SciTailV1.1"
DPRD = "The bee landed on the flower because it had pollen.\nit\nThe bee,the flower\nthe flower\n\n" * 2


def _poison(c: Path, value: float) -> None:
    """One weight set to ``value``, the checksums resealed: only a check of the values can notice."""
    w = c / ckpt.WEIGHTS
    tensors = load_file(str(w))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = value
    save_file(tensors, str(w))
    config = json.loads((c / ckpt.CONFIG).read_text())
    config["files"][ckpt.WEIGHTS] = sha256_file(w)
    config[ckpt.CONFIG_DIGEST] = ckpt._config_digest(config)
    (c / ckpt.CONFIG).write_text(json.dumps(config))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("command", ["zeroshot", "eval", "generate", "finetune"])
def test_non_finite_weights_are_refused_not_scored(run, corpus, tmp_path, capsys, value, command):
    mine = copy_of(run, tmp_path)
    _poison(ckpt.list_checkpoints(mine)[-1], value)
    (tmp_path / "dprd").mkdir()
    (tmp_path / "dprd" / "train.c.txt").write_text(DPRD)
    args = {
        "zeroshot": [
            "zeroshot",
            "--checkpoint",
            mine,
            "--task",
            "dprd",
            "--data-dir",
            tmp_path / "dprd",
            "--device",
            "cpu",
        ],
        "eval": ["eval", "--checkpoint", mine, "--data", corpus, "--device", "cpu"],
        "generate": ["generate", "--checkpoint", mine, "--prompt", "the", "--device", "cpu"],
        "finetune": [
            "finetune",
            "--task",
            "scitail",
            "--init",
            mine,
            "--out",
            tmp_path / "ft",
            "--data-dir",
            SCITAIL,
            "--device",
            "cpu",
            "-q",
        ],
    }[command]
    assert_one_line_error(gpt1(args, capsys), "NaN or infinite values", "use an earlier checkpoint")
    assert not (tmp_path / "ft").exists()


def test_zeroshot_of_a_fine_tuned_checkpoint_says_the_heuristics_are_for_language_models(run, tmp_path, capsys):
    ft = tmp_path / "ft"
    res = gpt1(
        [
            "finetune",
            "--task",
            "scitail",
            "--init",
            run,
            "--out",
            ft,
            "--data-dir",
            SCITAIL,
            "--max-train-examples",
            "8",
            "--max-eval-examples",
            "4",
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "-q",
        ],
        capsys,
    )
    assert res.code == 0, res.err[-2000:]
    (tmp_path / "dprd").mkdir()
    (tmp_path / "dprd" / "train.c.txt").write_text(DPRD)
    res = gpt1(
        ["zeroshot", "--checkpoint", ft, "--task", "dprd", "--data-dir", tmp_path / "dprd", "--device", "cpu"], capsys
    )
    assert res.code == 0, res.err[-2000:]
    assert (
        "is fine-tuned (on scitail): the zero-shot heuristics are meant for pretrained language models"
        in res.err.replace("\n", " ")
    )


# --- 9 ---------------------------------------------------------------------------------------------------------------


def test_a_resumed_run_names_its_config_toml_when_its_relative_data_is_not_found(corpus, tmp_path, capsys, monkeypatch):
    started = tmp_path / "started-here"
    started.mkdir()
    shutil.copytree(corpus, started / "corpus")
    monkeypatch.chdir(started)
    res = gpt1(
        ["pretrain", "--data", "corpus", "--out", started / "run", *TINY_ARGS, "--max-steps", "2", "--save-every", "1"],
        capsys,
    )
    assert res.code == 0, res.err[-2000:]
    monkeypatch.chdir(tmp_path)  # resumed from another folder
    line = assert_one_line_error(
        gpt1(["pretrain", "--out", started / "run", "--resume", "--max-steps", "3"], capsys),
        f"{started / 'run' / 'config.toml'}: data = 'corpus'",
        "relative to where the run was started",
    )
    assert "--data" in line


def test_a_bad_value_in_a_resumed_run_s_config_toml_names_the_file(run, tmp_path, capsys):
    mine = copy_of(run, tmp_path)
    toml = mine / "config.toml"
    toml.write_text(toml.read_text().replace("lr = ", "lr = nan\nold_lr = ", 1).replace("\nold_lr = ", "\n# ", 1))
    assert_one_line_error(gpt1(["pretrain", "--out", mine, "--resume"], capsys), f"{toml}: --lr nan is impossible")


@pytest.mark.parametrize("what", ["empty", "missing"])
def test_finetune_resume_without_a_config_toml_says_so(tmp_path, capsys, what):
    out = tmp_path / "ft"
    if what == "empty":
        out.mkdir()
    line = assert_one_line_error(gpt1(["finetune", "--out", out, "--resume"], capsys), f"{out} has no config.toml")
    assert "--task is required" not in line
