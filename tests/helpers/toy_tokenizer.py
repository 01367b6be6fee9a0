"""A tiny deterministic tokenizer for tests: lower-cased whitespace words hashed into a small vocabulary.

It implements the :class:`gptcli.tokenizers.Tokenizer` ABC only (no ftfy/spaCy/BPE), so fine-tuning tests run
before — and independently of — the real tokenizers. Registered under the kind ``toy`` so checkpoints that
carry it load through :func:`gptcli.tokenizers.load_tokenizer`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from pathlib import Path

from gptcli.tokenizers import Tokenizer, register_tokenizer

register_tokenizer("toy", "toy_tokenizer:ToyTokenizer")


class ToyTokenizer(Tokenizer):
    kind = "toy"

    def __init__(self, vocab_size: int = 97) -> None:
        self._v = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._v

    def word_id(self, w: str) -> int:
        # id 0 is left for <unk>/padding, like the original vocabulary.
        return 1 + zlib.crc32(w.lower().encode()) % (self._v - 1)

    def encode(self, text: str) -> list[int]:
        return [self.word_id(w) for w in text.split()]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.id_to_token(i) for i in ids)

    def id_to_token(self, i: int) -> str:
        specials = {self.start_id: "<s>", self.delim_id: "$", self.extract_id: "<e>"}
        return specials.get(i, f"w{i}")

    def token_to_id(self, token: str) -> int | None:
        return {"<s>": self.start_id, "$": self.delim_id, "<e>": self.extract_id}.get(token)

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(json.dumps({"kind": self.kind, "vocab_size": self._v}), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> ToyTokenizer:
        meta = json.loads((Path(directory) / "tokenizer.json").read_text(encoding="utf-8"))
        return cls(int(meta["vocab_size"]))
