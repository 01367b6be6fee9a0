"""The quickstart's final table: each number with what it means, and the commands for the real thing.

:func:`gptcli.pipelines.quickstart.quickstart` collects the numbers; ``gpt1 quickstart`` prints these rows. Kept apart
because the meaning of a number depends on how its stage went: one the time budget starved is labelled as
meaningless here rather than presented as what the model learned.
"""

from __future__ import annotations

from typing import Any

LEARNING_UPDATES = 100
"""Pretraining updates below which the toy model has learned nothing (it leaves the unigram loss within ~100,
:attr:`gptcli.pipelines.quickstart.QuickstartConfig.model`): fewer, and the figures that measure pretraining mean
nothing."""


def summary_rows(numbers: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(what, value, what it means)`` rows of the final table."""
    n = numbers
    ppl_uniform = n.get("vocab_size", 0)
    rows = [
        (
            "validation perplexity, before pretraining",
            f"{n['val_ppl_before']:,.1f}",
            f"the untrained model: of the order of the vocabulary size ({ppl_uniform:,} ids) — it knows nothing yet",
        ),
        (
            "validation perplexity, after pretraining",
            f"{n['val_ppl_after']:,.1f}",
            f"after {n['pretrain_steps']:,} updates ({n['pretrain_tokens'] / 1e6:.1f} M tokens) on held-out "
            "docstrings; lower is better (GPT-1 reached 18.4 on BooksCorpus)",
        ),
        (
            "fine-tuned test accuracy",
            f"{n['finetuned_accuracy']:.1f}%",
            f"original vs word-shuffled sentences it never saw; always answering the majority class scores "
            f"{n['majority_accuracy']:.1f}%",
        ),
        (
            "fine-tuned test MCC",
            f"{n['finetuned_mcc']:.1f}",
            "Matthews correlation × 100 (CoLA's metric): 0 = chance or majority class, 100 = perfect",
        ),
        (
            "zero-shot MCC, before pretraining",
            f"{n['zeroshot_mcc_before']:.1f}",
            "no fine-tuning: average token log-probability above a threshold = 'original' (the paper's CoLA "
            "heuristic); a random model knows nothing",
        ),
        (
            "zero-shot MCC, after pretraining",
            f"{n['zeroshot_mcc_after']:.1f}",
            f"the same heuristic on the pretrained model (accuracy {n['zeroshot_accuracy_after']:.1f}%): what "
            "pretraining alone learned about word order",
        ),
    ]
    starved = {
        "pretrain": f"MEANS NOTHING: the time budget left pretraining {n.get('pretrain_steps', 0):,} updates, fewer "
        f"than the {LEARNING_UPDATES} it needs to learn anything (give --minutes more)",
        "finetune": "MEANS NOTHING: the time budget left fine-tuning less than one epoch (give --minutes more)",
    }
    after_pretraining = ("validation perplexity, after pretraining", "zero-shot MCC, after pretraining")
    return [
        (what, value, starved["pretrain"])
        if n.get("pretrain_starved") and what in after_pretraining
        else (what, value, starved["finetune"])
        if n.get("finetune_starved") and what.startswith("fine-tuned")
        else (what, value, meaning)
        for what, value, meaning in rows
    ]


WHAT_NEXT: tuple[tuple[str, str, str], ...] = (
    ("gpt1 prepare books/ --out corpus", "prepare your own corpus (GPT-1 used BooksCorpus)", "datasets.md"),
    ("gpt1 pretrain --data corpus --out run --gpus 8", "pretrain the full 117M GPT-1", "reproducing-the-paper.md"),
    ("gpt1 finetune --task rte --init run --out rte", "fine-tune on one of the paper's 12 tasks", "finetune.md"),
    ("gpt1 zeroshot --task sst2 --checkpoint run", "the paper's zero-shot heuristics", "zeroshot.md"),
)
"""The real commands, printed at the end of the quickstart: (command, what it does, its guide page)."""


__all__ = ["LEARNING_UPDATES", "WHAT_NEXT", "summary_rows"]
