"""Optimizer groups and learning-rate schedules (reference §3)."""

from __future__ import annotations

import math

import pytest
import torch

from gptcli.model.gpt import GPT, ModelConfig
from gptcli.train.optim import lr_at, make_optimizer, param_groups, released_lr, warmup_linear
from gptcli.train.pretrain import PretrainConfig, plan_steps

TINY = ModelConfig(vocab_size=100, n_ctx=16, n_embd=32, n_layer=2, n_head=2, n_inner=64)


def test_paper_schedule_values():
    total, peak, warm = 10_000, 2.5e-4, 2000
    assert lr_at(0, total, peak, warm) == pytest.approx(peak / 2000)  # first update: 1/2000 of the peak
    assert lr_at(999, total, peak, warm) == pytest.approx(peak / 2)
    assert lr_at(1999, total, peak, warm) == pytest.approx(peak)  # warmup ends at the peak
    assert lr_at(2000, total, peak, warm) == pytest.approx(peak)  # cosine starts at the peak
    assert lr_at(6000, total, peak, warm) == pytest.approx(peak / 2)  # half-way through the cosine
    assert lr_at(4000, total, peak, warm) == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert lr_at(10_000, total, peak, warm) == pytest.approx(0.0, abs=1e-12)  # annealed to 0
    assert lr_at(3000, total, 1.0, warm, "linear") == pytest.approx(1 - 1000 / 8000)
    assert lr_at(9000, total, 1.0, warm, "constant") == 1.0


def test_weight_decay_on_weights_only():
    model = GPT(TINY)
    names = dict((id(p), n) for n, p in model.named_parameters())
    decayed, plain = param_groups(model.named_parameters(), 0.01)
    dec = {names[id(p)] for p in decayed["params"]}
    pln = {names[id(p)] for p in plain["params"]}
    assert decayed["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    assert "tok_emb.weight" in dec and "pos_emb.weight" in dec
    assert "blocks.0.attn.qkv.weight" in dec and "blocks.1.mlp.proj.weight" in dec
    assert "blocks.0.attn.qkv.bias" in pln and "blocks.0.ln_1.weight" in pln and "blocks.1.ln_2.bias" in pln
    assert not any(n.endswith(".bias") or ".ln_" in n for n in dec)
    assert dec | pln == set(names.values()) and not dec & pln
    released = param_groups(model.named_parameters(), 0.01, decay="released")
    assert {names[id(p)] for p in released[0]["params"]} == dec  # same set for this architecture


def test_make_optimizer_paper_hyperparameters():
    opt = make_optimizer(GPT(TINY), lr=2.5e-4)
    assert isinstance(opt, torch.optim.AdamW)
    g = opt.param_groups[0]
    assert g["betas"] == (0.9, 0.999) and g["eps"] == 1e-8 and g["weight_decay"] == 0.01


def test_paper_defaults_and_step_planning():
    c = PretrainConfig()
    assert (c.batch_size, c.seq_len, c.lr, c.warmup_steps, c.weight_decay, c.grad_clip, c.epochs) == (
        64,
        512,
        2.5e-4,
        2000,
        0.01,
        1.0,
        100.0,
    )
    assert (c.beta1, c.beta2, c.eps, c.schedule, c.decay) == (0.9, 0.999, 1e-8, "cosine", "paper")
    assert plan_steps(c, steps_per_epoch=50) == 5000
    assert plan_steps(PretrainConfig(max_steps=70), 50) == 70
    assert plan_steps(PretrainConfig(max_tokens=64 * 512 * 10 + 1), 50) == 11
    assert plan_steps(PretrainConfig(epochs=0.5), 50) == 25


def _released_warmup_linear(x, warmup=0.002):
    """openai/finetune-transformer-lm opt.py, transcribed with tf.cast → float:
    s = tf.cast(x <= warmup, tf.float32); return (s*(x/warmup) + (1-s))*(1-x)"""
    s = float(x <= warmup)
    return (s * (x / warmup) + (1 - s)) * (1 - x)


@pytest.mark.parametrize("total", [6, 78, 501, 1000, 3000])
def test_released_schedule_is_the_released_function(total):
    """The released adam: ``lrt = lr * ... * schedule(t/t_total)`` with ``t`` the updates done before this one."""
    peak = 6.25e-5
    curve = [released_lr(t, total, peak, 0.002) for t in range(total)]
    assert curve == [peak * _released_warmup_linear(t / total) for t in range(total)]
    assert curve[0] == 0.0  # the first update runs at lr 0
    assert curve[-1] == pytest.approx(peak / total)  # and the last at lr/T, never 0


def test_released_schedule_shape():
    total, peak = 1000, 1.0
    # Warm-up over t ≤ 2 (x ≤ 0.002, the boundary included), its ramp multiplied by 1 − x; then 1 − x from there.
    assert [released_lr(t, total, peak, 0.002) for t in range(4)] == pytest.approx(
        [0.0, 0.5 * 0.999, 1.0 * 0.998, 0.997]
    )
    assert released_lr(500, total, peak, 0.002) == pytest.approx(0.5)  # decay over the whole run, not from warm-up
    assert released_lr(5, total, peak, 0.0) == pytest.approx(0.995)  # no warm-up (the released code divides by 0)
    assert warmup_linear(0.001) == pytest.approx(0.5 * 0.999)
