"""One factory for every architecture: which class a config builds, the presets of all of them, decoding states.

gpt1 has two language-model architectures with one interface (``forward(idx, cache) → hidden``, ``lm_logits``,
``add_special_tokens``, ``config``): the GPT-1 Transformer (``gpt.py``, arch ``"transformer"``) and the LSTM
baseline of the paper's Table 5 (``lstm.py``, arch ``"lstm"``). A preset names an architecture *and* its shape —
``gpt1``/``tiny`` are Transformers, ``lstm``/``lstm-tiny`` LSTMs — so one option (``--preset`` when pretraining,
``--model`` when fine-tuning without pretraining) selects both, and a checkpoint records its ``arch`` so that every
later command (finetune, eval, zeroshot, generate) builds the right class without being told.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch

from gptcli.model import gpt, lstm
from gptcli.model.gpt import GPT, KVCache, ModelConfig
from gptcli.model.lstm import LSTMLM, LSTMConfig, LSTMState
from gptcli.system.out_of_memory import weights_fit

TRANSFORMER = "transformer"
"""The ``arch`` of GPT-1 itself; a checkpoint that records none is one."""
ARCHS: dict[str, tuple[type, type]] = {TRANSFORMER: (ModelConfig, GPT), lstm.ARCH: (LSTMConfig, LSTMLM)}
"""arch name → (config class, model class)."""

AnyConfig = ModelConfig | LSTMConfig
LanguageModel = GPT | LSTMLM
DecodeState = KVCache | LSTMState

PRESETS: dict[str, AnyConfig] = {**gpt.PRESETS, **lstm.PRESETS}
"""Every named model: the Transformer's (gpt1, tiny) and the LSTM's (lstm, lstm-tiny)."""


def arch_of(config: Any) -> str:
    """The architecture name of a config (or of a model, by its ``config``)."""
    config = getattr(config, "config", config)
    for name, (cls, _) in ARCHS.items():
        if isinstance(config, cls):
            return name
    raise TypeError(f"not a model config: {type(config).__name__}")


def config_class(arch: str) -> type:
    """The config dataclass of ``arch``; ValueError naming the known ones."""
    if arch not in ARCHS:
        raise ValueError(f"unknown model architecture {arch!r} (known: {', '.join(ARCHS)})")
    return ARCHS[arch][0]


def config_from_dict(arch: str, fields: dict[str, Any]) -> AnyConfig:
    """A config of ``arch`` from its fields (a checkpoint's ``model`` table); ValueError for an unknown ``arch``,
    TypeError for fields it does not have."""
    return config_class(arch)(**fields)


def preset_class(name: str) -> type:
    """The config class behind preset ``name`` (which fields it takes); KeyError naming the known presets."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
    return type(PRESETS[name])


def preset(name: str, **overrides: Any) -> AnyConfig:
    """Preset ``name`` with fields overridden (``None`` overrides are ignored). KeyError for an unknown preset,
    ValueError naming fields the preset's architecture does not have or values it cannot take."""
    cls = preset_class(name)
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(
            f"unknown model setting(s) {', '.join(sorted(unknown))} for the {arch_of(PRESETS[name])} preset {name!r}"
        )
    return dataclasses.replace(PRESETS[name], **given)


def dropout_fields(preset_name: str) -> tuple[str, ...]:
    """The dropout probabilities of a preset's architecture (what ``--dropout`` sets together)."""
    return _dropout_fields(PRESETS[preset_name].__class__ if preset_name in PRESETS else ModelConfig)


def _dropout_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name.endswith("_pdrop"))


def with_dropout(model: LanguageModel, p: float) -> LanguageModel:
    """``model`` with every dropout probability of its architecture set to ``p``: a model of that config holding
    the same parameters and buffers (``model`` itself where they already are ``p``). The new model's own
    initialisation draws from a forked RNG, so the caller's random stream is what it would have been without."""
    fields: dict[str, Any] = dict.fromkeys(_dropout_fields(type(model.config)), p)
    if all(getattr(model.config, name) == value for name, value in fields.items()):
        return model
    with torch.random.fork_rng(devices=[]):
        new = build_model(dataclasses.replace(model.config, **fields))
    new.load_state_dict(model.state_dict())
    return new.train(model.training)


def reinit_after(model: LanguageModel, keep_layers: int) -> None:
    """Re-initialise blocks ``keep_layers…`` with the model's own init (fine-tuning's ``transfer_layers`` ablation).

    The embeddings (token, position) and blocks ``0 … keep_layers-1`` keep their values, as the released code's
    ``n_transfer`` does. An LSTM keeps its embedding and LSTM layers ``0 … keep_layers-1``
    (:meth:`gptcli.model.lstm.LSTMLM.reinit_layers`; the paper's has one layer: 0 keeps the embedding only).
    ValueError for a ``keep_layers`` outside ``0 … n_layer``."""
    if not 0 <= keep_layers <= model.config.n_layer:
        raise ValueError(f"keep_layers must be between 0 and {model.config.n_layer}, got {keep_layers}")
    if isinstance(model, LSTMLM):  # one module holds every layer
        model.reinit_layers(keep_layers)
        return
    for block in list(model.blocks)[keep_layers:]:
        block.apply(model._init_weights)


def build_model(config: AnyConfig) -> LanguageModel:
    """A freshly initialised model of the config's architecture (on the default device)."""
    return ARCHS[arch_of(config)][1](config)


def new_model(config: AnyConfig, device: torch.device | str = "cpu") -> LanguageModel:
    """A freshly initialised model on ``device`` for a run to train; one whose weights alone do not fit is the
    one-line error that gives its size (:func:`gptcli.system.out_of_memory.weights_fit`)."""

    def count() -> int:
        with torch.device("meta"):  # the count, without allocating the weights again
            return build_model(config).num_params()

    with weights_fit(device, count):
        return build_model(config).to(device)


def new_cache(
    model: LanguageModel,
    batch_size: int = 1,
    *,
    device: Any = None,
    dtype: torch.dtype | None = None,
    length: int | None = None,
) -> DecodeState:
    """An empty incremental-decoding state: the Transformer's KV cache (preallocated to ``length`` positions,
    default ``n_ctx``, in ``dtype`` on ``device``) or the LSTM's recurrent state (created by its first call, in the
    dtype the LSTM computes in; it has no length)."""
    if isinstance(model, LSTMLM):
        return model.new_cache(batch_size)
    return KVCache(model.config, batch_size, device=device, dtype=dtype, length=length)


def repeat_cache(model: LanguageModel, cache: DecodeState, n: int) -> DecodeState:
    """A state for ``n`` rows, each continuing the single-row ``cache`` (scoring several continuations of one
    shared context)."""
    if isinstance(cache, LSTMState):
        return cache.repeat(n)
    config = cast(GPT, model).config  # a KV cache is only ever a GPT's
    big = KVCache(config, n, device=cache.k[0].device, dtype=cache.k[0].dtype, length=cache.k[0].size(2))
    end = cache.pos
    for layer in range(len(big.k)):
        big.k[layer][:, :, :end] = cache.k[layer][:, :, :end]
        big.v[layer][:, :, :end] = cache.v[layer][:, :, :end]
    big.pos = end
    return big


__all__ = [
    "ARCHS",
    "PRESETS",
    "TRANSFORMER",
    "AnyConfig",
    "DecodeState",
    "LanguageModel",
    "arch_of",
    "build_model",
    "config_class",
    "config_from_dict",
    "dropout_fields",
    "new_cache",
    "preset",
    "preset_class",
    "with_dropout",
    "repeat_cache",
]
