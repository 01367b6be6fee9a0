"""The small presets' recipes: the tiny preset trained as documented leaves the unigram plateau on two real books;
the recipe is named at start when a small preset still uses the paper's batch and learning rate; the help text and
the recipe table agree."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gptcli.commands.options import field_docs
from gptcli.data.prepare import PrepareConfig, prepare
from gptcli.data.shards import open_corpus
from gptcli.model.gpt import PRESETS
from gptcli.progress import RecordingProgress
from gptcli.train.pretrain import PretrainConfig, pretrain
from gptcli.train.pretrain_job import unigram_loss
from gptcli.train.recipes import RECIPES, recipe_note, sci

BOOKS = ("pg244_study_in_scarlet.txt", "pg55_wonderful_wizard_of_oz.txt")


def test_the_note_names_the_recipe_only_for_a_small_preset_on_the_papers_settings():
    paper = PretrainConfig()
    note = recipe_note("tiny", paper.lr, paper.batch_size, paper.seq_len)
    assert note is not None and RECIPES["tiny"].pretrain_flags() in note and RECIPES["tiny"].finetune_flags() in note
    assert recipe_note("gpt1", paper.lr, paper.batch_size, paper.seq_len) is None
    assert recipe_note("tiny", 1e-3, paper.batch_size, paper.seq_len) is None  # the user chose an lr
    assert recipe_note("tiny", paper.lr, 16, paper.seq_len) is None
    assert recipe_note("no-such-preset", paper.lr, paper.batch_size, paper.seq_len) is None


def test_learning_rates_are_written_as_people_write_them():
    assert [sci(x) for x in (1e-3, 2.5e-4, 6.25e-5, 5e-4, 1.0)] == ["1e-3", "2.5e-4", "6.25e-5", "5e-4", "1e0"]


def test_the_papers_recipe_is_what_the_configs_default_to():
    from gptcli.train.finetune import FinetuneConfig

    paper, p, f = RECIPES["gpt1"], PretrainConfig(), FinetuneConfig()
    assert (p.lr, p.batch_size, p.seq_len, str(p.warmup_steps)) == (
        paper.lr,
        paper.batch_size,
        paper.seq_len,
        paper.warmup,
    )
    assert (f.lr, f.batch_size, f.epochs) == (paper.finetune_lr, paper.finetune_batch_size, paper.finetune_epochs)


def test_the_preset_help_gives_every_small_recipe():
    doc = field_docs(PretrainConfig)["preset"]
    for name, r in RECIPES.items():
        assert name in PRESETS
        if name == "gpt1":
            continue
        for flag in (
            f"--lr {sci(r.lr)}",
            f"--batch-size {r.batch_size}",
            f"--seq-len {r.seq_len}",
            f"--lr {sci(r.finetune_lr)}",
            f"--batch-size {r.finetune_batch_size}",
            f"--epochs {r.finetune_epochs}",
        ):
            assert flag in doc, (name, flag)
        assert f"init {PRESETS[name].init_std:g}" in doc


@pytest.mark.slow
def test_tiny_with_its_recipe_leaves_the_unigram_plateau_on_two_books(shared_data, tmp_path):
    """Issue #14: the tiny preset at lr 1e-3 used to sit on the unigram plateau (init 0.02). With the preset's init
    and its recipe (lr 1e-3, a 30-update warm-up), 150 updates of 16 × 128 tokens on two real books end well below
    the unigram loss, where a plateaued run stays within 0.01 of it."""
    r = RECIPES["tiny"]
    corpus = tmp_path / "corpus"
    prepare(
        PrepareConfig(
            inputs=[str(shared_data / "books" / b) for b in BOOKS],
            out=corpus,
            vocab_size=4000,
            strip_gutenberg=True,
            split_by="paragraph",
            val_fraction=0.1,
            seed=0,
            workers=1,
        )
    )
    oc = open_corpus(corpus)
    unigram = unigram_loss(oc.arrays("train"), oc.arrays("val"), oc.tokenizer.vocab_size)
    rec = RecordingProgress()
    res = pretrain(
        PretrainConfig(
            data=corpus,
            out=tmp_path / "run",
            preset="tiny",
            lr=r.lr,
            batch_size=r.batch_size,
            seq_len=r.seq_len,
            max_steps=150,
            warmup_steps=30,
            eval_every=0,
            eval_batches=8,
            save_every=0,
            log_every=50,
            device="cpu",
            precision="fp32",
            peak_flops=1e11,
        ),
        progress=rec,
    )
    assert math.isfinite(res.final_val_loss) and unigram is not None
    # Measured: 5.86 against a unigram loss of 6.11 (0.25 below); with a 15-update warm-up the same run stays at 6.11.
    assert res.final_val_loss < unigram - 0.15, (res.final_val_loss, unigram)
    assert not any("unigram" in n["message"] for n in rec.of("note"))  # no plateau hint
    assert Path(res.run_dir).is_dir()
