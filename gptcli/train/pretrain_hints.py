"""What a pretraining run says about itself that its numbers alone would not: a schedule that does not fit the run,
and a run that learned nothing (its validation loss still at the unigram loss after hundreds of updates)."""

from __future__ import annotations

import math

import numpy as np

# A run "learned nothing" when, after PLATEAU_MIN_UPDATES updates, its validation loss is not PLATEAU_MARGIN nats
# below the unigram loss (or is above it). Why these numbers: a model reaches the unigram loss within a few dozen
# updates (token frequencies are the easiest thing to learn) and a healthy small run leaves it soon after — the tiny
# preset on two books was 0.5 nats below it by update 300 at lr 2.5e-4 — while a stalled one sits within 0.01-0.02
# of it for hundreds of updates (6.50 → 6.49 over 300 at lr 1e-3; the quickstart's 3 × 192 model at init 0.02 for
# 1,300). 0.1 nats separates the two by a wide margin either way; 250 updates leaves time to get there.
PLATEAU_MARGIN = 0.1
PLATEAU_MIN_UPDATES = 250
_COUNT_CHUNK = 1 << 22  # tokens per bincount: bounded memory (np.bincount works on int64 copies)


def warmup_warning(total_steps: int, warmup_steps: int, lr: float) -> str | None:
    """One line when the run ends before its warmup does, so that the learning rate never reaches ``lr`` (and the
    schedule never decays); None when the schedule fits the run."""
    if warmup_steps <= total_steps:
        return None
    reached = lr * total_steps / warmup_steps
    return (
        f"the run has {total_steps:,} updates but --warmup-steps {warmup_steps:,}: the learning rate only "
        f"reaches {reached:.3g} ({100 * total_steps / warmup_steps:.0f}% of --lr {lr:g}) and never decays "
        f"(pass --warmup-steps {max(1, total_steps // 10):,}, about a tenth of the run, or train longer)"
    )


def token_counts(arrays: list[np.ndarray], vocab: int) -> np.ndarray:
    """How often each of ``vocab`` ids occurs in ``arrays`` (memory-mapped shards, read in bounded chunks)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for a in arrays:
        for start in range(0, len(a), _COUNT_CHUNK):
            counts += np.bincount(a[start : start + _COUNT_CHUNK], minlength=vocab)[:vocab]
    return counts


def unigram_loss(train: list[np.ndarray], val: list[np.ndarray], vocab: int) -> float | None:
    """Cross-entropy in nats per token of the validation tokens under the training tokens' frequencies, add-one
    smoothed over the ``vocab`` ids (an id never seen in training still gets a probability): the loss of a model
    that learned which tokens are common and nothing about context. None without validation tokens."""
    seen, held = token_counts(train, vocab), token_counts(val, vocab)
    if held.sum() == 0:
        return None
    log_p = np.log(seen + 1.0) - np.log(seen.sum() + float(vocab))
    return float(-(held * log_p).sum() / held.sum())


def plateau_hint(step: int, val_loss: float, unigram: float | None) -> str | None:
    """One line when the validation loss after a meaningful number of updates is still at the unigram loss
    (within :data:`PLATEAU_MARGIN`, or above it): what it means and what to try. None otherwise."""
    if unigram is None or step < PLATEAU_MIN_UPDATES or not math.isfinite(val_loss):
        return None
    if val_loss < unigram - PLATEAU_MARGIN:
        return None
    return (
        f"hint: after {step:,} updates the validation loss {val_loss:.2f} is still at the unigram loss "
        f"{unigram:.2f} (predicting each token by its frequency alone): the model has not learned to use "
        f"context yet (small post-LN models stall at a high --lr, a short warm-up or a narrow init: try "
        f"--warmup-steps 30 or more, a lower --lr, --init-std 0.06 (the tiny preset's), or more updates; "
        f"docs/presets.md)"
    )
