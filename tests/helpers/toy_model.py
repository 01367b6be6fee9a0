"""A tiny "pretrained" language-model checkpoint with the toy tokenizer, shared by fine-tuning and eval tests."""

from __future__ import annotations

from pathlib import Path

import torch
from toy_tokenizer import ToyTokenizer

from gptcli.checkpoint import save_checkpoint
from gptcli.model.gpt import GPT, ModelConfig

TINY = ModelConfig(vocab_size=97, n_ctx=64, n_embd=32, n_layer=2, n_head=2, n_inner=64)
"""Two blocks of width 32 over the toy tokenizer's 97 ids: fine-tunes in well under a second per task."""


def save_tiny_pretrained(run: Path, step: int = 10) -> Path:
    """A run directory holding one checkpoint (random weights, seed 0), as ``gpt1 pretrain`` lays it out."""
    torch.manual_seed(0)
    d = run / "checkpoints" / f"step-{step:07d}"
    save_checkpoint(d, GPT(TINY), ToyTokenizer(97), meta={"step": step})
    return d
