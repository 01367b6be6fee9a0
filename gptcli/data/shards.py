"""Token shards on disk: Arrow IPC files of token ids with document boundaries, and the corpus that lists them.

A shard is an uncompressed Arrow IPC *file* holding one record batch with a single column ``tokens`` of type
``large_list<uint16>`` (``uint32`` once the vocabulary no longer fits 16 bits): one row per document. Because the
file is uncompressed and has one batch, memory-mapping it gives the flat token array and the document offsets
as zero-copy numpy views — what the pretraining sampler reads. Those views are :class:`ShardTokens`, which check
the file still holds them before each read: a mapped file cut short by another program would otherwise end the
process with a bare "Bus error".

A corpus directory holds ``manifest.json``, ``tokenizer/`` and the shards named ``{split}-{index:05d}.arrow``.
The format is documented in ``docs/formats.md``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import inside, regular_file_problem, sha256_file, write_text_atomic

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every id (specials included)."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.arrow"


MANIFEST_DIGEST = "manifest_sha256"
# Every top-level key a manifest has; another one can only be damage (a flipped byte in a key such as the digest's).
MANIFEST_KEYS = frozenset(
    {
        "dtype",
        "format_version",
        "inputs",
        "settings",
        "shards",
        "splits",
        "tokenizer",
        "tool",
        "warnings",
        "vocab_size",
        MANIFEST_DIGEST,
    }
)


def _manifest_digest(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_manifest(directory: str | Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` (sorted keys, stable formatting) atomically: readers see all of it or none. It carries
    the sha256 of its own content (``manifest_sha256``), so a changed count or setting is caught like a changed
    shard."""
    manifest = {**manifest, MANIFEST_DIGEST: _manifest_digest(manifest)}
    text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return write_text_atomic(Path(directory) / MANIFEST, text)


def _manifest_damage(manifest: Any) -> str | None:
    """Why a parsed manifest cannot be trusted, or None (manifests written before the digest are only shape-checked)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        return "manifest lists no shards"
    # Manifests gpt1 prepared (they name their tool and format) hold known keys only; a renamed key is damage that
    # could otherwise hide the digest itself. Hand-made minimal manifests are not held to that.
    prepared = any(k in manifest for k in ("tool", "format_version", MANIFEST_DIGEST))
    unknown = sorted(set(manifest) - MANIFEST_KEYS) if prepared else []
    if unknown:
        return f"unexpected key {unknown[0]!r} (the file is damaged)"
    digest = manifest.get(MANIFEST_DIGEST)
    if digest is not None and digest != _manifest_digest(manifest):
        return "checksum mismatch (the manifest changed since `gpt1 prepare` wrote it)"
    if not all(isinstance(s, dict) and {"file", "split", "sha256"} <= set(s) for s in manifest["shards"]):
        return "malformed shard entry"
    return None


class ShardWriter:
    """Accumulates the documents of one split and writes a shard whenever ``shard_tokens`` is reached.

    Memory is bounded by one shard's worth of tokens (a single document longer than that gets a shard of its
    own). ``entries`` lists what was written, in the manifest's shard format.
    """

    def __init__(self, directory: str | Path, split: str, dtype: np.dtype, shard_tokens: int = 1 << 26) -> None:
        self.dir = Path(directory)
        self.split = split
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.entries: list[dict[str, Any]] = []
        self._docs: list[np.ndarray] = []
        self._tokens = 0

    def add(self, document: np.ndarray) -> None:
        self._docs.append(np.asarray(document, dtype=self.dtype))
        self._tokens += len(document)
        if self._tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._docs:
            return
        path = self.dir / shard_name(self.split, len(self.entries))
        entry = write_shard(path, self._docs, self.dtype)
        self.entries.append({"split": self.split, **entry})
        self._docs, self._tokens = [], 0

    def close(self) -> list[dict[str, Any]]:
        self.flush()
        return self.entries


def write_shard(path: Path, documents: Iterable[np.ndarray], dtype: np.dtype) -> dict[str, Any]:
    """Write documents (arrays of ids) as one shard; returns ``{file, documents, tokens, sha256}``."""
    docs = [np.asarray(d, dtype=dtype) for d in documents]
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(docs) if docs else np.zeros(0, dtype=dtype)
    values = pa.array(flat, type=pa.from_numpy_dtype(dtype))
    column = pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), values)
    batch = pa.record_batch([column], names=["tokens"])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return {"file": path.name, "documents": len(docs), "tokens": int(offsets[-1]), "sha256": sha256_file(path)}


class _Mapping:
    """A shard file mapped into memory, and the size it had then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:  # mmap keeps its own descriptor of the file
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = len(self.map)

    def check(self) -> None:
        """Raise a one-line GPT1Error when the file is now shorter than its mapping: reading past its end would
        be SIGBUS, which no Python code can catch. One fstat of the mapped file (``mmap.size``)."""
        now = self.map.size()
        if now < self.size:
            raise GPT1Error(
                f"shard {self.path} shrank from {self.size} to {now} bytes while in use (it was changed by another "
                "program; re-run prepare or restore it)"
            )


class ShardTokens(np.ndarray):
    """A zero-copy view of a mapped shard that checks the file is still whole (:meth:`_Mapping.check`) at every
    index or slice, before anything is read. Slices are plain arrays: every caller reads them at once, and ufunc
    results are not tied to the file."""

    _mapping: _Mapping | None = None

    @classmethod
    def of(cls, array: np.ndarray, mapping: _Mapping) -> ShardTokens:
        out = array.view(cls)
        out._mapping = mapping
        return out

    def __array_finalize__(self, obj: Any) -> None:
        self._mapping = getattr(obj, "_mapping", None)

    def __getitem__(self, key: Any) -> Any:
        if self._mapping is not None:
            self._mapping.check()
        item = super().__getitem__(key)
        return item.view(np.ndarray) if isinstance(item, np.ndarray) else item

    def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
        return array[()] if return_scalar else array


@dataclass
class Shard:
    """A memory-mapped shard: ``tokens`` (flat ids) and ``offsets`` (document d is tokens[offsets[d]:offsets[d+1]])."""

    path: Path
    tokens: np.ndarray
    offsets: np.ndarray
    _keepalive: Any = field(default=None, repr=False)

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def max_id(self, chunk: int = 1 << 24) -> int:
        """The largest id (-1 when empty), read in slices so that each is checked (:class:`ShardTokens`)."""
        return max((int(self.tokens[i : i + chunk].max()) for i in range(0, len(self.tokens), chunk)), default=-1)


def read_shard(path: str | Path) -> Shard:
    """Memory-map a shard; the returned arrays are zero-copy :class:`ShardTokens` views into the file."""
    p = Path(path)
    try:
        mapping = _Mapping(p)
        table = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapping.map))).read_all()
    except (OSError, ValueError, pa.ArrowInvalid) as e:  # ValueError: mmap of an empty file
        raise GPT1Error(f"{p}: not a readable token shard ({e})") from None
    if table.column_names != ["tokens"] or table.column(0).num_chunks > 1:
        raise GPT1Error(f"{p}: unexpected shard layout (expected one batch with a 'tokens' list column)")
    value_type = getattr(table.schema.field("tokens").type, "value_type", None)
    if value_type not in (pa.uint16(), pa.uint32()):
        # Ids are unsigned by format: a signed or float column could hold -1 or 2.5, which no max() check catches.
        raise GPT1Error(
            f"{p}: holds token ids of type {value_type or table.schema.field('tokens').type}, not uint16 or uint32 "
            "(the shard was not written by `gpt1 prepare`: prepare the corpus again)"
        )
    chunk = table.column(0).chunk(0) if table.num_rows else None
    if chunk is None:
        return Shard(p, np.zeros(0, dtype=np.uint16), np.zeros(1, dtype=np.int64), mapping)
    tokens = chunk.values.to_numpy(zero_copy_only=True)
    offsets = chunk.offsets.to_numpy(zero_copy_only=True)
    if offsets[0] != 0:  # a sliced array would break the zero-copy contract
        tokens = tokens[offsets[0] :]
        offsets = offsets - offsets[0]
    return Shard(p, ShardTokens.of(tokens, mapping), ShardTokens.of(offsets, mapping), (mapping, table))


class Corpus:
    """A prepared corpus directory: manifest, tokenizer and memory-mapped shards per split."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        mpath = self.dir / MANIFEST
        if self.dir.exists() and not self.dir.is_dir():
            raise GPT1Error(
                f"{self.dir}: a file, not a corpus directory (give the directory `gpt1 prepare` wrote, or "
                "prepare this file first: gpt1 prepare FILE --out DIR)"
            )
        if not self.dir.is_dir():
            raise GPT1Error(f"{self.dir}: corpus directory not found (create one with `gpt1 prepare`)")
        if not mpath.is_file():
            raise GPT1Error(f"{self.dir}: not a prepared corpus (no {MANIFEST}; create one with `gpt1 prepare`)")
        try:
            self.manifest: dict[str, Any] = json.loads(mpath.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise GPT1Error(f"{mpath}: corrupt manifest ({e}; prepare the corpus again)") from None
        damage = _manifest_damage(self.manifest)
        if damage is not None:
            raise GPT1Error(f"{mpath}: {damage} (prepare the corpus again)")
        # Every path first, as for a checkpoint's checksum table: a manifest names shards inside its corpus only
        # (never ../../elsewhere, /an/absolute/path or a link out, which would be hashed and trained on).
        outside = [e["file"] for e in self.manifest["shards"] if inside(self.dir, e["file"]) is None]
        if outside:
            raise GPT1Error(
                f"{mpath}: lists shard {outside[0]!r}, which is not a file inside the corpus (prepare the corpus again)"
            )

    @cached_property
    def tokenizer(self):
        from gptcli.tokenizers import load_tokenizer

        return load_tokenizer(self.dir / "tokenizer")

    def shard_entries(self, split: str) -> list[dict[str, Any]]:
        return [s for s in self.manifest["shards"] if s.get("split") == split]

    @property
    def splits(self) -> list[str]:
        return sorted({s["split"] for s in self.manifest["shards"]})

    def shards(self, split: str) -> list[Shard]:
        """Memory-mapped shards of ``split`` in manifest order, mapped once per corpus: every reader of a split
        (the token-id check, the sampler, the evaluation) reads the same mapping, which :class:`ShardTokens`
        guards."""
        cache = self.__dict__.setdefault("_shards", {})
        if split not in cache:
            cache[split] = self._map(split)
        return list(cache[split])

    def _map(self, split: str) -> list[Shard]:
        entries = self.shard_entries(split)
        if not entries:
            raise GPT1Error(f"{self.dir}: corpus has no {split!r} split (splits: {', '.join(self.splits) or 'none'})")
        out = []
        for e in entries:
            path = self.dir / e["file"]
            problem = regular_file_problem(path)
            if problem == "missing":
                raise GPT1Error(f"{path}: shard listed in the manifest is missing")
            if problem is not None:
                raise GPT1Error(f"{path}: shard listed in the manifest is {problem} (prepare the corpus again)")
            out.append(read_shard(path))
        return out

    def arrays(self, split: str) -> list[np.ndarray]:
        """The flat token arrays of ``split``, one per shard (zero-copy)."""
        return [s.tokens for s in self.shards(split)]

    def num_tokens(self, split: str) -> int:
        return sum(int(e["tokens"]) for e in self.shard_entries(split))

    def num_documents(self, split: str) -> int:
        return sum(int(e["documents"]) for e in self.shard_entries(split))

    def documents(self, split: str) -> Iterable[np.ndarray]:
        """Every document of ``split`` in order, as zero-copy views."""
        for shard in self.shards(split):
            for i in range(shard.num_documents):
                yield shard.document(i)

    def summary(self) -> CorpusSummary:
        """What the manifest says about this corpus (splits, tokenizer, inputs), for display."""
        return summarize(self.manifest)

    def tokenizer_fingerprint(self) -> str | None:
        """What identifies this corpus's tokenizer (see :func:`tokenizer_fingerprint`)."""
        return tokenizer_fingerprint(self.dir / "tokenizer")

    def fingerprint(self) -> str:
        """sha256 over the manifest's shard list (split, file, checksum) in order: two corpora with the same
        fingerprint hold the same token ids in the same shards, wherever they are."""
        rows = [[e.get("split"), e.get("file"), e.get("sha256")] for e in self.manifest["shards"]]
        return hashlib.sha256(json.dumps(rows).encode("utf-8")).hexdigest()

    def max_token_ids(self, split: str) -> list[tuple[Path, int]]:
        """(shard, its largest id; -1 when empty) for every shard of ``split``: vectorised maxima over the
        memory-mapped shards (a read of the split, far cheaper than its sha256), computed once per corpus."""
        cache = self.__dict__.setdefault("_max_ids", {})
        if split not in cache:
            cache[split] = [(s.path, s.max_id()) for s in self.shards(split)]
        return cache[split]

    def check_token_ids(self, split: str, limit: int) -> None:
        """Raise a one-line GPT1Error if a shard of ``split`` holds an id ≥ ``limit`` (the model's vocabulary): a
        damaged shard loaded with --no-verify, or one written with another tokenizer, would otherwise surface as
        an IndexError deep inside the model."""
        for path, top in self.max_token_ids(split):
            if top >= limit:
                raise GPT1Error(
                    f"{path}: holds token id {top}, outside the vocabulary of {limit} ids "
                    "(the shard is damaged or was written with another tokenizer: check it with `gpt1 inspect`, "
                    "or prepare the corpus again)"
                )

    def verify(self) -> list[str]:
        """Check every shard's sha256, and the tokenizer's (its model's sha256, its fingerprint), against the manifest;
        returns the problems found (empty = all good). A flipped byte in the tokenizer model can still parse as another
        vocabulary."""
        problems = []
        tok = self.manifest.get("tokenizer", {})
        tok_dir = self.dir / str(tok.get("dir", "tokenizer"))
        model = tok_dir / "sentencepiece.model"
        if tok.get("model_sha256") and model.is_file() and sha256_file(model) != tok["model_sha256"]:
            problems.append(
                f"{model}: checksum mismatch; the tokenizer changed since `gpt1 prepare` wrote it: re-run prepare"
            )
        elif tok.get("fingerprint") and tokenizer_fingerprint(tok_dir) not in (None, tok["fingerprint"]):
            problems.append(
                f"{tok_dir}: not the tokenizer `gpt1 prepare` encoded this corpus with (its fingerprint "
                "changed): re-run prepare"
            )
        for e in self.manifest["shards"]:
            path = self.dir / e["file"]
            problem = regular_file_problem(path)
            if problem is not None:
                problems.append(f"{path}: {problem}")
            elif sha256_file(path) != e["sha256"]:
                problems.append(
                    f"{path}: checksum mismatch (expected sha256 {e['sha256'][:12]}…); "
                    "the shard changed since `gpt1 prepare` wrote it: re-run prepare"
                )
        return problems

    def check_intact(self) -> None:
        """Refuse a corpus that :meth:`verify` finds a problem in, with one line naming the first."""
        problems = self.verify()
        if problems:
            raise GPT1Error(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


@dataclass
class SplitSummary:
    """One split of a corpus, as ``gpt1 prepare`` and ``gpt1 inspect`` report it."""

    name: str
    documents: int
    tokens: int
    shards: int
    text_bytes: int | None
    """Bytes of input text the split's documents came from (None when the manifest does not say)."""


@dataclass
class CorpusSummary:
    """The facts of a manifest worth showing, so that no caller reads the manifest's layout itself."""

    splits: list[SplitSummary]
    dtype: str
    format_version: Any
    vocab_size: int | None
    learned: bool
    tokenizer_source: str | None
    inputs: int
    input_bytes: int
    tool_version: str
    seed: Any
    workers: Any
    warnings: int


def summarize(manifest: dict[str, Any]) -> CorpusSummary:
    """A manifest (from ``manifest.json`` or ``PrepareResult.manifest``) → :class:`CorpusSummary`."""
    shards = manifest.get("shards", [])
    stats = manifest.get("splits", {})
    splits = []
    for name in sorted(set(stats) | {e["split"] for e in shards}):
        entries = [e for e in shards if e.get("split") == name]
        splits.append(
            SplitSummary(
                name,
                sum(int(e["documents"]) for e in entries),
                sum(int(e["tokens"]) for e in entries),
                len(entries),
                stats.get(name, {}).get("text_bytes"),
            )
        )
    tok, settings, inputs = manifest.get("tokenizer", {}), manifest.get("settings", {}), manifest.get("inputs", [])
    return CorpusSummary(
        splits=splits,
        dtype=manifest.get("dtype", "?"),
        format_version=manifest.get("format_version", "?"),
        vocab_size=tok.get("vocab_size"),
        learned=bool(tok.get("learned")),
        tokenizer_source=tok.get("source"),
        inputs=len(inputs),
        input_bytes=sum(i.get("bytes", 0) for i in inputs),
        tool_version=manifest.get("tool", {}).get("version", "?"),
        seed=settings.get("seed", "?"),
        workers=settings.get("workers", "?"),
        warnings=len(manifest.get("warnings", [])),
    )


# tokenizer.json keys that describe a tokenizer in words and do not change a single id.
_DESCRIPTIVE_KEYS = ("pipeline",)


def tokenizer_fingerprint(directory: str | Path) -> str | None:
    """sha256 identifying a saved tokenizer by what it does: the settings in its ``tokenizer.json`` (less the
    free-text description) and the content of its other files (for a learned tokenizer, the manifest's
    ``model_sha256`` file; for OpenAI's BPE, its tokens and merges whatever the files' key order). Two tokenizers of
    the same vocabulary size but learned from different text differ here. None when ``directory`` holds no
    tokenizer.

    Tokenizers are written by their ``save`` alone, so a corpus's tokenizer and the copy inside every checkpoint
    trained on it have the same fingerprint."""
    d = Path(directory)
    meta_path = d / "tokenizer.json"
    if not meta_path.is_file():
        return None
    try:
        meta: Any = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        meta = sha256_file(meta_path)  # unreadable here, and load_tokenizer will say so: compare the bytes
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if k not in _DESCRIPTIVE_KEYS}
    files = _openai_bpe(d) if isinstance(meta, dict) and meta.get("kind") == "openai" else None
    if files is None:
        files = {
            p.relative_to(d).as_posix(): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file() and p != meta_path
        }
    return hashlib.sha256(json.dumps({"meta": meta, "files": files}, sort_keys=True).encode("utf-8")).hexdigest()


def _openai_bpe(d: Path) -> dict[str, str] | None:
    """An OpenAI BPE directory's files by content (:func:`gptcli.tokenizers.openai.bpe_digest`): the same vocabulary
    written in another key order (the released file, Hugging Face's) is the same tokenizer. None when the files do
    not parse (damage): their bytes are compared instead, and loading the tokenizer will say what is wrong."""
    from gptcli.tokenizers.openai import bpe_digest

    try:
        return {"bpe": bpe_digest(d)}
    except (GPT1Error, ValueError):  # DataError, and bytes that are not UTF-8
        return None


def open_corpus(directory: str | Path) -> Corpus:
    """Open a directory written by ``gpt1 prepare``."""
    return Corpus(directory)
