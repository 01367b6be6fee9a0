"""The LSTM baseline of the paper's Table 5 ("LSTM w/ aux LM"): a single-layer, 2048-unit LSTM language model.

The paper (§5) swaps the Transformer for "a single layer 2048 unit LSTM" in the same framework and says nothing
more; each gap is a :class:`LSTMConfig` field, filled so that only what sits between embedding and softmax differs
from GPT-1, which is what Table 5 compares. Shape: embedding (``n_embd`` = 768, the Transformer's) → dropout →
``nn.LSTM`` (``n_layer`` × ``n_hidden``) → dropout → a projection to ``n_embd`` when the widths differ (the LSTMP of
Sak et al. 2014, Jozefowicz et al. 2016) → output layer tied to the embedding; ``n_embd = 2048`` is the
parameter-matched alternative. Dropout only on non-recurrent connections (Zaremba et al. 2014, the placement cuDNN
fuses), 0.1 as GPT-1. Initialisation: embedding and projection N(0, ``init_std``), ``nn.LSTM``'s default for the
matrices, forget-gate bias 1 (Gers et al. 2000). Every window starts from a zero state; ``n_ctx`` only bounds lengths.

:class:`LSTMLM` exposes the :class:`~gptcli.model.gpt.GPT` interface (``forward(idx, cache) → hidden``,
``lm_logits``, ``add_special_tokens``, ``config`` …), so heads, scoring, zero-shot and generation use it unchanged;
a task head reads the projected output at the extract token. Decoding carries an :class:`LSTMState`, the LSTM's
counterpart of the KV cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn

from gptcli.model.dropout import Dropout
from gptcli.model.tied import TiedEmbeddingLM

ARCH = "lstm"
"""The ``arch`` a checkpoint of this model records (see ``gptcli/checkpoint.py``)."""


@dataclass
class LSTMConfig:
    """Shape and regularisation of the LSTM language model. Defaults are the paper preset (2048 units)."""

    vocab_size: int = 40478
    """BPE vocabulary size (the original: 40,478)."""
    n_special: int = 0
    """Extra token rows after the vocabulary: 0 when pretraining, 3 (start, delimiter, extract) when fine-tuning."""
    n_ctx: int = 512
    """Longest sequence the model is run on (no position table: the pretraining window, as the Transformer's)."""
    n_embd: int = 768
    """Width of the token embedding, of the tied output layer and of the hidden states heads read (not in the
    paper; 768 as GPT-1's)."""
    n_hidden: int = 2048
    """LSTM units per layer (paper: 2048); projected to n_embd when they differ."""
    n_layer: int = 1
    """Stacked LSTM layers (paper: 1)."""
    embd_pdrop: float = 0.1
    """Dropout on the embedded tokens entering the LSTM (not in the paper; the Transformer's rate)."""
    out_pdrop: float = 0.1
    """Dropout on the LSTM's outputs, before the projection (and between stacked layers); never on the recurrent
    state (not in the paper; the Transformer's rate)."""
    init_std: float = 0.02
    """Standard deviation of the N(0, σ) initialisation of the embedding and the projection."""

    @property
    def total_vocab(self) -> int:
        """Rows of the token embedding (and columns of the LM logits): vocabulary plus special tokens."""
        return self.vocab_size + self.n_special

    @property
    def projected(self) -> bool:
        """Whether a linear layer maps the LSTM's ``n_hidden`` outputs to ``n_embd``."""
        return self.n_hidden != self.n_embd


PRESETS: dict[str, LSTMConfig] = {
    # The paper's baseline: one layer of 2048 units; 768-wide embedding and softmax as GPT-1's (55.7 M parameters).
    "lstm": LSTMConfig(),
    # The size of the `tiny` Transformer preset (8192 ids: 5.45 M parameters against tiny's 5.39 M).
    "lstm-tiny": LSTMConfig(vocab_size=8192, n_embd=256, n_hidden=768),
}


def recurrent_dtype(device_type: str, autocast_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the recurrent layer computes in under autocast to ``autocast_dtype`` (None: no autocast).

    CUDA's autocast runs cuDNN's LSTM in fp16 whatever dtype it was asked for (aten/src/ATen/cudnn/AutocastRNN.cpp
    casts to ``kHalf``): a bf16 run would train its LSTM in fp16 without the loss scaler fp16 needs. There, for a
    bf16 run, the layer runs outside autocast in fp32 (TF32 matmuls); an fp16 run gets the fp16 it asked for (with
    its GradScaler). The CPU's autocast runs oneDNN's LSTM in the dtype asked for where this CPU's oneDNN has that
    LSTM (:func:`cpu_has_bf16_lstm`), else the layer runs in fp32 too."""
    if autocast_dtype is None:
        return torch.float32
    if device_type == "cuda" and autocast_dtype != torch.float16:
        return torch.float32
    if device_type == "cpu" and autocast_dtype == torch.bfloat16 and not cpu_has_bf16_lstm():
        return torch.float32
    return autocast_dtype


@functools.lru_cache(maxsize=1)
def cpu_has_bf16_lstm() -> bool:
    """Whether oneDNN builds a bf16 LSTM on this CPU, forward and backward, as bf16 autocast asks it to.

    PyTorch hands a bf16 LSTM to oneDNN whenever its bf16 check passes, but oneDNN's RNN primitive in bf16 needs
    AVX-512; on an AVX2-only CPU it fails with "could not create a primitive descriptor for
    the LSTM forward propagation primitive". Which CPUs pass depends on the oneDNN inside this torch, not on a flag
    gpt1 could read, so a one-step LSTM of one unit is run once per process to find out (cheap next to any
    model's work)."""
    # Its own RNG state (the layer's initialisation must not move a run's seed stream) and grad mode (the first
    # caller may be an evaluation under inference_mode).
    with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
        try:
            x = torch.zeros(1, 1, 1, requires_grad=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y, _ = nn.LSTM(1, 1)(x)
            y.float().sum().backward()
            return True
        except RuntimeError:
            return False


def precision_note(device_type: str, precision: str) -> str | None:
    """The line a run prints when its LSTM computes in another precision than the run's (None when it does not)."""
    asked = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    actual = recurrent_dtype(device_type, asked)
    if asked is None or actual == asked:
        return None
    why = (
        "CUDA's autocast would run it in float16 without a loss scaler"
        if device_type == "cuda"
        else "this CPU's oneDNN has no bf16 LSTM"
    )
    return (
        f"the LSTM layer computes in {str(actual).removeprefix('torch.')} on {device_type} in this {precision} run "
        f"({why}); the rest of the model runs in {precision}"
    )


def _reflatten(module: LSTMLM, incompatible_keys) -> None:  # noqa: ARG001 (the load_state_dict hook signature)
    if next(module.lstm.parameters()).is_cuda:
        module.lstm.flatten_parameters()


class LSTMState:
    """The recurrent state ``(h, c)`` carried between calls when decoding incrementally: the LSTM's KV cache.

    ``h`` and ``c`` are ``(n_layer, batch, n_hidden)``, or None before the first call (a zero state); ``pos`` counts
    the positions already consumed, as :class:`~gptcli.model.gpt.KVCache` does.
    """

    def __init__(self, batch_size: int = 1) -> None:
        self.batch_size = batch_size
        self.h: torch.Tensor | None = None
        self.c: torch.Tensor | None = None
        self.pos = 0

    def repeat(self, n: int) -> LSTMState:
        """A state for ``n`` rows that all continue this single-row state (scoring several continuations)."""
        out = LSTMState(n)
        if self.h is not None and self.c is not None:
            out.h = self.h.expand(-1, n, -1).contiguous()
            out.c = self.c.expand(-1, n, -1).contiguous()
        out.pos = self.pos
        return out


class LSTMLM(TiedEmbeddingLM):
    """Token embedding, ``n_layer`` LSTM layers, optional projection, output layer tied to the embedding.

    ``forward`` returns the hidden states (B, T, n_embd) and ``lm_logits`` maps them to vocabulary logits, the
    interface of :class:`~gptcli.model.gpt.GPT`.
    """

    config: LSTMConfig

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.total_vocab, config.n_embd)
        self.drop_in = Dropout(config.embd_pdrop)
        self.lstm = nn.LSTM(
            config.n_embd,
            config.n_hidden,
            num_layers=config.n_layer,
            batch_first=True,
            dropout=config.out_pdrop if config.n_layer > 1 else 0.0,
        )
        self.drop_out = Dropout(config.out_pdrop)
        self.proj = nn.Linear(config.n_hidden, config.n_embd) if config.projected else None
        self.reset_parameters()
        # cuDNN wants the LSTM's weights in one buffer. ``.to()`` re-flattens them (nn.RNNBase._apply); weights
        # loaded with ``assign=True`` arrive as separate tensors, so flatten once after a load, not on every forward
        # (nor on every generated token).
        self.register_load_state_dict_post_hook(_reflatten)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every weight as the module docstring says."""
        nn.init.normal_(self.tok_emb.weight, 0.0, self.config.init_std)
        self.reinit_layers(0)

    @torch.no_grad()
    def reinit_layers(self, keep_layers: int) -> None:
        """Re-initialise LSTM layers ``keep_layers…`` and, unless every layer is kept, the projection (it reads the
        last layer's output); the embedding always keeps its values (the ``transfer_layers`` ablation: 0 keeps the
        embeddings only, as the released code's ``n_transfer``)."""
        c = self.config
        bound = c.n_hidden**-0.5
        for name, p in self.lstm.named_parameters():
            if int(name.rsplit("_l", 1)[1]) < keep_layers:
                continue
            if name.startswith("weight"):
                nn.init.uniform_(p, -bound, bound)
            else:
                nn.init.zeros_(p)
                if name.startswith("bias_ih"):  # gates are ordered input, forget, cell, output
                    p[c.n_hidden : 2 * c.n_hidden] = 1.0
        if self.proj is not None and keep_layers < c.n_layer:
            nn.init.normal_(self.proj.weight, 0.0, c.init_std)
            nn.init.zeros_(self.proj.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, cache: LSTMState | None = None) -> torch.Tensor:
        """Hidden states (B, T, n_embd) for token ids ``idx`` (B, T), from a zero state or from ``cache``'s (which
        is then advanced past ``idx``)."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.config.n_ctx:
            raise ValueError(f"sequence of {start + T} tokens exceeds the context of {self.config.n_ctx}")
        x = self.drop_in(self.embed_tokens(idx))
        state = None
        if cache is not None and cache.h is not None and cache.c is not None:
            state = (cache.h, cache.c)
        y, (h, c) = self._recurrent(x, state)
        if cache is not None:
            cache.h, cache.c, cache.pos = h, c, start + T
        y = self.drop_out(y)
        return self.proj(y) if self.proj is not None else y

    def _recurrent(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None):
        """``self.lstm(x, state)`` in :func:`recurrent_dtype`: outside autocast, in fp32, where autocast would
        run it in another precision than the run asked for."""
        device = x.device.type
        if (
            torch.is_autocast_enabled(device)
            and recurrent_dtype(device, torch.get_autocast_dtype(device)) == torch.float32
        ):
            with torch.autocast(device, enabled=False):
                state = None if state is None else (state[0].float(), state[1].float())
                return self.lstm(x.float(), state)
        return self.lstm(x, state)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, ``6N`` (N = non-embedding parameters plus the tied output matrix, as
        :meth:`GPT.flops_per_token` counts it). An LSTM has no attention term: its cost per token does not grow with
        the position, so ``seq_len`` does not enter."""
        return 6.0 * (self.num_params(non_embedding=True) + self.tok_emb.weight.numel())

    def new_cache(self, batch_size: int = 1) -> LSTMState:
        """An empty (zero) recurrent state for incremental decoding of ``batch_size`` rows."""
        return LSTMState(batch_size)
