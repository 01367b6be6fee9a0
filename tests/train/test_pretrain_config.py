"""A pretraining run's settings checked before anything is read (gptcli/train/pretrain_config.py)."""

from __future__ import annotations

import pytest

from gptcli.errors import GPT1Error
from gptcli.train.pretrain_config import PretrainConfig, check_pretrain


def test_check_pretrain_checks_the_batch_against_the_processes_once_they_are_known():
    config = PretrainConfig(batch_size=6, micro_batch_size=2)
    check_pretrain(config, world_size=None)  # the command's first look: the processes are not known yet
    check_pretrain(config, world_size=1)
    check_pretrain(config, world_size=3)
    with pytest.raises(GPT1Error, match="not divisible by the 4 processes"):
        check_pretrain(config, world_size=4)
    with pytest.raises(GPT1Error, match="must be a multiple of --micro-batch-size 2 × 2"):
        check_pretrain(config, world_size=2)


def test_check_pretrain_refuses_impossible_settings_whatever_the_processes():
    with pytest.raises(GPT1Error, match="is impossible"):
        check_pretrain(PretrainConfig(max_steps=0), world_size=None)
    with pytest.raises(GPT1Error, match=r"unknown model setting\(s\) n_layers"):
        check_pretrain(PretrainConfig(model={"n_layers": 2}), world_size=None)
