"""Test helpers: small prepared corpora written directly with ``shards.write_shard`` (no `gpt1 prepare` needed).

A corpus here has the real on-disk format (manifest.json with per-shard sha256, tokenizer/, Arrow shards); its
tokenizer is a byte-level one registered under the kind ``test-bytes`` so checkpoints that embed it load again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from gptcli.data.shards import shard_name, token_dtype, write_shard
from gptcli.tokenizers.base import Tokenizer, register_tokenizer


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids (vocabulary 256): enough to train and evaluate tiny language models in tests."""

    kind = "test-bytes"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def id_to_token(self, i: int) -> str:
        return chr(i) if i < 256 else ("<s>", "$", "<e>")[i - 256]

    def token_to_id(self, token: str) -> int | None:
        return ord(token) if len(token) == 1 and ord(token) < 256 else None

    def save(self, directory) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(json.dumps({"kind": self.kind}), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> ByteTokenizer:
        return cls()


register_tokenizer(ByteTokenizer.kind, f"{__name__}:ByteTokenizer")


def write_corpus(
    directory: Path,
    splits: dict[str, Sequence[Sequence[np.ndarray]]],
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write ``{split: [shard = [doc ids, ...], ...]}`` as a prepared corpus directory; returns it."""
    tok = tokenizer or ByteTokenizer()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(d / "tokenizer")
    dtype = token_dtype(tok.total_vocab)
    entries = []
    for split, shards in splits.items():
        for i, docs in enumerate(shards):
            entry = write_shard(d / shard_name(split, i), docs, dtype)
            entries.append({**entry, "split": split})
    manifest = {"format": 1, "vocab_size": tok.vocab_size, "tokenizer": {"kind": tok.kind}, "shards": entries}
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return d


def random_corpus(
    directory: Path, train_tokens: Sequence[int] = (3000, 2000), val_tokens: int = 600, seed: int = 0
) -> Path:
    """Random byte ids in a few shards (for sampler/resume/error tests where learning is irrelevant)."""
    rng = np.random.default_rng(seed)
    train = [[rng.integers(0, 256, n // 2), rng.integers(0, 256, n - n // 2)] for n in train_tokens]
    val = [[rng.integers(0, 256, val_tokens)]]
    return write_corpus(directory, {"train": train, "val": val})


def text_corpus(directory: Path, texts: Sequence[str], val_fraction: float = 0.1) -> Path:
    """Byte-tokenised texts (e.g. a few books): each text is one document; the last ``val_fraction`` of every
    text's bytes goes to the validation split."""
    tok = ByteTokenizer()
    train, val = [], []
    for t in texts:
        ids = np.array(tok.encode(t), dtype=np.int64)
        cut = int(len(ids) * (1 - val_fraction))
        train.append(ids[:cut])
        val.append(ids[cut:])
    return write_corpus(directory, {"train": [train], "val": [val]}, tok)
