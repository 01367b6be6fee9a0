"""The settings of ``gpt1 zeroshot`` (:func:`gptcli.eval.zeroshot.zeroshot`), beside the heuristics as
``train/finetune_config.py`` is beside fine-tuning: the dataclass is the command's options."""

from __future__ import annotations

from dataclasses import dataclass, field

from gptcli.model.kernels import config_default


@dataclass
class ZeroShotConfig:
    """Settings of ``gpt1 zeroshot`` (one checkpoint; the curve over many is in :mod:`gptcli.eval.curve`)."""

    task: str = "sst2"
    """sst2, cola, race, race-m, race-h, dprd, wsc or storycloze; a comma-separated list; or ``all`` (sst2, cola,
    race, dprd, wsc, storycloze)."""
    checkpoint: str = ""
    """Checkpoint directory, or a run directory (its newest checkpoint). `gpt1 zeroshot` also takes a Hugging Face
    Hub id (converted once) and, when empty, uses ``openai-gpt`` (OpenAI's released GPT-1)."""
    split: str | None = None
    """Split to score (default per task: dev; DPRD test; WSC273 its only file; Story Cloze the whole 2016 val file)."""
    splits: dict[str, str] = field(default_factory=dict)
    """Per-task split overrides (``{"dprd": "train"}``), applied over ``split``."""
    data_dir: str | None = None
    """Task folder (one task) or the root holding every task folder (``all``); default ``$GPT1_DATA``."""
    out: str | None = None
    """Directory for ``results.json`` and ``predictions-<task>.jsonl`` (a curve adds ``curve.json``, ``curve.png``
    and one such folder per checkpoint); nothing is written when unset. Replaced whole, and only when it holds
    earlier zero-shot results."""
    threshold: float | None = None
    """CoLA: fixed average log-probability threshold instead of fitting it on the train split (default: fitted to
    maximise MCC on the train split)."""
    batch_size: int = 32
    """Rows per forward pass."""
    limit: int | None = None
    """Score only the first N examples of each split (the CoLA threshold split included)."""
    precision: str = "auto"
    """``auto`` (bf16 autocast on CUDA and on CPUs with native bf16, else fp32), ``fp32``, ``bf16`` or ``fp16``."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``…"""
    kernels: str = field(default_factory=config_default)
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy). Default: the
    process's mode when the config is made ($GPT1_KERNELS, else auto)."""
    verify: bool = True
    """Check each checkpoint's files against their checksums before scoring (--no-verify skips it)."""
