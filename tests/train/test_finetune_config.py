"""A fine-tuning run's settings checked before anything is read (gptcli/train/finetune_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptcli.errors import GPT1Error
from gptcli.tasks import get_task
from gptcli.train.finetune_config import FinetuneConfig, check_finetune, run_inputs


@pytest.mark.parametrize(
    "settings, world_size, message",
    [
        ({"task": ""}, 1, "no task given"),
        ({"init": "none"}, 1, "--init none needs --tokenizer"),
        ({"init": "none", "tokenizer": "tok", "transfer_layers": 2}, 1, "--transfer-layers needs a pretrained"),
        ({"resume": True, "overwrite": True}, 1, "pass one of them"),
        ({"batch_size": 2}, 3, "--batch-size 2 is smaller than the 3 processes"),
        ({"lr": -1.0}, 1, "lr"),
        ({"kernels": "fastest"}, 1, "--kernels"),
    ],
)
def test_check_finetune_refuses_settings_that_cannot_work(settings, world_size, message):
    config = FinetuneConfig(**{"task": "rte", "init": "runs/pre", **settings})
    with pytest.raises(GPT1Error, match=message):
        check_finetune(config, world_size)


def test_check_finetune_takes_a_batch_the_processes_share_unevenly():
    check_finetune(FinetuneConfig(task="rte", init="runs/pre", batch_size=5), 3)  # shares of 2, 2 and 1
    check_finetune(FinetuneConfig(task="rte", init="runs/pre", batch_size=2), 1)


def test_run_inputs_are_the_init_the_tokenizer_and_the_tasks_data(tmp_path):
    data = tmp_path / "RTE"
    data.mkdir()
    task = get_task("rte")
    assert run_inputs("runs/pre", "tok", task, str(data)) == [Path("runs/pre"), Path("tok"), task.data_dir(str(data))]
    # --init none reads no checkpoint; missing data is left for the read to report, with the task's own advice
    assert run_inputs("none", None, task, str(tmp_path / "missing")) == []
