"""The encoded-example cache: a task's examples, once tokenized and laid out, kept for the next run.

Why: tokenizing is the slow part of starting a fine-tuning run on a big task (the ``openai`` tokenizer runs ftfy,
spaCy and BPE), so :func:`encode_cached` encodes a split once and a later run with the same inputs reads the
ids. Entries live in ``$GPT1_CACHE`` (else ``~/.cache/gpt1/encoded``) and are never evicted; ``--no-cache`` skips it.

The key holds everything that decides the ids, so a changed input is a miss, never a stale hit: the examples' texts
and answers (standing for the data files and every setting that picks them), the task's name, kind, answer count,
truncation rule and ``n_ctx``, the tokenizer's fingerprint, the versions of ftfy, spaCy and sentencepiece, and the
source of the modules that tokenize and lay out. Labels, uids and extras come from the examples just read.

An entry (``<key>.arrow`` plus its ``<key>.json`` sidecar, docs/formats.md) is written atomically and checked
against its sha256 on open: a damaged entry is a one-line warning and is rebuilt, never used; a cache that cannot be
written is a warning too.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import tempfile
import uuid
import weakref
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from gptcli.data.shards import tokenizer_fingerprint
from gptcli.data.transforms import Encoded, encode_examples, truncation_rule
from gptcli.files.fsutil import sha256_file, write_text_atomic
from gptcli.files.locks import output_lock
from gptcli.progress import SILENT, Progress
from gptcli.tasks.base import Example, Task
from gptcli.tokenizers.base import Tokenizer

FORMAT = 1
ENV = "GPT1_CACHE"
_SOURCES = ("tokenizers/text.py", "tokenizers/openai.py", "tokenizers/learned.py", "data/transforms.py")
_LIBRARIES = ("ftfy", "spacy", "sentencepiece")
_fingerprints: weakref.WeakKeyDictionary[Tokenizer, str | None] = weakref.WeakKeyDictionary()


def default_root() -> Path:
    """``$GPT1_CACHE``, else ``~/.cache/gpt1/encoded``."""
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt1" / "encoded"


def tokenizer_id(tokenizer: Tokenizer) -> str | None:
    """The tokenizer's fingerprint, from what its ``save`` writes (so an in-memory tokenizer and its saved copy
    agree); None when it cannot be saved (then nothing is cached). Computed once per tokenizer object."""
    try:
        return _fingerprints[tokenizer]
    except (KeyError, TypeError):
        pass
    try:
        with tempfile.TemporaryDirectory(prefix="gpt1-tok-") as d:
            tokenizer.save(d)
            fp = tokenizer_fingerprint(d)
    except (AttributeError, NotImplementedError, OSError):
        fp = None
    try:
        _fingerprints[tokenizer] = fp
    except TypeError:  # not weak-referenceable: recomputed next time
        pass
    return fp


@functools.lru_cache(maxsize=1)  # the same for the whole process: read the sources once
def _code_and_libraries() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    pkg = Path(__file__).resolve().parents[1]
    out = {
        name: hashlib.sha256((pkg / name).read_bytes()).hexdigest()[:16] for name in _SOURCES if (pkg / name).is_file()
    }
    for lib in _LIBRARIES:
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = "-"
    return out


def examples_sha256(examples: Sequence[Example]) -> str:
    """sha256 of every example's texts and answers, in order, each length-prefixed (boundaries are hashed too)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(len(ex.texts).to_bytes(4, "little") + len(ex.choices).to_bytes(4, "little"))
        for t in (*ex.texts, *ex.choices):
            b = t.encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def cache_key(
    task: Task, examples: Sequence[Example], tokenizer: Tokenizer, n_ctx: int
) -> tuple[str, dict[str, Any]] | None:
    """(entry name, what it was made from), or None when the tokenizer has no fingerprint."""
    fp = tokenizer_id(tokenizer)
    if fp is None:
        return None
    parts = {
        "format": FORMAT,
        "task": task.name,
        "kind": task.kind,
        "n_choices": getattr(task, "n_choices", 0),
        "truncation": truncation_rule(task),
        "n_ctx": n_ctx,
        "tokenizer": fp,
        "examples": examples_sha256(examples),
        "n_examples": len(examples),
        "code": dict(_code_and_libraries()),
    }
    name = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]
    return name, parts


# --------------------------------------------------------------------------------------------- the entry files


def write_entry(root: Path, name: str, parts: dict[str, Any], seqs: Sequence[list[list[int]]]) -> Path:
    """Write ``<name>.arrow`` (atomically) then its sidecar ``<name>.json`` with the file's sha256."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    root.mkdir(parents=True, exist_ok=True)
    inner_len = np.fromiter((len(s) for ex in seqs for s in ex), dtype=np.int64)
    outer = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum([len(ex) for ex in seqs], out=outer[1:])
    inner = np.zeros(len(inner_len) + 1, dtype=np.int64)
    np.cumsum(inner_len, out=inner[1:])
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(seqs)), dtype=np.int32, count=int(inner[-1]))
    values = pa.LargeListArray.from_arrays(pa.array(inner), pa.array(flat))
    column = pa.ListArray.from_arrays(pa.array(outer), values)
    table = pa.table({"seqs": column})
    path = root / f"{name}.arrow"
    tmp = root / f".{name}.arrow.tmp-{uuid.uuid4().hex[:8]}"
    # The cache is shared: writers take turns (a short wait), and the one writing removes what a killed writer left.
    with output_lock(root, wait=True, tidy=False):
        remove_stale_temporaries(root)
        try:
            with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        meta = {**parts, "sha256": sha256_file(path), "n_seqs": len(inner_len), "n_tokens": int(inner[-1])}
        write_text_atomic(root / f"{name}.json", json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return path


def remove_stale_temporaries(root: Path) -> list[str]:
    """Remove the ``.NAME.tmp-…`` files a writer killed mid-write left in the cache (call with its lock held: every
    writer holds it while its temporary exists). Returns their names."""
    gone = []
    for p in root.iterdir():
        if p.name.startswith(".") and ".tmp-" in p.name and p.is_file():
            p.unlink(missing_ok=True)
            gone.append(p.name)
    return gone


def read_entry(root: Path, name: str, n_examples: int) -> list[list[list[int]]] | None | str:
    """The cached sequences of every example; None when there is no entry; a reason (str) when the entry exists
    but cannot be trusted (its sidecar is missing or unreadable, its checksum or shape does not match)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    path, side = root / f"{name}.arrow", root / f"{name}.json"
    if not path.exists() and not side.exists():
        return None
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
        expected = meta["sha256"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return "its checksum file is missing or unreadable"
    try:
        # Read once, then hash and parse those bytes: not memory-mapped (a file cut short by another process would
        # be SIGBUS), and the bytes parsed are the bytes checked. The ids become Python lists anyway.
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != expected:
            return "checksum mismatch"
        column = ipc.open_file(pa.py_buffer(data)).read_all().column("seqs").combine_chunks()
        outer = column.offsets.to_numpy()
        values = column.values
        inner = values.offsets.to_numpy()
        flat = values.values.to_numpy().tolist()
    except (OSError, pa.ArrowException, KeyError) as e:
        return f"unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    if len(outer) != n_examples + 1 or meta.get("n_tokens") != len(flat):
        return "it holds another number of examples or tokens than its checksum file says"
    return _nest(flat, inner.tolist(), outer.tolist())


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a warm start builds its many small objects (lists of ids, Encoded
    records; none can form a cycle): otherwise it walks the growing heap again and again (the gain:
    benchmarks/finetune_encode.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # They live as long as the run: moved to the permanent generation, later collections skip them instead of
        # paying the deferred walk at the first batch (refcounting still frees them).
        gc.freeze()
        if enabled:
            gc.enable()


def _nest(flat: list[int], bounds: list[int], starts: list[int]) -> list[list[list[int]]]:
    """Cut the flat ids into sequences and the sequences into examples (slices made by C-level ``map``)."""
    with _gc_paused():
        seqs = list(map(flat.__getitem__, map(slice, bounds[:-1], bounds[1:])))
        return list(map(seqs.__getitem__, map(slice, starts[:-1], starts[1:])))


# --------------------------------------------------------------------------------------------- the entry point


def encode_cached(
    task: Task,
    examples: Sequence[Example],
    tokenizer: Tokenizer,
    n_ctx: int,
    *,
    cache: bool = True,
    workers: int = 0,
    root: str | Path | None = None,
    progress: Progress | None = None,
    what: str = "examples",
) -> list[Encoded]:
    """:func:`gptcli.data.transforms.encode_examples` through the cache (see the module docstring): the same
    :class:`Encoded` list, ids byte-identical, read from the cache when an intact entry for exactly these inputs
    exists, else encoded over ``workers`` processes (0 = all cores) and stored. ``what`` names the examples in
    warnings (``"rte train"``)."""
    report = progress or SILENT
    key = cache_key(task, examples, tokenizer, n_ctx) if cache and examples else None
    if key is None:
        return encode_examples(task, examples, tokenizer, n_ctx, workers)
    base = Path(root) if root is not None else default_root()
    name, parts = key
    found = read_entry(base, name, len(examples))
    if isinstance(found, list):
        with _gc_paused():
            return [Encoded(s, ex.label, i, ex.uid, dict(ex.extra)) for i, (s, ex) in enumerate(zip(found, examples))]
    if isinstance(found, str):
        report.note(
            f"encoding cache entry {base / name}.arrow for {what} is damaged ({found}): encoding again", level="warn"
        )
    enc = encode_examples(task, examples, tokenizer, n_ctx, workers)
    try:
        write_entry(base, name, parts, [e.seqs for e in enc])
    except OSError as e:
        report.note(
            f"cannot write the encoding cache in {base} ({e.strerror or e}): set {ENV} to a writable "
            "folder, or pass --no-cache",
            level="warn",
        )
    return enc
