"""The GPT-1 network (Radford et al. 2018, §3.1 and the released code), in one readable file.

A 12-layer decoder-only Transformer with *post*-LayerNorm blocks (as the original Transformer, unlike GPT-2),
learned position embeddings, tanh-GELU, no final LayerNorm and an output layer tied to the token embedding.

This module knows nothing about devices, precision, distribution, checkpoints or the CLI: those are applied from
outside (trainer, checkpoint, cli). Fine-tuning heads live in ``heads.py``.

Dropout placement (documented choice): the Hugging Face port drops the *summed* embedding ``h0 = U·We + Wp``;
the released TensorFlow code drops entries of the embedding *matrix* before the lookup. We follow the Hugging
Face placement: it costs one mask per activation instead of one per vocabulary row, behaves identically at eval
time (so parity is exact), and is what the reference's "either is acceptable if documented" allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model.activation import GELU
from gptcli.model.attention import CAUSAL, Attend, SDPAttention
from gptcli.model.dropout import Dropout
from gptcli.model.packed import PackedAttend, Packing
from gptcli.model.tied import TiedEmbeddingLM


@dataclass
class ModelConfig:
    """Shape and regularisation of a GPT-1 model. Defaults are the paper's (116,534,784 parameters)."""

    vocab_size: int = 40478
    """BPE vocabulary size (the original: 40,478)."""
    n_special: int = 0
    """Extra token rows after the vocabulary: 0 when pretraining, 3 (start, delimiter, extract) when fine-tuning."""
    n_ctx: int = 512
    """Context length (rows of the learned position embedding)."""
    n_embd: int = 768
    """Hidden size d."""
    n_layer: int = 12
    """Number of Transformer blocks L."""
    n_head: int = 12
    """Attention heads (head size = n_embd / n_head)."""
    n_inner: int = 3072
    """Hidden size of the position-wise MLP (4·d in the paper)."""
    embd_pdrop: float = 0.1
    """Dropout on the summed token+position embedding."""
    attn_pdrop: float = 0.1
    """Dropout on the attention probabilities."""
    resid_pdrop: float = 0.1
    """Dropout after the attention output projection and after the MLP output projection."""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon."""
    init_std: float = 0.02
    """Standard deviation of the N(0, σ) initialisation of every weight matrix and embedding."""

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def total_vocab(self) -> int:
        """Rows of the token embedding (and columns of the LM logits): vocabulary plus special tokens."""
        return self.vocab_size + self.n_special


PRESETS: dict[str, ModelConfig] = {
    # The paper: 12 x 768 x 12 heads, 3072 FFN, 512 context.
    "gpt1": ModelConfig(),
    # Small enough to pretrain usefully on 2 CPU cores in minutes (use with a small learned vocabulary). Its
    # initialisation is wider than the paper's 0.02: at this width N(0, 0.02) left the model on the unigram plateau
    # at lr 1e-3 (validation loss 6.12 after 300 updates on two books, unigram 6.11), N(0, 0.06) learned at every
    # learning rate tried (docs/presets.md). How to train it: gptcli/train/recipes.py.
    "tiny": ModelConfig(vocab_size=8192, n_ctx=512, n_embd=256, n_layer=4, n_head=4, n_inner=1024, init_std=0.06),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A named preset with any field overridden (``None`` overrides are ignored)."""
    from dataclasses import replace

    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


class KVCache:
    """Keys and values of every layer for incremental decoding, preallocated to ``length`` positions (default: the
    context length; generation passes prompt + new tokens, so a short run does not allocate and zero the whole
    context for every row)."""

    def __init__(
        self, config: ModelConfig, batch_size: int, device=None, dtype=None, length: int | None = None
    ) -> None:
        hd = config.n_embd // config.n_head
        shape = (batch_size, config.n_head, length or config.n_ctx, hd)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.pos = 0  # number of positions already cached

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.size(2)
        self.k[layer][:, :, self.pos : self.pos + t] = k
        self.v[layer][:, :, self.pos : self.pos + t] = v
        end = self.pos + t
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


class CachedAttend:
    """How the layers attend while decoding: new positions against the keys and values of ``cache`` (an attention
    strategy, as :class:`~gptcli.model.attention.CausalAttend`)."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache

    def __call__(
        self, qkv: torch.Tensor, n_head: int, dropout: float, attention: SDPAttention, layer: int
    ) -> torch.Tensor:
        B, T, C3 = qkv.shape
        C = C3 // 3
        q, k, v = (x.view(B, T, n_head, C // n_head).transpose(1, 2) for x in qkv.split(C, dim=2))
        past = self.cache.pos
        k, v = self.cache.update(layer, k, v)
        if past == 0:
            y = attention.causal(q, k, v, dropout)
        elif T == 1:
            # One new token attends to everything cached: no mask needed.
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        else:
            # Several new tokens after a cached prefix: causal mask offset by the prefix length.
            mask = torch.ones(T, past + T, dtype=torch.bool, device=qkv.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return y.transpose(1, 2).contiguous().view(B, T, C)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in that order (as the released code)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.attention = SDPAttention()  # the inner product: a seam the CPU kernels replace (kernels.apply)
        self.attn_pdrop = config.attn_pdrop
        self.resid_drop = Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor, attend: Attend = CAUSAL, layer: int = 0) -> torch.Tensor:
        """The block's attention output. ``attend``: how the positions attend to each other (causally, per packed
        sequence, or against a KV cache), built by the caller."""
        return self.project(self.heads(x, attend, layer))

    def heads(self, x: torch.Tensor, attend: Attend = CAUSAL, layer: int = 0) -> torch.Tensor:
        """The heads' outputs side by side (B, T, C), before the output projection."""
        dropout = self.attn_pdrop if self.training else 0.0
        return attend(self.qkv(x), self.n_head, dropout, self.attention, layer)

    def project(self, y: torch.Tensor) -> torch.Tensor:
        """The output projection (and its dropout) of the heads' outputs ``y``."""
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.n_inner)
        self.act = GELU()
        self.proj = nn.Linear(config.n_inner, config.n_embd)
        self.drop = Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Post-LayerNorm block: ``n = LN(x + attn(x)); h = LN(n + mlp(n))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.mlp = MLP(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, attend: Attend = CAUSAL, layer: int = 0) -> torch.Tensor:
        return self.after_attention(x, self.attn(x, attend, layer))

    def after_attention(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The rest of the block, row-wise: its output from its input ``x`` and the attention's output ``a``."""
        n = self.ln_1(x + a)
        return self.ln_2(n + self.mlp(n))


class GPT(TiedEmbeddingLM):
    """GPT-1: token + learned position embeddings, ``n_layer`` post-LN blocks, tied LM output layer.

    ``forward`` returns the final block's hidden states (B, T, d); ``lm_logits`` maps them to vocabulary logits.
    Keeping the two apart lets fine-tuning heads read hidden states without paying for a 40k-wide projection
    where no LM loss is needed.
    """

    config: ModelConfig

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.total_vocab, config.n_embd)
        self.pos_emb = nn.Embedding(config.n_ctx, config.n_embd)
        self.drop = Dropout(config.embd_pdrop)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # Paper: N(0, 0.02) everywhere, zero biases, unit LayerNorm gains; no GPT-2 residual scaling.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, packing: Packing | None = None) -> torch.Tensor:
        """Hidden states of the last block for token ids ``idx`` (B, T). With ``packing``, ``idx`` is one row of
        sequences end to end (1, N), each with its own positions and attending to itself only."""
        h, attend = self.inputs(idx, cache, packing)
        for i, block in enumerate(self.blocks):
            h = block(h, attend, i)
        if cache is not None:
            cache.pos += idx.size(1)
        return h

    def inputs(
        self, idx: torch.Tensor, cache: KVCache | None = None, packing: Packing | None = None
    ) -> tuple[torch.Tensor, Attend]:
        """What the first block takes for token ids ``idx``: the embedded tokens (B, T, d) and how the positions
        attend to each other (causally, per packed sequence, or against ``cache``)."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if packing is not None:
            if cache is not None or B != 1 or packing.tokens != T:
                raise ValueError(f"a packed row is (1, {packing.tokens}) ids without a cache, got {tuple(idx.shape)}")
            if packing.span > self.config.n_ctx:
                raise ValueError(f"sequence of {packing.span} tokens exceeds the context of {self.config.n_ctx}")
            pos = packing.positions
            attend: Attend = PackedAttend(packing)
        else:
            if start + T > self.config.n_ctx:
                raise ValueError(f"sequence of {start + T} tokens exceeds the context of {self.config.n_ctx}")
            pos = torch.arange(start, start + T, device=idx.device)
            attend = CAUSAL if cache is None else CachedAttend(cache)
        return self.drop(self.embed_tokens(idx) + self.pos_emb(pos)), attend

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, ``6N + 12·L·d·T`` (N = non-embedding parameters; PaLM appendix B).

        Embedding lookups cost no matmul FLOPs but the tied output projection does, so the token embedding is
        counted back in; position embeddings are not.
        """
        c = self.config
        t = seq_len or c.n_ctx
        n = self.num_params(non_embedding=True) + self.tok_emb.weight.numel()
        return 6.0 * n + 12.0 * c.n_layer * c.n_embd * t
