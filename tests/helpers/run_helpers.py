"""Test helpers for runs and their checkpoints: a tiny pretraining config, corpora with *learned* tokenizers (two
different tokenizers of the same size), file snapshots and byte flips (the command line as a function is
``error_lines.gpt1``).

Used by tests/faults/test_runs_*.py. Everything is sized for seconds on two CPU cores.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
from pathlib import Path

import corpus_helpers  # noqa: F401  (registers the byte tokenizer of the corpora written there)

import gptcli.train.finetune_dev as ft_dev
from gptcli.train.pretrain import PretrainConfig

MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16}
# The same run on the command line.
TINY_ARGS = [
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
    "--warmup-steps",
    "1",
    "--device",
    "cpu",
    "--precision",
    "fp32",
    "--peak-flops",
    "1e11",
    "--quiet",
]


def tiny_config(data: Path, out: Path, **kw) -> PretrainConfig:
    """A pretraining run of a 1-layer, 32-wide model on 16-token windows, fp32 on the CPU."""
    base = dict(
        data=data,
        out=out,
        preset="tiny",
        model=dict(MODEL),
        seq_len=16,
        batch_size=4,
        max_steps=4,
        warmup_steps=1,
        eval_every=0,
        save_every=2,
        log_every=1,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    return PretrainConfig(**{**base, **kw})


def learned_corpus(directory: Path, words: str, vocab_size: int = 60, seed: int = 0) -> Path:
    """A corpus prepared by ``gpt1 prepare`` from six random texts over ``words``: its sentencepiece tokenizer is
    learned from them, so two word lists give two tokenizers of the same size that assign different ids."""
    from gptcli.data.prepare import PrepareConfig, prepare

    rng = random.Random(seed)
    texts = directory.parent / f"{directory.name}-texts"
    texts.mkdir(parents=True)
    vocabulary = words.split()
    for i in range(6):
        (texts / f"t{i}.txt").write_text(" ".join(rng.choice(vocabulary) for _ in range(800)), encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(texts)], out=directory, vocab_size=vocab_size, workers=1, val_fraction=0.2))
    return directory


def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` by relative path (to show a refusal changed nothing)."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def flip_byte(path: Path, offset: int = -64) -> None:
    """Invert one byte of ``path`` (by default near its end: inside the tensor data of a safetensors file)."""
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def sst2_folder(directory: Path) -> Path:
    """A tiny SST-2 folder in the official format (train.tsv, dev.tsv), for fine-tuning and zero-shot runs."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = ["a fine film\t1", "dull and long\t0", "loved it\t1", "a mess\t0"] * 2
    for split in ("train", "dev"):
        (directory / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return directory


def signal_at_dev_score(monkeypatch, nth: int = 1):
    """SIGINT to this process as fine-tuning's ``nth`` dev scoring starts (before its first batch); returns the
    unpatched ``predict``, to put back for a resumed run."""
    real, calls = ft_dev.predict, []

    def predict(*a, **k):
        calls.append(1)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(ft_dev, "predict", predict)
    return real
