"""The defaults of the short command lines (gptcli/commands/defaults.py): a fresh run directory, never an earlier
run; `gpt1 prepare` → ./corpus → `gpt1 pretrain`. (The default model: tests/interop/test_hub.py.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gptcli.errors import GPT1Error


class Quiet:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_) -> None:
        self.lines.append(text)


def test_run_dir_is_the_next_free_one(tmp_path, monkeypatch):
    from gptcli.commands.defaults import run_dir

    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    console = Quiet()
    assert run_dir(tmp_path / "runs" / "finetune-rte", console) == tmp_path / "runs" / "finetune-rte"
    (tmp_path / "runs" / "finetune-rte").mkdir(parents=True)
    (tmp_path / "runs" / "finetune-rte-2").mkdir()
    assert run_dir(tmp_path / "runs" / "finetune-rte", console) == tmp_path / "runs" / "finetune-rte-3"
    assert console.lines[-1].endswith(
        "finetune-rte-3 (" + str(tmp_path / "runs" / "finetune-rte") + " exists; a default never reuses a run)"
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a torchrun worker: every rank must agree, so no guessing
    with pytest.raises(GPT1Error, match="--out is required when the command is started by torchrun or SLURM"):
        run_dir(tmp_path / "runs" / "pretrain", console)


def test_prepare_then_pretrain_chain_through_corpus(tmp_path, capsys, monkeypatch):
    """`gpt1 prepare books/` writes ./corpus; `gpt1 pretrain` reads it and picks runs/pretrain (then -2)."""
    from gptcli.cli import main
    from gptcli.data.prepare import PrepareConfig

    assert PrepareConfig().out == Path("corpus")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    seen = []

    def pretrain(cfg, parallel=None, progress=None):
        seen.append(cfg)
        Path(cfg.out).mkdir(parents=True)
        return SimpleNamespace(
            stopped_by=None, step=1, final_val_loss=None, last_checkpoint=Path(cfg.out), run_dir=cfg.out
        )

    monkeypatch.setattr("gptcli.train.pretrain.pretrain", pretrain)
    for expected in ("runs/pretrain", "runs/pretrain-2"):
        with pytest.raises(SystemExit) as e:
            main(["pretrain", "--device", "cpu"])
        err = " ".join(capsys.readouterr().err.split())
        assert e.value.code == 0, err
        assert "corpus: ./corpus (no --data given)" in err and f"run directory: {expected}" in err
        assert seen[-1].data == Path("corpus") and Path(seen[-1].out) == Path(expected)


def test_no_task_data_is_fetched_inside_a_torchrun_job(tmp_path, monkeypatch):
    """Every process of a job would download and swap the same folder: a worker asks for `gpt1 fetch` instead."""
    from gptcli.commands.defaults import task_data
    from gptcli.tasks import get_task

    monkeypatch.delenv("GPT1_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("gptcli.interop.datasets.fetch_folder", lambda *a, **k: pytest.fail("fetched in a worker"))
    with pytest.raises(GPT1Error, match=r"data directory for task 'rte' not found .*`gpt1 fetch rte`"):
        task_data(get_task("rte"), None, Quiet())
    task_data(get_task("rte"), None, Quiet(), check=False)  # the library will say it when it reads
