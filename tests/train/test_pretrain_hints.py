"""Honest warnings at start and at validation: a warmup longer than the run, and a run still on the unigram plateau
(validation loss at the loss of token frequencies alone); the unigram loss is recorded with every validation."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import random_corpus, write_corpus

import gptcli.train.pretrain_job as hints_mod
from gptcli.progress import RecordingProgress
from gptcli.train.pretrain import PretrainConfig, pretrain, warmup_warning
from gptcli.train.pretrain_job import unigram_loss

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16}


def _cfg(data: Path, out: Path, **kw) -> PretrainConfig:
    base = dict(
        data=data,
        out=out,
        preset="tiny",
        model=dict(MODEL),
        seq_len=16,
        batch_size=8,
        max_steps=8,
        warmup_steps=2,
        eval_every=4,
        save_every=0,
        log_every=4,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    return PretrainConfig(**{**base, **kw})


def _warnings(rec: RecordingProgress) -> list[str]:
    return [n["message"] for n in rec.of("note") if n["level"] == "warn"]


@pytest.fixture(scope="module")
def noise(tmp_path_factory) -> Path:
    """Uniformly random bytes: nothing to learn beyond the frequencies."""
    return random_corpus(tmp_path_factory.mktemp("noise"))


@pytest.fixture(scope="module")
def cycle(tmp_path_factory) -> Path:
    """Ids 0..49 in order, over and over: every next token follows from the last one, so a model that uses context
    falls far below the unigram loss (ln 50 ≈ 3.9 nats) within a few dozen updates."""
    docs = [np.arange(n) % 50 for n in (4000, 3000)]
    return write_corpus(tmp_path_factory.mktemp("cycle"), {"train": [docs], "val": [[np.arange(700) % 50]]})


def test_warmup_longer_than_the_run_is_warned_once_at_start(noise, tmp_path):
    rec = RecordingProgress()
    pretrain(_cfg(noise, tmp_path / "short", warmup_steps=20), progress=rec)
    [warning] = _warnings(rec)
    assert "8 updates but --warmup-steps 20" in warning and "reaches 0.0001 (40% of --lr 0.00025)" in warning
    assert "--warmup-steps 8:" in warning  # the suggestion: the rule (at least 30), no more than the run
    assert rec.events[1] == ("note", {"message": warning, "level": "warn"})  # right after the stage starts
    for warmup in (2, 8):  # fits (reaching --lr at the last update counts as reaching it)
        rec = RecordingProgress()
        pretrain(_cfg(noise, tmp_path / f"fits{warmup}", warmup_steps=warmup), progress=rec)
        assert _warnings(rec) == []


def test_warmup_warning_text():
    assert warmup_warning(150, 2000, 1e-3) is not None and "reaches 7.5e-05" in warmup_warning(150, 2000, 1e-3)
    assert warmup_warning(2000, 2000, 1e-3) is None and warmup_warning(10, 0, 1e-3) is None


def test_unigram_loss_is_the_cross_entropy_of_frequencies():
    train = [np.array([0, 0, 0, 1], dtype=np.uint16), np.array([1, 2], dtype=np.uint16)]
    val = [np.array([0, 1, 3], dtype=np.uint16)]
    vocab = 5
    counts = Counter([0, 0, 0, 1, 1, 2])
    expected = -sum(math.log((counts[t] + 1) / (6 + vocab)) for t in (0, 1, 3)) / 3  # add-one smoothing
    assert unigram_loss(train, val, vocab) == pytest.approx(expected, rel=1e-12)
    assert unigram_loss(train, [np.array([], dtype=np.uint16)], vocab) is None


def test_plateau_hint_on_a_run_that_learned_nothing(noise, tmp_path, monkeypatch):
    monkeypatch.setattr(hints_mod, "PLATEAU_MIN_UPDATES", 4)  # so that seconds of CPU count as "meaningful"
    rec = RecordingProgress()
    run = tmp_path / "run"
    pretrain(_cfg(noise, run, lr=1e-3), progress=rec)
    [hint] = _warnings(rec)  # once, although both validations (4 and 8) are on the plateau
    assert hint.startswith("hint: after 4 updates the validation loss") and "unigram loss" in hint
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [e["step"] for e in evals] == [4, 8]
    unigram = evals[0]["unigram_loss"]
    assert evals[1]["unigram_loss"] == unigram and abs(unigram - math.log(256)) < 0.1  # random bytes: ≈ uniform
    assert all(e["loss"] > unigram - hints_mod.PLATEAU_MARGIN for e in evals)


def test_no_plateau_hint_before_a_meaningful_number_of_updates(noise, tmp_path):
    rec = RecordingProgress()
    pretrain(_cfg(noise, tmp_path / "run", lr=1e-3), progress=rec)  # the same plateau, 8 < 250 updates
    assert _warnings(rec) == []


def test_no_plateau_hint_on_a_run_that_learned(cycle, tmp_path, monkeypatch):
    monkeypatch.setattr(hints_mod, "PLATEAU_MIN_UPDATES", 4)
    rec = RecordingProgress()
    run = tmp_path / "run"
    res = pretrain(_cfg(cycle, run, lr=1e-2, max_steps=40, eval_every=20, log_every=20), progress=rec)
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    unigram = evals[-1]["unigram_loss"]
    assert abs(unigram - math.log(50)) < 0.1
    assert res.final_val_loss < unigram - 1.0  # learned: far below the plateau
    assert _warnings(rec) == []


def test_every_warmup_advice_follows_the_one_rule():
    """The start warning, the tiny preset's recipe and the plateau hint advise the same warm-up: at least
    MIN_WARMUP updates, about a tenth of a longer run, never longer than the run (following it silences the warning)."""
    from gptcli.train.pretrain_job import plateau_hint
    from gptcli.train.recipes import MIN_WARMUP, RECIPES, warmup_for

    assert [warmup_for(t) for t in (1, 20, 50, 150, 300, 5000)] == [1, 20, 30, 30, 30, 500]
    for total in (1, 20, 50, 150, 300, 5000):
        advised = warmup_for(total)
        assert f"--warmup-steps {advised:,}:" in warmup_warning(total, 10**6, 1e-3)
        assert warmup_warning(total, advised, 1e-3) is None
    assert RECIPES["tiny"].warmup.startswith(f"{MIN_WARMUP} (at least")
    assert f"--warmup-steps {MIN_WARMUP} or more" in plateau_hint(1000, 6.0, 6.0)
