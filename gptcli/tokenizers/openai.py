"""The original GPT-1 tokenizer (openai/finetune-transformer-lm ``text_utils.TextEncoder``), reproduced exactly.

Pipeline: ``ftfy.fix_text`` → the released ``text_standardize`` → spaCy's English rule tokenizer → lowercase →
BPE with an end-of-word marker ``</w>`` on the last symbol → ids, unknown symbols → 0 (``<unk>``). The three
fine-tuning tokens sit after the 40,478 BPE ids (start 40478, delimiter 40479, extract 40480).

Faithfulness details are kept on purpose, because each one changes ids on real text: BPE symbols are joined with
spaces and split again on ``' '`` as the released code does (a spaCy token holding whitespace yields the same
pieces and ``0``s); spaCy's newline token ``"\\n "`` becomes ``'\\n</w>'`` (id 40477) as in the released code;
backslashes are not split off (see :mod:`gptcli.tokenizers.text`).

A word → ids cache (the released code caches word → BPE string; we cache the final ids) merges each distinct word
once, leaving ftfy and spaCy as the main costs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from gptcli.errors import DataError, GPT1Error
from gptcli.tokenizers.base import SPECIAL_TOKENS, Tokenizer

EOW = "</w>"
NEWLINE_TOKEN = "\n" + EOW
"""The released vocabulary's newline token (id 40,477): what spaCy's newline token becomes (see the docstring)."""
MERGES_HEADER = "#version: 0.2"
# (vocabulary file, merges file) pairs we recognise, in order of preference.
FILE_NAMES: tuple[tuple[str, str], ...] = (
    ("vocab.json", "merges.txt"),  # Hugging Face and our saved tokenizers
    ("encoder_bpe_40000.json", "vocab_40000.bpe"),  # the original release
)
_CACHE_LIMIT = 1_000_000  # distinct words kept before the cache is reset (bounds memory on huge corpora)


def find_bpe_files(directory: str | Path) -> tuple[Path, Path]:
    """The (vocabulary, merges) files in ``directory`` under either the Hugging Face or the original names."""
    d = Path(directory)
    for vocab, merges in FILE_NAMES:
        if (d / vocab).is_file() and (d / merges).is_file():
            return d / vocab, d / merges
    names = " or ".join(f"{v} + {m}" for v, m in FILE_NAMES)
    raise GPT1Error(f"{d}: no OpenAI BPE files found (expected {names})")


def read_vocab(path: Path) -> dict[str, int]:
    """A token → id JSON map (``encoder_bpe_40000.json`` / ``vocab.json``)."""
    try:
        vocab = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(path, f"invalid JSON ({e.msg})", e.lineno) from None
    except OSError as e:
        raise GPT1Error(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise DataError(path, "expected a JSON object mapping tokens to integer ids")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise DataError(path, "token ids must be exactly 0 … n-1")
    return vocab


def read_merges(path: Path) -> list[tuple[str, str]]:
    """BPE merges, one ``a b`` pair per line after the ``#version`` header, in priority order."""
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except OSError as e:
        raise GPT1Error(f"{path}: cannot read ({e.strerror})") from None
    merges: list[tuple[str, str]] = []
    for lineno, line in enumerate(lines, start=1):
        if lineno == 1 and line.startswith("#version"):
            continue
        if not line:
            continue
        parts = tuple(line.split())
        if len(parts) != 2:
            raise DataError(path, f"expected two symbols separated by a space, got {line!r}", lineno)
        merges.append(parts)  # type: ignore[arg-type]
    return merges


def bpe_digest(directory: str | Path) -> str:
    """sha256 of the BPE saved in ``directory`` by what it is: its tokens in id order and its merges in rank order.
    The released files, Hugging Face's ``vocab.json`` (keys sorted by name) and :meth:`OpenAIBPETokenizer.save`
    (keys in the order they were read) differ byte for byte and agree here."""
    vocab_path, merges_path = find_bpe_files(directory)
    vocab = read_vocab(vocab_path)
    body = {"tokens": sorted(vocab, key=vocab.__getitem__), "merges": [list(m) for m in read_merges(merges_path)]}
    return hashlib.sha256(json.dumps(body, ensure_ascii=False).encode("utf-8")).hexdigest()


def _pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class OpenAIBPETokenizer(Tokenizer):
    """The released GPT-1 BPE (40,478 ids) behind the :class:`Tokenizer` interface."""

    kind: ClassVar[str] = "openai"
    cased: ClassVar[bool] = False
    """The released pipeline lowercases every word; its vocabulary has no upper-case letters."""

    def __init__(self, encoder: dict[str, int], merges: Sequence[tuple[str, str]]) -> None:
        self.encoder = dict(encoder)
        self.decoder = {i: t for t, i in self.encoder.items()}
        self.merges = [tuple(m) for m in merges]
        self.bpe_ranks = {m: r for r, m in enumerate(self.merges)}
        self._cache: dict[str, tuple[int, ...]] = {}

    # ----------------------------------------------------------------------------------------- construction
    @classmethod
    def from_files(cls, vocab_path: str | Path, merges_path: str | Path) -> OpenAIBPETokenizer:
        """Build from a vocabulary JSON and a merges file (original or Hugging Face names)."""
        return cls(read_vocab(Path(vocab_path)), read_merges(Path(merges_path)))

    @classmethod
    def from_dir(cls, directory: str | Path) -> OpenAIBPETokenizer:
        """Build from a directory holding ``vocab.json`` + ``merges.txt`` or the original
        ``encoder_bpe_40000.json`` + ``vocab_40000.bpe``."""
        return cls.from_files(*find_bpe_files(directory))

    # ----------------------------------------------------------------------------------------------- BPE
    def bpe(self, token: str) -> str:
        """The released BPE of one lowercased spaCy token: space-separated symbols, ``</w>`` on the last."""
        if len(token) < 2:
            return token + EOW  # no pair to merge (the released code's early return)
        word = tuple(token[:-1]) + (token[-1] + EOW,)
        ranks = self.bpe_ranks
        while len(word) > 1:
            # The lowest-ranked pair present; merge every non-overlapping occurrence left to right.
            best = min(_pairs(word), key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            first, second = best
            merged: list[str] = []
            i = 0
            n = len(word)
            while i < n:
                if i < n - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        out = " ".join(word)
        if out == "\n  </w>":  # spaCy's newline token "\n " (see the module docstring)
            out = "\n</w>"
        return out

    def word_ids(self, token: str) -> tuple[int, ...]:
        """Ids of one spaCy token (lowercased here), cached."""
        ids = self._cache.get(token)
        if ids is None:
            get = self.encoder.get
            ids = tuple(get(piece, 0) for piece in self.bpe(token.lower()).split(" "))
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[token] = ids
        return ids

    # ------------------------------------------------------------------------------------- the interface
    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    @property
    def newline_id(self) -> int:
        """The id ``encode`` gives a line break: ``\\n</w>`` (40,477), or ``<unk>`` in a vocabulary without it."""
        return self.encoder.get(NEWLINE_TOKEN, 0)

    def encode_lines(self, lines: Sequence[str]) -> np.ndarray:
        """Pipeline lines (:func:`gptcli.tokenizers.text.word_lines`: words joined by single spaces) → ids as one
        array, :attr:`newline_id` between consecutive lines (none at the end), as ``LearnedBPETokenizer.encode_lines``.

        Each word is encoded as ``encode`` encodes a spaCy token (:meth:`word_ids`), so
        ``encode_lines(word_lines(text)) == encode(text)``: the standardization leaves no whitespace but single spaces
        and `` \\n `` line breaks, so spaCy's only whitespace tokens are the newline tokens that ``encode`` gives
        :attr:`newline_id` and ``word_lines`` turns into line ends (checked on real corpora: docs/prepare.md)."""
        dtype = np.uint16 if self.total_vocab <= 1 << 16 else np.uint32
        out: list[int] = []
        word_ids, nl = self.word_ids, self.newline_id
        for i, line in enumerate(lines):
            if i:
                out.append(nl)
            for w in line.split(" "):
                if w:
                    out.extend(word_ids(w))
        return np.array(out, dtype=dtype)

    def encode(self, text: str) -> list[int]:
        from gptcli.tokenizers.text import clean, words

        out: list[int] = []
        for w in words(clean(text)):
            out.extend(self.word_ids(w))
        return out

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        from gptcli.tokenizers.text import clean, spacy_tokenizer

        result = []
        for doc in spacy_tokenizer().pipe(clean(t) for t in texts):
            ids: list[int] = []
            for tok in doc:
                ids.extend(self.word_ids(tok.text))
            result.append(ids)
        return result

    def id_to_token(self, i: int) -> str:
        i = int(i)
        if 0 <= i < self.vocab_size:
            return self.decoder[i]
        if self.vocab_size <= i < self.total_vocab:
            return SPECIAL_TOKENS[i - self.vocab_size]
        raise IndexError(f"token id {i} outside 0…{self.total_vocab - 1}")

    def token_to_id(self, token: str) -> int | None:
        i = self.encoder.get(token)
        if i is None and token in SPECIAL_TOKENS:
            return self.vocab_size + SPECIAL_TOKENS.index(token)
        return i

    def piece(self, i: int) -> str:
        """Surface text of one id for streaming: ``</w>`` becomes a trailing space; specials render bracketed."""
        i = int(i)
        if i >= self.vocab_size:
            return self.id_to_token(i) + " "
        tok = self.decoder[i]
        return tok[: -len(EOW)] + " " if tok.endswith(EOW) else tok

    def decode(self, ids: Iterable[int]) -> str:
        # As Hugging Face's port decodes: join the pieces, end-of-word markers become spaces.
        return "".join(self.piece(i) for i in ids).strip(" ")

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        meta = {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "special_tokens": list(SPECIAL_TOKENS),
            "vocab": "vocab.json",
            "merges": "merges.txt",
        }
        (d / "tokenizer.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        self.save_bpe_files(d)

    def save_bpe_files(self, directory: str | Path) -> None:
        """Write ``vocab.json`` + ``merges.txt`` (the Hugging Face names; same content as the original files)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "vocab.json").write_text(json.dumps(self.encoder, ensure_ascii=False), encoding="utf-8")
        lines = [MERGES_HEADER] + [f"{a} {b}" for a, b in self.merges]
        (d / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> OpenAIBPETokenizer:
        return cls.from_dir(directory)
