"""The NaN guard of pretraining names a checkpoint saved *before* the divergence, never one that holds it.

Update k's loss is computed from the weights after k - 1 updates; when update k + 1's loss is NaN, the weights after
update k are the suspect ones, and a checkpoint saved at step k holds them. The guard names the newest checkpoint of
a step below k (and the later ones to move away), or says there is none; and a checkpoint is never written from
non-finite weights, so --resume cannot pick one up.
"""

from __future__ import annotations

import pytest
import torch
from corpus_helpers import random_corpus
from error_lines import Outcome, assert_one_line_error

import gptcli.train.pretrain as pretrain_mod
from gptcli.checkpoint import load_checkpoint
from gptcli.train.pretrain import PretrainConfig, pretrain
from gptcli.train.run.loop import NonFiniteLossError
from gptcli.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16}


def _cfg(data, out, **kw) -> PretrainConfig:
    base = dict(
        data=data,
        out=out,
        preset="tiny",
        model=dict(MODEL),
        seq_len=16,
        batch_size=4,
        max_steps=8,
        warmup_steps=1,
        eval_every=0,
        save_every=2,
        log_every=1,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    return PretrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return random_corpus(tmp_path_factory.mktemp("corpus"))


def test_weights_that_diverge_are_never_saved_and_the_guard_names_an_earlier_checkpoint(corpus, tmp_path, monkeypatch):
    # Update 4 (step index 3) turns the weights into NaN; its own loss was finite. Before the fix, step-0000004 was
    # saved from those weights and named "the last good checkpoint" when update 5's loss came out NaN.
    real = Trainer.step

    def poisoning(self, step, micro_batches):
        result = real(self, step, micro_batches)
        if step == 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return result

    monkeypatch.setattr(Trainer, "step", poisoning)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as e:
        pretrain(_cfg(corpus, run))
    msg = str(e.value)
    good = run / "checkpoints" / "step-0000002"
    assert "non-finite" in msg and "update 4" in msg and f"before the divergence is {good}" in msg, msg
    assert "step-0000004" not in msg and "\n" not in msg
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002"]
    assert all(torch.isfinite(t).all() for t in load_checkpoint(run).model.state_dict().values())


def test_a_nan_loss_names_the_checkpoint_before_the_weights_that_produced_it(corpus, tmp_path, monkeypatch):
    # Update 5's loss is NaN: the weights after update 4 produced it, so step-0000004 is suspect and step-0000002 is
    # the one to go back to; the message says which to move away before --resume picks the newest again.
    real = pretrain_mod.lm_loss
    calls = {"n": 0}

    def poisoned(model, batch):
        calls["n"] += 1
        loss = real(model, batch)
        return loss * float("nan") if calls["n"] == 5 else loss  # one micro-batch per update

    monkeypatch.setattr(pretrain_mod, "lm_loss", poisoned)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as e:
        pretrain(_cfg(corpus, run))
    msg = str(e.value)
    assert "loss became nan at update 5" in msg
    assert f"before the divergence is {run / 'checkpoints' / 'step-0000002'}" in msg
    assert "move away the later step-0000004" in msg and "--resume" in msg


def test_a_divergence_before_any_checkpoint_says_there_is_none(corpus, tmp_path, monkeypatch):
    real = pretrain_mod.lm_loss
    monkeypatch.setattr(pretrain_mod, "lm_loss", lambda m, b: real(m, b) * float("nan"))
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match="no checkpoint was saved before the divergence"):
        pretrain(_cfg(corpus, run, save_every=0))
    assert not (run / "checkpoints").exists()


def test_the_cli_shows_the_guard_as_one_line(corpus, tmp_path, capsys):
    from gptcli.cli import main

    # A learning rate this large overflows the weights within a few updates (found by trying; fp32, tiny model).
    run = tmp_path / "run"
    args = [
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(run),
        "--preset",
        "tiny",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--n-head",
        "2",
        "--n-inner",
        "64",
        "--n-ctx",
        "16",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--max-steps",
        "40",
        "--warmup-steps",
        "0",
        "--lr",
        "1e30",
        "--weight-decay",
        "0",  # lr × weight decay must stay below 1 (refused before training otherwise): Adam's steps alone diverge
        "--grad-clip",
        "0",
        "--save-every",
        "1",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--peak-flops",
        "1e11",
        "--quiet",
    ]
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    # Update 1 at this rate leaves huge weights whose loss at update 2 is NaN: step-0000001 holds the divergence.
    assert_one_line_error(
        Outcome(e.value.code, "", err),
        "loss became nan at update 2",
        "no checkpoint was saved before the divergence",
        alone=True,
    )
    for c in (run / "checkpoints").iterdir():  # whatever was saved holds finite weights
        assert all(torch.isfinite(t).all() for t in load_checkpoint(c).model.state_dict().values()), c
