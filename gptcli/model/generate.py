"""Text generation from a GPT-1 language model: greedy, temperature, top-k and nucleus (top-p) sampling.

Decoding runs incrementally with the model's decoding state (:func:`gptcli.model.build.new_cache`: the Transformer's
:class:`~gptcli.model.gpt.KVCache`, the LSTM's recurrent :class:`~gptcli.model.lstm.LSTMState`): the prompt is encoded
once, then each new token costs one position. Only real vocabulary ids can be emitted: the logits of the special
token rows (start/delimiter/extract, appended for fine-tuning) and anything past the tokenizer's vocabulary are masked
out —
the released code's tied output matrix even spans the position rows, and sampling those would be meaningless.
GPT-1 has no end-of-text token, so generation stops after ``max_new_tokens`` or when the context is full.

:func:`iter_generate` yields the ids one at a time (streaming); :func:`generate` collects them.
:func:`generate_batch` / :func:`iter_generate_batch` decode several continuations of one prompt as one batch: the
prompt runs once, its state is copied to every row, and each step is one model call for all rows. What ``gpt1
generate`` runs around them (a checkpoint, a text prompt, streamed text) is :mod:`gptcli.pipelines.generate`,
configured by :class:`GenerateConfig`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gptcli.model.build import AnyConfig, DecodeState, LanguageModel, new_cache, repeat_cache
from gptcli.system.runtime import config_default

SAMPLING_ONLY = ("temperature", "top_k", "top_p", "seed")
"""The settings only sampling reads: ``greedy`` ignores them."""


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

    @staticmethod
    def inactive_settings(settings: Mapping[str, Any]) -> tuple[str, ...]:
        """What greedy decoding never reads, so never checks (:func:`gptcli.config.inactive_settings`)."""
        return SAMPLING_ONLY if settings.get("greedy") else ()

    def validate(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.greedy:
            return  # argmax decoding: the sampling settings below are ignored, as the help says, so not checked
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
    kernels: str = field(default_factory=config_default)
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy). Default: the
    process's mode when the config is made ($GPT1_KERNELS, else auto)."""
    verify: bool = True
    """Check the checkpoint's files against their checksums before loading it (--no-verify skips it)."""
    samples: int = 1
    """Continuations of the prompt to draw, decoded together as one batch (one model call per step for all of them).
    1 streams the text as it is produced; more print each sample, with a header, when all are done. Greedy samples
    are all the same."""

    def validate(self) -> None:
        super().validate()
        if self.samples < 1:
            raise ValueError("samples must be >= 1")


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p to ``logits`` (…, V); removed entries become ``-inf``.

    Top-k keeps every token tied with the k-th (as Hugging Face's warper does). When top-p follows top-k, the nucleus
    is computed from the k survivors ``topk`` already sorted instead of sorting the whole vocabulary — the same sorted
    row, so the same result — unless ties make the two orders differ (then the whole row is sorted, as before)."""
    if temperature != 1.0:  # x / 1.0 == x exactly: skip a full-vocabulary pass per step
        logits = logits / temperature
    survivors = None
    if top_k and top_k < logits.size(-1):
        survivors = torch.topk(logits, top_k, dim=-1)
        logits = logits.masked_fill(logits < survivors.values[..., -1:], float("-inf"))
    if top_p < 1.0:
        logits = logits.masked_fill(_nucleus_drop(logits, survivors, top_p), float("-inf"))
    return logits


def _nucleus_drop(logits: torch.Tensor, survivors: torch.return_types.topk | None, top_p: float) -> torch.Tensor:
    """Where top-p removes a token: keep it while the mass *before* it is still below ``top_p`` (so the most probable
    token always survives). ``survivors``: the ``torch.topk`` result that masked ``logits``, or None."""
    k = survivors.values.size(-1) if survivors is not None else 0
    if survivors is not None and _sorted_prefix_is_exact(logits, survivors.values):
        # The full descending sort would give exactly these k values followed by -inf: build that row directly.
        sorted_logits = torch.full_like(logits, float("-inf"))
        sorted_logits[..., :k] = survivors.values
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = (probs.cumsum(dim=-1) - probs)[..., :k] >= top_p
        return torch.zeros_like(logits, dtype=torch.bool).scatter(-1, survivors.indices, drop_sorted)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    return drop_sorted.scatter(-1, order, drop_sorted)


def _sorted_prefix_is_exact(logits: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether exactly ``k`` entries of each row survived top-k and no two of them are equal: then the sorted
    survivors pair with their indices exactly as a full sort would (ties could swap which index is dropped)."""
    k = values.size(-1)
    no_extra = (torch.isfinite(logits).sum(dim=-1) == k).all()
    distinct = (values[..., 1:] != values[..., :-1]).all()
    return bool(no_extra & distinct)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One id per row of ``logits`` (B, V) according to ``cfg``."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    filtered = filter_logits(logits.float(), cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_token_top_k(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """:func:`next_token` for top-k sampling that draws among the k candidates only: the same distribution, but k
    random numbers per row instead of one per vocabulary entry (``torch.multinomial`` draws an exponential for every
    column), and no full-vocabulary softmax. Used for batches (``samples > 1``); ties at the k-th logit, which top-k
    keeps too, fall back to :func:`next_token`."""
    logits = logits.float()
    if cfg.greedy or not 0 < cfg.top_k < logits.size(-1):
        return next_token(logits, cfg, generator)
    top = torch.topk(logits, cfg.top_k, dim=-1)
    if bool((logits >= top.values[..., -1:]).sum(dim=-1).gt(cfg.top_k).any()):
        return next_token(logits, cfg, generator)
    values = top.values / cfg.temperature if cfg.temperature != 1.0 else top.values
    if cfg.top_p < 1.0:  # the candidates are sorted already: the nucleus is a cumulative sum away
        probs = torch.softmax(values, dim=-1)
        values = values.masked_fill((probs.cumsum(dim=-1) - probs) >= cfg.top_p, float("-inf"))
    choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
    return top.indices.gather(-1, choice).squeeze(-1)


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


def iter_generate(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig | None = None,
    *,
    vocab_limit: int | None = None,
) -> Iterator[int]:
    """Continue ``prompt_ids``, yielding each new id as soon as it is chosen (see :func:`generate`).

    The prompt is checked before the first id is produced: a ``ValueError`` says what is wrong with it."""
    for tokens in _decode(model, prompt_ids, cfg, 1, vocab_limit):
        yield int(tokens)


def generate_batch(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig | None = None,
    *,
    samples: int,
    vocab_limit: int | None = None,
) -> list[list[int]]:
    """``samples`` continuations of ``prompt_ids`` decoded together as one batch: the new ids of each, one list per
    sample. See :func:`iter_generate_batch`."""
    rows: list[list[int]] = [[] for _ in range(samples)]
    for step in iter_generate_batch(model, prompt_ids, cfg, samples=samples, vocab_limit=vocab_limit):
        for row, token in zip(rows, step):
            row.append(token)
    return rows


def iter_generate_batch(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig | None = None,
    *,
    samples: int,
    vocab_limit: int | None = None,
) -> Iterator[list[int]]:
    """Continue ``prompt_ids`` in ``samples`` rows at once, yielding one new id per row at each step.

    The prompt runs once (batch 1) and its decoding state is copied to every row; then each step is one model call
    for all rows, each row sampled independently from the one seeded generator (greedy rows are all equal). With
    top-k the rows draw among the k candidates only (:func:`next_token_top_k`), so row 0 need not repeat what a
    single-sample run with the same seed draws; greedy row 0 is the single-sample greedy continuation."""
    if samples < 1:
        raise ValueError("samples must be >= 1")
    for tokens in _decode(model, prompt_ids, cfg, samples, vocab_limit):
        yield tokens.tolist()


@torch.no_grad()
def _decode(
    model: LanguageModel, prompt_ids: Sequence[int], cfg: SamplingConfig | None, samples: int, vocab_limit: int | None
) -> Iterator[torch.Tensor]:
    """The decoding loop behind every entry point: yields the ``(samples,)`` ids chosen at each step."""
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
    # One row keeps today's sampler (and so today's text for a seed); a batch draws among the top-k candidates.
    choose = next_token if samples == 1 else next_token_top_k
    steps = min(cfg.max_new_tokens, c.n_ctx - len(prompt))  # stop at the context limit
    seq = torch.tensor([prompt], dtype=torch.long, device=device)
    cache = _new_state(model, len(prompt) + steps) if cfg.use_cache else None
    was_training = model.training
    model.eval()
    try:
        inp = seq
        for step in range(steps):
            h = model(inp if cache is not None else seq, cache=cache)
            logits = model.lm_logits(h[:, -1])[:, :limit]  # never special rows or ids past the vocabulary
            if step == 0 and samples > 1:  # the prompt ran once; every row continues its state
                logits, seq = logits.expand(samples, -1), seq.expand(samples, -1)
                cache = repeat_cache(model, cache, samples) if cache is not None else None
            tok = choose(logits, cfg, generator)
            yield tok
            inp = tok.view(-1, 1)
            if cache is None:  # only the uncached reference re-reads the whole sequence
                seq = torch.cat([seq, inp], dim=1)
    finally:
        model.train(was_training)


def _new_state(model: LanguageModel, length: int) -> DecodeState:
    """A batch-1 decoding state for ``length`` positions. Keys and values are kept in the dtype they are computed
    in: the autocast dtype when autocast is on (storing bf16 values in an fp32 cache only to cast them back costs
    twice the memory traffic and changes nothing), else the weights'."""
    weight = model.tok_emb.weight
    dtype = weight.dtype
    if torch.is_autocast_enabled(weight.device.type):
        dtype = torch.get_autocast_dtype(weight.device.type)
    return new_cache(model, 1, device=weight.device, dtype=dtype, length=length)


def _check_prompt(prompt: list[int], c: AnyConfig) -> None:
    if not prompt:
        raise ValueError("the prompt is empty: GPT-1 has no start-of-text token to generate from")
    if len(prompt) > c.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {c.n_ctx}")
    if any(not 0 <= i < c.total_vocab for i in prompt):
        raise ValueError(f"prompt ids must lie in 0…{c.total_vocab - 1}")
