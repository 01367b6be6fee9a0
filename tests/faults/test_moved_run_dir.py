"""A run directory moved (renamed) or removed while its run trains (gptcli/train/run/directory.py,
``check_run_dir``): the run stops with one line naming the directory, and never re-creates it. Before, writing by
its path re-created the folder, and the run was split in two — newer checkpoints in the new folder, metrics and the
earlier checkpoints in the moved one. The directory is moved from the run's own progress reports (the public
:class:`gptcli.progress.Progress`), at a known update, not by timing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from run_helpers import sst2_folder

from gptcli.errors import GPT1Error
from gptcli.progress import Progress
from gptcli.train.finetune import FinetuneConfig, finetune
from gptcli.train.pretrain import PretrainConfig, pretrain
from tests.faults.conftest import MODEL

pytestmark = pytest.mark.usefixtures("one_thread")
MOVED = "the run directory {} was moved or removed while training"


class MoveAt(Progress):
    """Moves ``run`` to ``to`` (None: removes it) at the ``at``-th update reported, or when the training stage ends
    (``at`` None)."""

    def __init__(self, run: Path, to: Path | None, at: int | None) -> None:
        self.run, self.to, self.at, self.updates, self.training = run, to, at, 0, False

    def stage(self, name: str, total: float | None = None, *, unit: str = "", done: float = 0) -> None:
        self.training = unit == "updates"

    def advance(self, n: float = 0, **status) -> None:
        self.updates += int(n) if self.training else 0
        if self.at is not None and self.updates >= self.at and self.run.exists():
            self.move()

    def end(self, summary: str = "") -> None:
        if self.at is None and self.training and self.run.exists():
            self.move()
        self.training = False

    def move(self) -> None:
        if self.to is None:
            shutil.rmtree(self.run)
        else:
            self.run.rename(self.to)


def _pretrain_config(corpus: Path, out: Path, **kw) -> PretrainConfig:
    return PretrainConfig(
        **{
            "data": corpus,
            "out": out,
            "preset": "tiny",
            "model": dict(MODEL),
            "seq_len": 16,
            "batch_size": 4,
            "max_steps": 6,
            "warmup_steps": 1,
            "eval_every": 0,
            "eval_batches": 1,
            "save_every": 2,
            "keep_last": 0,
            "log_every": 1,
            "device": "cpu",
            "precision": "fp32",
            "peak_flops": 1e11,
            **kw,
        }
    )


def _finetune_config(pretrained: Path, data: Path, out: Path, **kw) -> FinetuneConfig:
    # 8 examples in batches of 2: 4 updates an epoch, 8 in all; a step checkpoint every 2 updates.
    return FinetuneConfig(
        **{
            "task": "sst2",
            "init": str(pretrained),
            "out": str(out),
            "data_dir": str(data),
            "batch_size": 2,
            "epochs": 2,
            "device": "cpu",
            "precision": "fp32",
            "log_every": 1,
            "save_every": 2,
            "keep_last": 0,
            **kw,
        }
    )


def _stops_without_recreating(run: Path, moved: Path | None, call) -> None:
    with pytest.raises(GPT1Error) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(MOVED.format(run)) and "\n" not in msg, msg
    assert not run.exists()  # never re-created: the run is whole where it went
    if moved is not None:
        assert (moved / "metrics.jsonl").is_file() and (moved / "checkpoints").is_dir()


def test_pretraining_run_moved_after_a_checkpoint_stops(corpus, tmp_path):
    run, moved = tmp_path / "run", tmp_path / "moved"
    config = _pretrain_config(corpus, run)
    _stops_without_recreating(run, moved, lambda: pretrain(config, progress=MoveAt(run, moved, at=3)))
    assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == ["step-0000002"]


def test_pretraining_run_removed_stops(corpus, tmp_path):
    run = tmp_path / "run"
    config = _pretrain_config(corpus, run)
    _stops_without_recreating(run, None, lambda: pretrain(config, progress=MoveAt(run, None, at=3)))


def test_a_moved_pretraining_run_resumes_where_it_now_is(corpus, tmp_path):
    """What the error says to do works: ``--resume`` with the new path continues from its checkpoint."""
    run, moved = tmp_path / "run", tmp_path / "moved"
    with pytest.raises(GPT1Error):
        pretrain(_pretrain_config(corpus, run), progress=MoveAt(run, moved, at=3))
    result = pretrain(_pretrain_config(corpus, moved, resume=True))
    assert result.step == 6 and not run.exists()
    steps = [p.name for p in (moved / "checkpoints").iterdir()]
    assert sorted(steps) == ["step-0000002", "step-0000004", "step-0000006"]


def test_finetuning_run_moved_while_training_stops(pretrained, tmp_path):
    run, moved = tmp_path / "ft", tmp_path / "moved"
    config = _finetune_config(pretrained, sst2_folder(tmp_path / "SST-2"), run)
    _stops_without_recreating(run, moved, lambda: finetune(config, progress=MoveAt(run, moved, at=3)))


def test_finetuning_run_moved_before_its_final_checkpoint_stops(pretrained, tmp_path):
    run, moved = tmp_path / "ft", tmp_path / "moved"
    config = _finetune_config(pretrained, sst2_folder(tmp_path / "SST-2"), run)
    _stops_without_recreating(run, moved, lambda: finetune(config, progress=MoveAt(run, moved, at=None)))
    assert not (moved / "checkpoints" / "final").exists()
