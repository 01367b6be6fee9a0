"""Hugging Face's ``openai-gpt`` format: its ``config.json`` and the weight mapping to ``OpenAIGPTLMHeadModel``.

Hugging Face stores attention and MLP weights as "Conv1D" matrices of shape [in, out] (x·W), like the released
TensorFlow code; we use ``nn.Linear`` ([out, in]), so those matrices are transposed on the way in and out.
A Hugging Face directory's ``config.json`` is Hugging Face's own format (``n_positions``, ``afn``, ...), not a gpt1
checkpoint's (that one is read only by :mod:`gptcli.checkpoint`); this module is where it is read and written.
It works on plain dicts and state dicts and needs no ``transformers`` install.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from gptcli.errors import DataError, GPT1Error
from gptcli.model.gpt import ModelConfig

HF_CONFIG = "config.json"
"""A Hugging Face model directory's configuration file."""

# (our suffix, HF suffix, transpose?) inside each block.
_BLOCK_MAP = [
    ("attn.qkv.weight", "attn.c_attn.weight", True),
    ("attn.qkv.bias", "attn.c_attn.bias", False),
    ("attn.proj.weight", "attn.c_proj.weight", True),
    ("attn.proj.bias", "attn.c_proj.bias", False),
    ("ln_1.weight", "ln_1.weight", False),
    ("ln_1.bias", "ln_1.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True),
    ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True),
    ("mlp.proj.bias", "mlp.c_proj.bias", False),
    ("ln_2.weight", "ln_2.weight", False),
    ("ln_2.bias", "ln_2.bias", False),
]


def config_from_hf(hf: dict) -> ModelConfig:
    """Our config from a Hugging Face ``config.json`` dict of model_type ``openai-gpt``."""
    n_embd = _size(hf, "n_embd", 768)
    return ModelConfig(
        vocab_size=_size(hf, "vocab_size", 40478),
        n_ctx=_size(hf, "n_positions", 512),
        n_embd=n_embd,
        n_layer=_size(hf, "n_layer", 12),
        n_head=_size(hf, "n_head", 12),
        n_inner=_size(hf, "n_inner", 4 * n_embd) if hf.get("n_inner") is not None else 4 * n_embd,
        embd_pdrop=_rate(hf, "embd_pdrop", 0.1),
        attn_pdrop=_rate(hf, "attn_pdrop", 0.1),
        resid_pdrop=_rate(hf, "resid_pdrop", 0.1),
        layer_norm_eps=_rate(hf, "layer_norm_epsilon", 1e-5),
        init_std=_rate(hf, "initializer_range", 0.02),
    )


def _size(hf: dict, key: str, default: int) -> int:
    """A positive integer field: a string, a float (12.7 is not 12) or a bool is refused (TypeError, ValueError)."""
    v = hf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{key} is {v!r}, not an integer")
    if v < 1:
        raise ValueError(f"{key} is {v}, not a positive size")
    return v


def _rate(hf: dict, key: str, default: float) -> float:
    v = hf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{key} is {v!r}, not a non-negative number")
    return float(v)


def config_to_hf(cfg: ModelConfig) -> dict:
    """A Hugging Face ``config.json`` dict for our config (special rows count as vocabulary there)."""
    return {
        "architectures": ["OpenAIGPTLMHeadModel"],
        "model_type": "openai-gpt",
        "vocab_size": cfg.total_vocab,
        "n_positions": cfg.n_ctx,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "afn": "gelu",  # HF's "gelu" for openai-gpt is the tanh approximation
        "resid_pdrop": cfg.resid_pdrop,
        "embd_pdrop": cfg.embd_pdrop,
        "attn_pdrop": cfg.attn_pdrop,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_range": cfg.init_std,
    }


def state_dict_from_hf(sd: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """Map an ``OpenAIGPTLMHeadModel``/``OpenAIGPTModel`` state dict onto our parameter names."""
    prefix = "transformer." if any(k.startswith("transformer.") for k in sd) else ""
    out = {
        "tok_emb.weight": sd[f"{prefix}tokens_embed.weight"],
        "pos_emb.weight": sd[f"{prefix}positions_embed.weight"],
    }
    for i in range(n_layer):
        for ours, theirs, transpose in _BLOCK_MAP:
            t = sd[f"{prefix}h.{i}.{theirs}"]
            out[f"blocks.{i}.{ours}"] = t.t().contiguous() if transpose else t
    return out


def state_dict_to_hf(sd: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """Our state dict as an ``OpenAIGPTLMHeadModel`` state dict (the LM head is tied to the embedding)."""
    out = {
        "transformer.tokens_embed.weight": sd["tok_emb.weight"],
        "transformer.positions_embed.weight": sd["pos_emb.weight"],
    }
    for i in range(n_layer):
        for ours, theirs, transpose in _BLOCK_MAP:
            t = sd[f"blocks.{i}.{ours}"]
            out[f"transformer.h.{i}.{theirs}"] = t.t().contiguous() if transpose else t.contiguous()
    out["lm_head.weight"] = sd["tok_emb.weight"]
    return out


def read_hf_config(directory: Path) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face ``openai-gpt`` directory, checked to be one GPT-1 can load."""
    path = directory / HF_CONFIG
    if not path.is_file():
        raise GPT1Error(f"{directory}: no config.json (not a Hugging Face checkpoint directory)")
    try:
        hf_cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(path, f"invalid JSON ({e.msg})", e.lineno) from None
    if not isinstance(hf_cfg, dict):
        raise DataError(path, "expected a JSON object")
    if hf_cfg.get("model_type") != "openai-gpt":
        raise DataError(path, f"model_type is {hf_cfg.get('model_type')!r}, expected 'openai-gpt'")
    if hf_cfg.get("afn", "gelu") != "gelu":
        raise DataError(path, f"activation {hf_cfg.get('afn')!r} is not supported (GPT-1 uses gelu)")
    return hf_cfg


def write_hf_config(directory: Path, cfg: ModelConfig, *, special_tokens: dict[str, int] | None = None) -> None:
    """``config.json`` for ``cfg``, with the context length as ``model_max_length`` and, given ``special_tokens``,
    gpt1's fine-tuning tokens and their ids; GPT-1 has no BOS, EOS or padding token. (The tokenizer's files are
    :mod:`gptcli.interop.hf_tokenizer`'s.) ``directory`` is a fresh temporary directory that is renamed into place
    whole, so plain writes suffice."""
    body = {
        **config_to_hf(cfg),
        "model_max_length": cfg.n_ctx,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if special_tokens:
        body["gpt1_special_tokens"] = special_tokens
    (directory / HF_CONFIG).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
