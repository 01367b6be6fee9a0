"""How to train each model preset: the recommended settings, and the evidence behind them.

A preset (``gptcli.model.gpt.PRESETS``) fixes a model's shape and initialisation; how to train it is a separate
fact, kept here once. The ``gpt1`` recipe is the paper's (reference §3, §4.1) and is what ``PretrainConfig`` and
``FinetuneConfig`` default to. The small presets are ours: the paper's recipe (64 × 512-token batches, lr 2.5e-4,
2,000 warm-up updates) is made for 117 M parameters and hundreds of thousands of updates, not a laptop-hour, so a
small preset's recipe was chosen by measurement (``benchmarks/preset_sweep.py``; docs/presets.md has the sweep, its
curves and the command). ``gpt1 pretrain`` prints a small preset's recipe at start when the run still uses the
paper's batch, sequence length and learning rate (:func:`recipe_note`).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_WARMUP = 30
"""Warm-up updates a small post-LN model needs whatever the run's length (the tiny recipe's evidence below)."""
WARMUP_RULE = f"at least {MIN_WARMUP} updates, about a tenth of a longer run"
"""The one warm-up advice every message gives (:func:`warmup_for` computes it)."""


def warmup_for(updates: int) -> int:
    """The warm-up to advise for a run of ``updates`` updates (:data:`WARMUP_RULE`), never longer than the run: a
    shorter warm-up leaves small models on the unigram plateau, a longer one never reaches the learning rate."""
    return max(1, min(updates, max(MIN_WARMUP, round(updates / 10))))


@dataclass(frozen=True)
class Recipe:
    """Recommended settings for pretraining and fine-tuning one preset."""

    lr: float
    """Peak pretraining learning rate."""
    batch_size: int
    """Pretraining batch, in sequences."""
    seq_len: int
    """Pretraining sequence length."""
    warmup: str
    """Warm-up, as words: a number of updates, or a share of the run."""
    finetune_lr: float
    """Fine-tuning peak learning rate."""
    finetune_batch_size: int
    """Fine-tuning batch, in examples."""
    finetune_epochs: int
    """Fine-tuning epochs."""
    evidence: str
    """Where the numbers come from."""

    def pretrain_flags(self) -> str:
        return (
            f"--lr {sci(self.lr)} --batch-size {self.batch_size} --seq-len {self.seq_len} --warmup-steps {self.warmup}"
        )

    def finetune_flags(self) -> str:
        return f"--lr {sci(self.finetune_lr)} --batch-size {self.finetune_batch_size} --epochs {self.finetune_epochs}"


def sci(x: float) -> str:
    """A learning rate as people write it: 1e-3, 2.5e-4, 6.25e-5."""
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


RECIPES: dict[str, Recipe] = {
    "gpt1": Recipe(
        lr=2.5e-4,
        batch_size=64,
        seq_len=512,
        warmup="2000",
        finetune_lr=6.25e-5,
        finetune_batch_size=32,
        finetune_epochs=3,
        evidence="the paper (§4.1)",
    ),
    # Chosen by a sweep (docs/presets.md, "The unigram plateau, and why `tiny` is initialised at 0.06"): with the
    # preset's init_std every learning rate of the sweep left the unigram plateau, with GPT-1's 0.02 not all did.
    # Fine-tuning: the CPU reproduction's recipe (docs/reproduction.md). Warm-up: a fixed number of updates, not a
    # share of the run, because the post-LN block needs its warm-up in updates (Xiong et al. 2020); a shorter one
    # left a short run on the plateau (tests/train/test_recipes.py).
    "tiny": Recipe(
        lr=1e-3,
        batch_size=16,
        seq_len=128,
        warmup=f"{MIN_WARMUP} (at least; ≈ 10% of a longer run)",
        finetune_lr=5e-4,
        finetune_batch_size=32,
        finetune_epochs=3,
        evidence="benchmarks/preset_sweep.py on two books (docs/presets.md); fine-tuning: "
        "the CPU reproduction's 4 × 192 model (docs/reproduction.md)",
    ),
}


def recipe_note(preset: str, lr: float, batch_size: int, seq_len: int) -> str | None:
    """One line naming a small preset's recipe when the run still trains it with the paper's batch, sequence length
    and learning rate (made for the 117 M model); None for ``gpt1``, presets without a recipe, or a run that set
    any of the three itself."""
    paper = RECIPES["gpt1"]
    recipe = RECIPES.get(preset)
    if preset == "gpt1" or recipe is None or (lr, batch_size, seq_len) != (paper.lr, paper.batch_size, paper.seq_len):
        return None
    return (
        f"preset {preset} trains with the paper's recipe for the 117M model (batch {batch_size} × {seq_len}, "
        f"lr {lr:g}); its own, measured: {recipe.pretrain_flags()}; fine-tune with {recipe.finetune_flags()} "
        f"(docs/presets.md)"
    )
