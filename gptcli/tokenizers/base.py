"""The ``Tokenizer`` interface and the on-disk dispatch between implementations.

A saved tokenizer is a directory holding ``tokenizer.json`` with at least ``{"kind": ...}`` plus whatever
files the implementation needs; :func:`load_tokenizer` reads the kind and hands the directory to that class.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import read_bytes_inside

# Fine-tuning tokens, in the order they are appended after the vocabulary (reference §1).
SPECIAL_TOKENS: tuple[str, str, str] = ("<s>", "$", "<e>")

# kind -> "module:Class"; implementations register lazily so loading one never imports the other's deps.
_KINDS: dict[str, str] = {
    "sentencepiece": "gptcli.tokenizers.learned:LearnedBPETokenizer",
    "openai": "gptcli.tokenizers.openai:OpenAIBPETokenizer",
}


def register_tokenizer(kind: str, target: str) -> None:
    """Register an implementation as ``"module:Class"`` under ``kind``."""
    _KINDS[kind] = target


class Tokenizer(ABC):
    """Text ↔ token ids. ``vocab_size`` excludes the three special tokens, which sit at
    ``vocab_size``, ``vocab_size + 1`` and ``vocab_size + 2`` (start, delimiter, extract)."""

    kind: ClassVar[str]
    n_special: ClassVar[int] = len(SPECIAL_TOKENS)

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of BPE ids (0 … vocab_size-1), special tokens excluded."""

    @property
    def start_id(self) -> int:
        return self.vocab_size

    @property
    def delim_id(self) -> int:
        return self.vocab_size + 1

    @property
    def extract_id(self) -> int:
        return self.vocab_size + 2

    @property
    def total_vocab(self) -> int:
        return self.vocab_size + self.n_special

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Raw text → ids through the full pipeline (clean, spaCy, lowercase unless cased, BPE)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Several texts at once; implementations may parallelise."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Ids → readable text. Special ids render as ``<s>``, ``$``, ``<e>``."""

    @abstractmethod
    def id_to_token(self, i: int) -> str:
        """The vocabulary entry for one id (specials included)."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, or None."""

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Write the tokenizer (``tokenizer.json`` with its kind, plus its own files) into ``directory``."""

    @classmethod
    @abstractmethod
    def load(cls, directory: Path) -> Tokenizer:
        """Read a tokenizer written by :meth:`save`."""


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Open a saved tokenizer directory, whatever its kind."""
    d = Path(directory)
    meta_path = d / "tokenizer.json"
    if not meta_path.exists():
        raise GPT1Error(f"{d}: not a tokenizer directory (no tokenizer.json)")
    try:
        meta = json.loads(read_bytes_inside(d, "tokenizer.json", 1 << 24, "tokenizer description"))
        kind = meta["kind"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        # Binary junk (a pickle, a truncated write) is as unreadable as bad JSON; it is never unpickled.
        raise GPT1Error(
            f"{meta_path}: unreadable tokenizer description (expected JSON with a 'kind'; "
            f"restore the tokenizer directory)"
        ) from None
    if not isinstance(kind, str) or kind not in _KINDS:
        raise GPT1Error(f"{meta_path}: unknown tokenizer kind {kind!r} (known: {', '.join(_KINDS)})")
    module, cls_name = _KINDS[kind].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    return cls.load(d)
