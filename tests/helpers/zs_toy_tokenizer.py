"""Test doubles for the zero-shot tests: a toy tokenizer and a stub language model (:class:`BagLM`).

The tokenizer: whole words from a small list, everything else byte by byte.

Ids 0…255 are bytes; ids 256… are the listed words (lowercased, split on whitespace and punctuation). A word
missing from the list is several tokens (one per UTF-8 byte), which is how the tests exercise multi-token words
such as ``positive`` under a learned vocabulary. Deterministic and dependency-free; registered as kind ``zs-toy``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from gptcli.tokenizers.base import SPECIAL_TOKENS, Tokenizer, register_tokenizer

_SPLIT = re.compile(r"\w+|[^\w\s]")


class ToyTokenizer(Tokenizer):
    kind = "zs-toy"

    def __init__(self, words: Sequence[str] = ()) -> None:
        self.words = list(dict.fromkeys(w.lower() for w in words))
        self._ids = {w: 256 + i for i, w in enumerate(self.words)}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.words)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for w in _SPLIT.findall(text.lower()):
            if w in self._ids:
                out.append(self._ids[w])
            else:
                out.extend(w.encode("utf-8"))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.id_to_token(i) for i in ids)

    def id_to_token(self, i: int) -> str:
        if i < 256:
            return bytes([i]).decode("latin-1")
        if i < self.vocab_size:
            return self.words[i - 256]
        return SPECIAL_TOKENS[i - self.vocab_size]

    def token_to_id(self, token: str) -> int | None:
        if token in self._ids:
            return self._ids[token]
        if len(token.encode("utf-8")) == 1:
            return token.encode("utf-8")[0]
        return None

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(json.dumps({"kind": self.kind, "words": self.words}), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> ToyTokenizer:
        return cls(json.loads((Path(directory) / "tokenizer.json").read_text(encoding="utf-8"))["words"])


register_tokenizer(ToyTokenizer.kind, f"{__name__}:ToyTokenizer")


# --- a stub language model whose log-probabilities are known in advance ------------------------------------------

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gptcli.model.gpt import ModelConfig  # noqa: E402


class BagLM(nn.Module):
    """Logits at position t = the sum of rows ``W[x_0] + … + W[x_t]`` (a causal bag of words).

    So log p(next | prefix) = log_softmax(Σ W[prefix]) can be computed by hand (:meth:`reference`). It speaks the
    GPT interface the scorer uses (``config.n_ctx``, ``forward(idx, cache)``, ``lm_logits``) and honours the
    :class:`gptcli.model.gpt.KVCache` protocol (the one-hot rows are what it caches), so every scoring path runs.
    """

    def __init__(self, weight: torch.Tensor, n_ctx: int = 64) -> None:
        super().__init__()
        v = weight.shape[0]
        self.config = ModelConfig(vocab_size=v, n_ctx=n_ctx, n_embd=v, n_layer=1, n_head=1, n_inner=4)
        self.weight = nn.Parameter(weight.clone().float())
        self.forward_rows = 0  # rows seen by forward, to check prefix sharing

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        assert start + T <= self.config.n_ctx, "context overflow"
        self.forward_rows += B
        oh = F.one_hot(idx, self.config.vocab_size).float()
        if cache is None:
            return oh.cumsum(1)
        k, _ = cache.update(0, oh[:, None], oh[:, None])
        cache.pos += T
        return k[:, 0].cumsum(1)[:, -T:]

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight

    def reference(self, context, continuation) -> tuple[float, int]:
        """Sum and count of continuation log-probs, by hand: no batching, no truncation."""
        seq = list(context) + list(continuation)
        total, n = 0.0, 0
        for j in range(max(len(context), 1), len(seq)):
            logits = self.weight.detach()[seq[:j]].sum(0).double()
            total += float(torch.log_softmax(logits, -1)[seq[j]])
            n += 1
        return total, n
