"""The learned BPE tokenizer: GPT-1's text pipeline in front of a sentencepiece BPE model.

Pipeline (reference §1): ftfy + the released standardization → spaCy words → lowercase (unless ``cased``) →
BPE. The BPE sees each line as words joined by single spaces; with ``treat_whitespace_as_suffix`` every word
ends in ``▁``, the analogue of the original ``</w>`` marker, and no piece spans two words.

Id layout, mirroring the original vocabulary (``<unk>`` = 0 … ``\\n</w>`` = 40,477):

- ``0 … n_pieces-1``: the sentencepiece pieces (``<unk>`` = 0; no BOS/EOS/PAD pieces);
- ``n_pieces`` (= ``vocab_size - 1``): the newline token. Sentencepiece works on lines, so newlines never reach
  it; the released pipeline keeps them as words, so we give them one id of their own;
- ``vocab_size``, ``+1``, ``+2``: the fine-tuning tokens start, delimiter, extract (from the ABC).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import read_bytes_inside
from gptcli.tokenizers.base import SPECIAL_TOKENS, Tokenizer

MODEL_FILE = "sentencepiece.model"
MODEL_LIMIT = 1 << 30
"""The largest sentencepiece model read (far above any real vocabulary's): a description naming a huge file is
refused."""
DESCRIPTION_LIMIT = 1 << 24
NEWLINE = "\n"
# Sentencepiece's BPE trainer gives (slightly) different merges for different thread counts; pinning the
# count makes the vocabulary depend on the data and the seed only, never on --workers or the machine.
TRAIN_THREADS = 4
# Sentencepiece drops (silently) training sentences longer than this; callers cut lines at word boundaries
# below it (see ``training_pieces``), and a single "word" longer than this is junk we can afford to skip.
MAX_SENTENCE_BYTES = 1 << 16
TRAIN_CHUNK_BYTES = 4096


# How sentencepiece learns GPT-1's BPE (see the module docstring): words split at spaces and ending in "▁", the
# text taken as given (the pipeline already normalised it), no BOS/EOS/PAD pieces, every line of the sample used.
TRAINER_SETTINGS: dict[str, Any] = dict(
    model_type="bpe",
    treat_whitespace_as_suffix=True,
    split_by_whitespace=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=True,  # with suffix mode: the last word of a line also ends in "▁"
    unk_id=0,
    bos_id=-1,
    eos_id=-1,
    pad_id=-1,
    unk_surface="\u2047",
    max_sentence_length=MAX_SENTENCE_BYTES,
    input_sentence_size=0,  # the caller already sampled; use every line given
    shuffle_input_sentence=False,
    num_threads=TRAIN_THREADS,
    minloglevel=2,
)


def _training_error(e: RuntimeError, vocab_size: int) -> GPT1Error:
    """Sentencepiece's trainer error, as one line that says what to change."""
    msg = str(e).split("]")[-1].strip() or str(e)
    if "Vocabulary size" in msg:
        limit = re.search(r"<= (\d+)", msg)
        most = f" (at most {int(limit.group(1)) + 1} here)" if limit else ""
        return GPT1Error(
            f"cannot learn {vocab_size} BPE ids from this text{most}; lower --vocab-size or give more text"
        )
    return GPT1Error(f"sentencepiece could not learn a vocabulary: {msg}")


def training_pieces(line: str, limit: int = TRAIN_CHUNK_BYTES) -> list[str]:
    """Cut a long line at spaces into pieces of at most ~``limit`` bytes.

    Lossless for BPE learning: with ``split_by_whitespace`` no merge crosses a space, so word counts (what BPE
    learns from) are unchanged, and no line is silently dropped by sentencepiece's length limit.
    """
    if len(line) * 4 <= limit or len(line.encode("utf-8")) <= limit:
        return [line]
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for w in line.split(" "):
        n = len(w.encode("utf-8")) + 1
        if cur and size + n > limit:
            out.append(" ".join(cur))
            cur, size = [], 0
        cur.append(w)
        size += n
    if cur:
        out.append(" ".join(cur))
    return out


class LearnedBPETokenizer(Tokenizer):
    """GPT-1's pipeline with a sentencepiece BPE vocabulary learned on the user's corpus."""

    kind: ClassVar[str] = "sentencepiece"

    def __init__(self, model_proto: bytes, cased: bool = False) -> None:
        import sentencepiece as spm

        self._proto = bytes(model_proto)
        self.cased = cased
        self.sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self.n_pieces = self.sp.get_piece_size()
        self.newline_id = self.n_pieces
        self._unk = self.sp.unk_id()

    # -- learning ---------------------------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        lines: Iterable[str],
        vocab_size: int = 40478,
        cased: bool = False,
        seed: int = 0,
        character_coverage: float = 1.0,
    ) -> LearnedBPETokenizer:
        """Learn a BPE vocabulary of exactly ``vocab_size`` ids (newline included) from pipeline lines.

        ``lines`` must already be in the form :func:`gptcli.tokenizers.text.word_lines` produces (lowercased unless
        ``cased``); long lines are cut at word boundaries so none is dropped.
        """
        import sentencepiece as spm

        if vocab_size < 16:
            raise GPT1Error(f"--vocab-size {vocab_size} is too small (at least 16)")

        def sentences():
            for line in lines:
                yield from training_pieces(line)

        spm.set_random_generator_seed(seed)
        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=sentences(),
                model_writer=buf,
                vocab_size=vocab_size - 1,  # the last id is the newline token
                character_coverage=character_coverage,
                **TRAINER_SETTINGS,
            )
        except RuntimeError as e:
            raise _training_error(e, vocab_size) from None
        return cls(buf.getvalue(), cased=cased)

    # -- the ABC ----------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.n_pieces + 1

    def lines(self, text: str) -> list[str]:
        """Raw text → pipeline lines (what the BPE sees)."""
        from gptcli.tokenizers.text import word_lines

        return word_lines(text, cased=self.cased)

    def encode_lines(self, lines: Sequence[str], num_threads: int = 1) -> np.ndarray:
        """Pipeline lines → ids as one array, a newline id between consecutive lines (none at the end).

        One sentencepiece thread by default: ``prepare`` parallelises over processes, and sentencepiece's own
        default (every core, in every process) would oversubscribe the CPU.
        """
        dtype = np.uint16 if self.total_vocab <= 1 << 16 else np.uint32
        if not lines:
            return np.zeros(0, dtype=dtype)
        encoded = self.sp.encode(list(lines), num_threads=num_threads)
        nl = self.newline_id
        total = sum(len(e) for e in encoded) + len(encoded) - 1
        out = np.empty(total, dtype=dtype)
        pos = 0
        for i, ids in enumerate(encoded):
            if i:
                out[pos] = nl
                pos += 1
            n = len(ids)
            out[pos : pos + n] = ids
            pos += n
        return out

    def encode(self, text: str) -> list[int]:
        return self.encode_lines(self.lines(text)).tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode_lines(self.lines(t)).tolist() for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids → text: words separated by spaces (spaCy's split, e.g. ``do n't``), newline ids as line breaks."""
        parts: list[str] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                parts.append(self.sp.decode(run))
                run.clear()

        for i in ids:
            i = int(i)
            if i < self.n_pieces:
                run.append(i)
                continue
            flush()
            if i == self.newline_id:
                parts.append("\n")
            elif self.vocab_size <= i < self.total_vocab:
                parts.append(SPECIAL_TOKENS[i - self.vocab_size])
            else:
                raise ValueError(f"token id {i} out of range (total vocabulary {self.total_vocab})")
        flush()
        out = ""
        for p in parts:
            if p == "\n":
                out += "\n"
            elif p:
                out += (" " if out and not out.endswith("\n") else "") + p.strip(" ")
        return out

    def id_to_token(self, i: int) -> str:
        if 0 <= i < self.n_pieces:
            return self.sp.id_to_piece(i)
        if i == self.newline_id:
            return NEWLINE
        if self.vocab_size <= i < self.total_vocab:
            return SPECIAL_TOKENS[i - self.vocab_size]
        raise IndexError(f"token id {i} out of range (total vocabulary {self.total_vocab})")

    def token_to_id(self, token: str) -> int | None:
        if token == NEWLINE:
            return self.newline_id
        if token in SPECIAL_TOKENS:
            return self.vocab_size + SPECIAL_TOKENS.index(token)
        i = self.sp.piece_to_id(token)
        if i == self._unk and token != self.sp.id_to_piece(self._unk):
            return None
        return i

    # -- persistence ------------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / MODEL_FILE).write_bytes(self._proto)
        meta = {
            "kind": self.kind,
            "model_file": MODEL_FILE,
            "vocab_size": self.vocab_size,
            "total_vocab": self.total_vocab,
            "newline_id": self.newline_id,
            "special_tokens": dict(zip(SPECIAL_TOKENS, (self.start_id, self.delim_id, self.extract_id))),
            "cased": self.cased,
            "pipeline": "ftfy.fix_text + released text_standardize + spacy.blank('en') words"
            + ("" if self.cased else " + lowercase")
            + " + sentencepiece BPE (whitespace as suffix)",
        }
        (d / "tokenizer.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> LearnedBPETokenizer:
        d = Path(directory)
        try:
            meta = json.loads(read_bytes_inside(d, "tokenizer.json", DESCRIPTION_LIMIT, "tokenizer description"))
            # Only a regular file inside the directory, of a bounded size: never /dev/zero, a FIFO or ../../x.
            proto = read_bytes_inside(d, meta.get("model_file", MODEL_FILE), MODEL_LIMIT, "sentencepiece model")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise GPT1Error(f"{d}: unreadable sentencepiece tokenizer ({e})") from None
        try:
            tok = cls(proto, cased=bool(meta.get("cased", False)))
        except RuntimeError as e:  # sentencepiece's parser rejects a truncated or damaged model file
            raise GPT1Error(
                f"{d / meta.get('model_file', MODEL_FILE)}: damaged sentencepiece model "
                f"({str(e).splitlines()[0] if str(e) else 'does not parse'}; restore the tokenizer directory)"
            ) from None
        if "vocab_size" in meta and meta["vocab_size"] != tok.vocab_size:
            raise GPT1Error(f"{d}: tokenizer.json says vocab_size {meta['vocab_size']}, model has {tok.vocab_size}")
        return tok
