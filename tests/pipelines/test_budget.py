"""gptcli/pipelines/budget.py: sizing pretraining to a time budget (quickstart and experiments/ share it)."""

from __future__ import annotations

import torch

from gptcli.model.gpt import ModelConfig
from gptcli.pipelines import budget


def test_updates_that_fit():
    assert budget.updates_that_fit(10.0, 0.1, minimum=20) == 100
    assert budget.updates_that_fit(10.0, 0.1, minimum=20, maximum=60) == 60
    assert budget.updates_that_fit(1.0, 0.1, minimum=20, maximum=60) == 20  # the floor wins over the time
    assert budget.updates_that_fit(-5.0, 0.1, minimum=20) == 20  # nothing left: still a run worth having
    assert budget.updates_that_fit(12.0, 0.5, minimum=1, slowdown=1.5) == 16  # 12 s / (1.5 × 0.5 s)


def test_epochs_and_tokens():
    assert budget.updates_per_epoch(10_000, 8, 100) == 12 and budget.updates_per_epoch(10, 8, 100) == 1
    assert budget.epochs(25, 8, 100, 10_000) == 2.0 and budget.epochs(25, 8, 100, 0) == 20_000.0
    assert budget.seconds_for_tokens(1600, 0.5, 8, 100) == 1.0


def test_time_update_measures_a_positive_time():
    cfg = ModelConfig(vocab_size=50, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)
    s = budget.time_update(cfg, 16, 2, torch.device("cpu"), "fp32", steps=1)
    assert 0 < s < 5


def test_time_update_times_the_run_s_backends_after_two_warmups(monkeypatch):
    """The timed updates must run as the run will: glibc's allocator setting made before them (without it the
    quickstart planned 96 ms per update and ran at 48), and past the two slow first updates."""
    from gptcli.train.trainer import Trainer

    events: list[str] = []
    monkeypatch.setattr(budget, "configure_backends", lambda device: events.append(f"backends {device.type}"))
    step = Trainer.step
    monkeypatch.setattr(Trainer, "step", lambda self, i, mbs: (events.append(f"step {i}"), step(self, i, mbs))[1])
    cfg = ModelConfig(vocab_size=50, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)
    budget.time_update(cfg, 16, 2, torch.device("cpu"), "fp32", steps=3)
    assert events == ["backends cpu", "step 0", "step 1", "step 2", "step 3", "step 4"]
