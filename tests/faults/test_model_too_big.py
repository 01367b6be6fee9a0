"""A model whose weights alone do not fit says its size, in every command that builds or loads one
(gptcli/system/out_of_memory.py): ``finetune --init none`` building a new model, and eval, generate and zero-shot
loading a checkpoint. Before, a load said the weights were "unreadable", and an allocation outside a training run
advised smaller batches, which cannot help. The host's real allocation error is raised where the weights would be
allocated (an allocation no machine has room for, refused at once)."""

from __future__ import annotations

import math

import pytest
import torch
from error_lines import assert_one_line_error
from run_helpers import sst2_folder

import gptcli.checkpoint as checkpoint_mod
import gptcli.model.build as build_mod
from gptcli.checkpoint import safetensors_shapes
from gptcli.errors import GPT1Error
from gptcli.train.finetune import FinetuneConfig, finetune
from tests.faults.conftest import gpt1
from tests.faults.test_bad_checkpoints import _commands

pytestmark = pytest.mark.usefixtures("one_thread")
NO_ROOM = "cpu has no room for the model itself: its {:,} parameters take "


def _host_out_of_memory() -> RuntimeError:
    """The CPU allocator's real error: 10 TB, which it refuses at once rather than paging towards."""
    try:
        torch.empty(10**13, dtype=torch.uint8)
    except RuntimeError as e:
        return e
    raise AssertionError("10 TB were allocated")


@pytest.mark.parametrize("command", ["eval", "generate", "zeroshot"])
def test_loading_a_checkpoint_too_big_for_memory_says_its_size(command, run, corpus, tmp_path, capsys, monkeypatch):
    def too_big(*a, **k):
        raise _host_out_of_memory()

    monkeypatch.setattr(checkpoint_mod, "load_file", too_big)
    res = gpt1(_commands(run, corpus, tmp_path)[command], capsys)
    weights = sorted((run / "checkpoints").iterdir())[-1] / "model.safetensors"
    params = sum(math.prod(s) for s in safetensors_shapes(weights).values())
    line = assert_one_line_error(res, NO_ROOM.format(params), "a smaller batch cannot help")
    assert "unreadable" not in line and "--batch-size" not in line, line


def test_finetune_init_none_too_big_for_memory_says_its_size(run, tmp_path, monkeypatch):
    real, sizes = build_mod.build_model, []

    def too_big(config):
        if torch.get_default_device().type != "meta":  # counting parameters allocates nothing
            sizes.append(real(config).num_params())
            raise _host_out_of_memory()
        return real(config)

    monkeypatch.setattr(build_mod, "build_model", too_big)
    config = FinetuneConfig(
        task="sst2",
        init="none",
        tokenizer=str(run),
        out=str(tmp_path / "ft"),
        data_dir=str(sst2_folder(tmp_path / "SST-2")),
        batch_size=2,
        epochs=1,
        device="cpu",
        precision="fp32",
    )
    with pytest.raises(GPT1Error) as e:
        finetune(config)
    msg = str(e.value)
    assert msg.startswith(NO_ROOM.format(sizes[0])) and "\n" not in msg, msg
