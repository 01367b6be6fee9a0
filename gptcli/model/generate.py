"""Text generation from a GPT-1 language model: greedy, temperature, top-k and nucleus (top-p) sampling.

Decoding runs incrementally with the model's decoding state (:func:`gptcli.model.build.new_cache`: the Transformer's
:class:`~gptcli.model.gpt.KVCache`, the LSTM's recurrent :class:`~gptcli.model.lstm.LSTMState`): the prompt is encoded
once, then each new token costs one position. Only real vocabulary ids can be emitted: the logits of the special token rows
(start/delimiter/extract, appended for fine-tuning) and anything past the tokenizer's vocabulary are masked out —
the released code's tied output matrix even spans the position rows, and sampling those would be meaningless.
GPT-1 has no end-of-text token, so generation stops after ``max_new_tokens`` or when the context is full.

:func:`iter_generate` yields the ids one at a time (streaming); :func:`generate` collects them. What ``gpt1
generate`` runs around them (a checkpoint, a text prompt, streamed text) is :mod:`gptcli.pipelines.generate`,
configured by :class:`GenerateConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from gptcli.model.build import AnyConfig, LanguageModel, new_cache


@dataclass
class SamplingConfig:
    """How the next token is chosen."""

    max_new_tokens: int = 64
    """Tokens to generate at most (fewer if the context fills up first)."""
    greedy: bool = False
    """Always take the most probable token (ignores temperature, top_k, top_p and seed)."""
    temperature: float = 1.0
    """Divide logits by this before sampling; < 1 sharpens, > 1 flattens. Must be > 0."""
    top_k: int = 0
    """Sample only among the k most probable tokens (0 = no limit)."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability mass reaches top_p (1.0 = no limit)."""
    seed: int | None = None
    """Seed of the sampling RNG; the same seed, prompt and model give the same text."""
    use_cache: bool = True
    """Decode with the KV cache (an LSTM: its carried state), one position per step, instead of re-running the whole
    sequence."""

    def validate(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0 (use greedy for argmax decoding)")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")


@dataclass
class GenerateConfig(SamplingConfig):
    """A ``gpt1 generate`` run: the sampling settings above plus which model continues which text, where.

    A ``--config`` file of sampling settings alone (a SamplingConfig) is a valid GenerateConfig file."""

    checkpoint: Path | None = None
    """Checkpoint directory (or run directory: its newest checkpoint), e.g. one written by `gpt1 convert`.
    `gpt1 generate` also takes a Hugging Face Hub id (converted once) and, when none is given, uses ``openai-gpt``
    (OpenAI's released GPT-1)."""
    prompt: str | None = None
    """Text to continue (cleaned and tokenized like training text)."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto (cuda when available)."""
    verify: bool = True
    """Check the checkpoint's files against their checksums before loading it (--no-verify skips it)."""


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p to ``logits`` (…, V); removed entries become ``-inf``."""
    logits = logits / temperature
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep a token if the mass *before* it is still below top_p: the most probable token always survives.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One id per row of ``logits`` (B, V) according to ``cfg``."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    filtered = filter_logits(logits.float(), cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig | None = None,
    *,
    vocab_limit: int | None = None,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """Continue ``prompt_ids`` and return the new ids only.

    ``vocab_limit``: ids ≥ this are never emitted (default: the model's BPE vocabulary, i.e. no special rows);
    pass the tokenizer's ``vocab_size``. ``on_token(id)`` is called as soon as each id is chosen (streaming).
    """
    out: list[int] = []
    for token in iter_generate(model, prompt_ids, cfg, vocab_limit=vocab_limit):
        out.append(token)
        if on_token is not None:
            on_token(token)
    return out


@torch.no_grad()
def iter_generate(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig | None = None,
    *,
    vocab_limit: int | None = None,
) -> Iterator[int]:
    """Continue ``prompt_ids``, yielding each new id as soon as it is chosen (see :func:`generate`).

    The prompt is checked before the first id is produced: a ``ValueError`` says what is wrong with it."""
    cfg = cfg or SamplingConfig()
    cfg.validate()
    c = model.config
    limit = min(vocab_limit or c.vocab_size, c.vocab_size)
    prompt = list(prompt_ids)
    _check_prompt(prompt, c)
    device = model.tok_emb.weight.device
    generator = None
    if not cfg.greedy and cfg.seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.seed)
    was_training = model.training
    model.eval()
    steps = min(cfg.max_new_tokens, c.n_ctx - len(prompt))  # stop at the context limit
    seq = torch.tensor([prompt], dtype=torch.long, device=device)
    cache = new_cache(model, 1, device=device, dtype=model.tok_emb.weight.dtype) if cfg.use_cache else None
    inp = seq
    try:
        for _ in range(steps):
            h = model(inp if cache is not None else seq, cache=cache)
            logits = model.lm_logits(h[:, -1])[:, :limit]  # never special rows or ids past the vocabulary
            tok = next_token(logits, cfg, generator)
            yield int(tok)
            inp = tok.view(1, 1)
            seq = torch.cat([seq, inp], dim=1)
    finally:
        model.train(was_training)


def _check_prompt(prompt: list[int], c: AnyConfig) -> None:
    if not prompt:
        raise ValueError("the prompt is empty: GPT-1 has no start-of-text token to generate from")
    if len(prompt) > c.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {c.n_ctx}")
    if any(not 0 <= i < c.total_vocab for i in prompt):
        raise ValueError(f"prompt ids must lie in 0…{c.total_vocab - 1}")
