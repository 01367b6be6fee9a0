"""The ``prepare`` pipeline: raw documents → GPT-1 text pipeline → BPE ids → Arrow shards + manifest.

Passes (all streaming; memory is bounded by a few work chunks, one document and one shard):

1. **scan** every input: size, sha256, usable documents; bad files are reported (skipped, or fatal with
   ``strict``). Document-level validation membership is drawn here from the seed.
2. **words**: each document is cut at line breaks into ~``chunk_bytes`` pieces that a pool of warm worker
   processes turns into pipeline lines (ftfy + standardization → spaCy → lowercase). Results come back in
   order and go to a temporary words file; a seeded reservoir of training lines is kept on the side. Cutting
   at line breaks is exact: ftfy, the standardization and spaCy all work within lines (see ``text.fix``).
3. **learn** the sentencepiece BPE on the reservoir (unless a tokenizer is given).
4. **encode** the words file in order, again in chunks over the pool (workers hand back compact numpy
   arrays), and write the shards of each split.

The output is built in a hidden sibling directory and renamed into place at the very end, so a failed or
interrupted run never leaves a directory that looks complete. For the same inputs and settings the shards are
byte-identical whatever the number of workers.
"""

from __future__ import annotations

import glob
import json
import multiprocessing as mp
import os
import random
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from gptcli import __version__
from gptcli.config import to_dict
from gptcli.errors import DataError, GPT1Error
from gptcli.fsutil import move_into_place
from gptcli.data.shards import FORMAT_VERSION, ShardWriter, sha256_file, token_dtype, write_manifest

SUFFIXES = (".txt", ".jsonl", ".parquet")
WORDS_FILE = "words.tmp"


@dataclass
class PrepareConfig:
    """Settings of ``gpt1 prepare`` (defaults follow the paper where it says something)."""

    inputs: list[str] = field(default_factory=list)
    """Files, directories (searched recursively) and glob patterns of .txt / .jsonl / .parquet."""
    out: Optional[Path] = None
    """Output corpus directory (must not exist unless ``overwrite``)."""
    vocab_size: int = 40478
    """BPE ids learned, newline included, specials excluded (GPT-1: 40,478)."""
    tokenizer: Optional[Path] = None
    """Reuse this tokenizer directory (or a corpus directory's ``tokenizer/``) instead of learning one."""
    cased: bool = False
    """Keep case (GPT-1 lowercases every word)."""
    text_field: str = "text"
    """Field of a .jsonl record / column of a .parquet file holding the document text."""
    strip_gutenberg: bool = False
    """Remove Project Gutenberg headers and licence footers from every document."""
    val_fraction: float = 0.01
    """Fraction of documents held out for validation (at least one document)."""
    seed: int = 0
    """Seeds the validation draw and the BPE training sample."""
    workers: int = 0
    """Worker processes for the text pipeline (0 = all cores)."""
    sample_lines: int = 1_000_000
    """Upper bound on the lines the BPE is learned from (a seeded uniform sample of the training documents)."""
    character_coverage: float = 1.0
    """Share of characters the BPE must cover; rarer ones become <unk> (1.0 = every character seen)."""
    shard_tokens: int = 1 << 26
    """Tokens per shard (a shard is written once it reaches this size)."""
    chunk_bytes: int = 1 << 18
    """Size of one unit of work handed to a worker (documents are cut at line breaks)."""
    strict: bool = False
    """Turn per-file warnings (empty, binary, non-UTF-8, bad lines…) into errors."""
    overwrite: bool = False
    """Replace an existing output directory."""


class Reporter:
    """Progress hooks; the library calls them, the CLI renders them (this base class does nothing)."""

    def stage(self, name: str, total: Optional[int] = None) -> None:
        """A new stage starts; ``total`` is its size in bytes when known."""

    def advance(self, nbytes: int = 0, docs: int = 0, tokens: int = 0) -> None:
        """Work done in the current stage."""

    def warn(self, message: str) -> None:
        """A per-file problem that was skipped."""

    def done(self) -> None:
        """The pipeline finished (successfully or not)."""


@dataclass
class PrepareResult:
    out: Path
    manifest: dict[str, Any]


# ---------------------------------------------------------------------------------------------------------------
# inputs


def resolve_inputs(specs: Iterable[str | Path]) -> list[Path]:
    """Expand files, directories (recursively) and globs into an ordered, de-duplicated file list."""
    files: list[Path] = []

    def add_dir(d: Path) -> int:
        found = sorted(p for p in d.rglob("*") if p.suffix.lower() in SUFFIXES and not p.is_dir())
        files.extend(found)
        return len(found)

    for spec in specs:
        s = str(spec)
        if any(c in s for c in "*?["):
            matches = sorted(glob.glob(os.path.expanduser(s), recursive=True))
            if not matches:
                raise GPT1Error(f"{s}: no files match this pattern")
            n = 0
            for m in map(Path, matches):
                if m.is_dir():
                    n += add_dir(m)
                elif m.suffix.lower() in SUFFIXES:
                    files.append(m)
                    n += 1
            if n == 0:
                raise GPT1Error(f"{s}: matches no .txt, .jsonl or .parquet file")
            continue
        p = Path(os.path.expanduser(s))
        if p.is_dir():
            if add_dir(p) == 0:
                raise GPT1Error(f"{p}: directory holds no .txt, .jsonl or .parquet file")
        elif p.is_file() or p.is_symlink():
            if p.suffix.lower() not in SUFFIXES:
                raise GPT1Error(
                    f"{p}: unsupported file type {p.suffix or '(none)'!r}; expected .txt, .jsonl or .parquet"
                )
            files.append(p)
        else:
            raise GPT1Error(f"{p}: no such file or directory")
    seen: set[Path] = set()
    out = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise GPT1Error("no input files given")
    return out


class _Problems:
    """Per-file problems: warnings (file or lines skipped) or, with ``strict``, errors."""

    def __init__(self, strict: bool, reporter: Reporter) -> None:
        self.strict = strict
        self.reporter = reporter
        self.messages: list[str] = []

    def __call__(self, path: Path, message: str, line: Optional[int] = None) -> None:
        err = DataError(path, message, line)
        if self.strict:
            raise err
        self.messages.append(str(err))
        self.reporter.warn(str(err))


def _looks_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27))
    return len(head) > 0 and controls / len(head) > 0.1


def _utf8_error(data: bytes, e: UnicodeDecodeError) -> tuple[str, int]:
    line = data.count(b"\n", 0, e.start) + 1
    return (
        f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); convert the file to UTF-8 "
        "(e.g. `iconv -f latin1 -t utf-8`) or leave it out",
        line,
    )


def iter_documents(path: Path, cfg: PrepareConfig, problem: Callable[..., None]) -> Iterator[str]:
    """The usable documents of one input file, in order. Problems go to ``problem`` (and skip the file/line)."""
    from gptcli.tokenizers.text import strip_gutenberg

    suffix = path.suffix.lower()
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError as e:
        problem(path, f"cannot read: {e.strerror or e}")
        return
    if size == 0:
        problem(path, "empty file")
        return
    if suffix != ".parquet" and _looks_binary(head):
        problem(path, "looks like a binary file, not text; leave it out of the inputs")
        return

    def finish(text: str, where: Optional[int] = None) -> Optional[str]:
        if cfg.strip_gutenberg:
            text, found = strip_gutenberg(text)
            if not found and suffix == ".txt":
                problem(path, "no Project Gutenberg header found; kept the whole text", where)
        return text if text.strip() else None

    if suffix == ".txt":
        try:
            data = path.read_bytes()
        except OSError as e:
            problem(path, f"cannot read: {e.strerror or e}")
            return
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            problem(path, *_utf8_error(data, e))
            return
        doc = finish(text)
        if doc is None:
            after = " after removing the Gutenberg header" if cfg.strip_gutenberg else ""
            problem(path, f"no text in this file{after}")
            return
        yield doc
    elif suffix == ".jsonl":
        bad: list[tuple[int, str]] = []
        n = 0
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))
                except UnicodeDecodeError as e:
                    bad.append((lineno, _utf8_error(raw, e)[0]))
                    continue
                except json.JSONDecodeError as e:
                    bad.append((lineno, f"not valid JSON ({e.msg})"))
                    continue
                if not isinstance(rec, dict) or cfg.text_field not in rec:
                    keys = ", ".join(map(str, rec)) if isinstance(rec, dict) else type(rec).__name__
                    bad.append((lineno, f"no {cfg.text_field!r} field (found: {keys}); use --text-field"))
                    continue
                value = rec[cfg.text_field]
                if not isinstance(value, str):
                    bad.append((lineno, f"field {cfg.text_field!r} is not a string"))
                    continue
                doc = finish(value, lineno)
                if doc is not None:
                    n += 1
                    yield doc
        if bad:
            line, msg = bad[0]
            more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
            problem(path, f"{msg}; line skipped{more}", line)
        if n == 0 and not bad:
            problem(path, "no documents with text in this file")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            problem(path, f"not a readable Parquet file ({e})")
            return
        names = pf.schema_arrow.names
        if cfg.text_field not in names:
            problem(path, f"no column {cfg.text_field!r} (columns: {', '.join(names)}); use --text-field")
            return
        n = 0
        for batch in pf.iter_batches(columns=[cfg.text_field], batch_size=1024):
            for value in batch.column(0).to_pylist():
                if isinstance(value, str):
                    doc = finish(value)
                    if doc is not None:
                        n += 1
                        yield doc
        if n == 0:
            problem(path, f"no text in column {cfg.text_field!r}")


# ---------------------------------------------------------------------------------------------------------------
# workers


def text_chunks(text: str, size: int) -> Iterator[tuple[str, bool, bool]]:
    """Cut a document after line breaks into pieces of ≥ ``size`` characters (at least one piece).

    Yields ``(piece, html_seen, last)``: ``html_seen`` tells whether a ``<`` occurred earlier in the document,
    the only state ftfy carries from line to line; ``last`` marks the document's final piece.
    """
    start, seen, n = 0, False, len(text)
    if n == 0:
        yield "", False, True
        return
    while start < n:
        end = start + size
        if end < n:
            nl = text.find("\n", end)
            end = n if nl < 0 else nl + 1
        else:
            end = n
        piece = text[start:end]
        yield piece, seen, end == n
        seen = seen or "<" in piece
        start = end


def _warm() -> None:
    from gptcli.tokenizers.text import spacy_tokenizer

    spacy_tokenizer()


def _worker_init() -> None:
    """Workers leave Ctrl-C to the main process, which terminates the pool and removes the partial output."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm()


def _words_task(task: tuple[str, bool, bool]) -> str:
    """Worker: raw text piece → its pipeline lines joined by newlines."""
    from gptcli.tokenizers.text import word_lines

    text, cased, html_seen = task
    return "\n".join(word_lines(text, cased=cased, html_seen=html_seen))


_TOKENIZERS: dict[str, Any] = {}


def _encode_task(task: tuple[str, str]) -> np.ndarray:
    """Worker: pipeline lines → ids (newline ids between lines) with the tokenizer saved at ``model_dir``."""
    model_dir, text = task
    tok = _TOKENIZERS.get(model_dir)
    if tok is None:
        from gptcli.tokenizers import load_tokenizer

        tok = _TOKENIZERS[model_dir] = load_tokenizer(model_dir)
    return tok.encode_lines(text.split("\n"))


def _run_batch(job: tuple[Callable, list]) -> list:
    fn, args = job
    return [fn(a) for a in args]


class _Executor:
    """Ordered map over a pool of warm worker processes, with a bounded number of batches in flight.

    Consecutive small tasks (short .jsonl records, say) travel together in batches of about ``batch_chars``
    characters, so the per-task cost of inter-process messaging stays negligible.
    """

    def __init__(self, workers: int, batch_chars: int) -> None:
        self.workers = workers
        self.batch_chars = batch_chars
        self.pool = None
        _warm()  # loaded before forking, so every worker starts warm
        if workers > 1:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self.pool = ctx.Pool(workers, initializer=_worker_init)

    def map(
        self, fn: Callable, tasks: Iterable[tuple[Any, Any]], size: Callable[[Any], int]
    ) -> Iterator[tuple[Any, Any]]:
        """``(meta, arg)`` tasks → ``(meta, fn(arg))`` in task order; ``meta`` stays in this process."""
        if self.pool is None:
            for meta, arg in tasks:
                yield meta, fn(arg)
            return

        def batches() -> Iterator[tuple[list, list]]:
            metas, args, chars = [], [], 0
            for meta, arg in tasks:
                metas.append(meta)
                args.append(arg)
                chars += size(arg)
                if chars >= self.batch_chars:
                    yield metas, args
                    metas, args, chars = [], [], 0
            if metas:
                yield metas, args

        window = 3 * self.workers
        pending: deque = deque()

        def drain_one() -> Iterator[tuple[Any, Any]]:
            metas, result = pending.popleft()
            yield from zip(metas, result.get())

        for metas, args in batches():
            pending.append((metas, self.pool.apply_async(_run_batch, ((fn, args),))))
            if len(pending) >= window:
                yield from drain_one()
        while pending:
            yield from drain_one()

    def close(self, ok: bool) -> None:
        if self.pool is not None:
            if ok:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
            self.pool = None


# ---------------------------------------------------------------------------------------------------------------
# the pipeline


def _check(cfg: PrepareConfig) -> Path:
    if cfg.out is None:
        raise GPT1Error("no output directory: pass --out DIR")
    if not 0.0 < cfg.val_fraction <= 0.5:
        raise GPT1Error(f"--val-fraction must be in (0, 0.5], got {cfg.val_fraction}")
    if cfg.workers < 0:
        raise GPT1Error(f"--workers must be ≥ 0 (0 = all cores), got {cfg.workers}")
    if cfg.tokenizer is None and cfg.vocab_size < 16:
        raise GPT1Error(f"--vocab-size must be at least 16, got {cfg.vocab_size}")
    if cfg.sample_lines < 1 or cfg.shard_tokens < 1 or cfg.chunk_bytes < 1:
        raise GPT1Error("sample_lines, shard_tokens and chunk_bytes must be positive")
    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise GPT1Error(
            f"{out}: output directory already exists; pass --overwrite to replace it or choose another --out"
        )
    if out.exists() and not out.is_dir():
        raise GPT1Error(f"{out}: exists and is not a directory")
    return out


def _tokenizer_dir(path: Path) -> Path:
    p = Path(path)
    if (p / "tokenizer.json").is_file():
        return p
    if (p / "tokenizer" / "tokenizer.json").is_file():  # a prepared corpus directory
        return p / "tokenizer"
    raise GPT1Error(f"{p}: not a tokenizer directory (no tokenizer.json) nor a prepared corpus")


def prepare(cfg: PrepareConfig, reporter: Optional[Reporter] = None) -> PrepareResult:
    """Run the whole pipeline; returns the output directory and its manifest."""
    rep = reporter or Reporter()
    out = _check(cfg)
    files = resolve_inputs(cfg.inputs)
    workers = cfg.workers or os.cpu_count() or 1

    reused = None
    cased = cfg.cased
    if cfg.tokenizer is not None:
        from gptcli.tokenizers import load_tokenizer
        from gptcli.tokenizers.learned import LearnedBPETokenizer

        reused = load_tokenizer(_tokenizer_dir(cfg.tokenizer))
        if not isinstance(reused, LearnedBPETokenizer):
            raise GPT1Error(
                f"{cfg.tokenizer}: prepare encodes with sentencepiece tokenizers only (this one is {reused.kind!r})"
            )
        cased = reused.cased  # the tokenizer's own setting wins: its vocabulary was learned that way

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    executor = None
    ok = False
    try:
        problems = _Problems(cfg.strict, rep)

        # 1. scan ------------------------------------------------------------------------------------------
        sizes = []
        for f in files:
            try:
                sizes.append(f.stat().st_size)
            except OSError:
                sizes.append(0)
        rep.stage("scan", sum(sizes))
        inputs = []
        for f, size in zip(files, sizes):
            n = sum(1 for _ in iter_documents(f, cfg, problems))
            try:
                digest = sha256_file(f)
            except OSError:
                digest = None
            inputs.append({"path": str(f), "bytes": size, "sha256": digest, "documents": n})
            rep.advance(nbytes=size, docs=n)
        n_docs = sum(i["documents"] for i in inputs)
        if n_docs == 0:
            raise GPT1Error(
                f"no usable documents in {len(files)} input file{'s' if len(files) != 1 else ''}"
                + (" (see the warnings above)" if problems.messages else "")
            )
        if n_docs < 2:
            raise GPT1Error(
                "only one usable document: a validation split needs at least two (split the text into several "
                "files or .jsonl records)"
            )
        n_val = max(1, round(cfg.val_fraction * n_docs))
        val = set(random.Random(cfg.seed).sample(range(n_docs), n_val))

        # 2. words -----------------------------------------------------------------------------------------
        quiet = _Problems(False, Reporter())  # second read: problems were reported by the scan already

        def raw_documents() -> Iterator[str]:
            for f in files:
                yield from iter_documents(f, cfg, quiet)

        def word_tasks() -> Iterator[tuple[tuple[bool, int], tuple[str, bool, bool]]]:
            for doc in raw_documents():
                for piece, seen, last in text_chunks(doc, cfg.chunk_bytes):
                    yield (last, len(piece.encode("utf-8"))), (piece, cased, seen)

        rep.stage("words", sum(sizes))
        executor = _Executor(workers, cfg.chunk_bytes)  # loads spaCy, then forks the warm workers
        words_path = tmp / WORDS_FILE
        doc_spans: list[tuple[int, int]] = []
        doc_text_bytes: list[int] = []
        rng = random.Random(cfg.seed + 1)
        reservoir: list[str] = []
        seen_lines = 0
        learn = reused is None
        with open(words_path, "wb") as wf:
            parts: list[str] = []
            nbytes = 0
            for (last, piece_bytes), result in executor.map(_words_task, word_tasks(), size=lambda a: len(a[0])):
                parts.append(result)
                nbytes += piece_bytes
                if not last:
                    continue
                doc_i = len(doc_spans)
                text = "\n".join(p for p in parts if p)
                data = text.encode("utf-8")
                doc_spans.append((wf.tell(), len(data)))
                doc_text_bytes.append(nbytes)
                wf.write(data)
                if learn and doc_i not in val and text:
                    for line in text.split("\n"):
                        seen_lines += 1
                        if len(reservoir) < cfg.sample_lines:
                            reservoir.append(line)
                        else:
                            j = rng.randrange(seen_lines)
                            if j < cfg.sample_lines:
                                reservoir[j] = line
                rep.advance(nbytes=nbytes, docs=1)
                parts, nbytes = [], 0
        if len(doc_spans) != n_docs:  # the inputs changed between the scan and this pass
            raise GPT1Error(f"inputs changed while preparing ({n_docs} documents scanned, {len(doc_spans)} read)")

        # 3. learn -----------------------------------------------------------------------------------------
        tok_dir = tmp / "tokenizer"
        if learn:
            from gptcli.tokenizers.learned import LearnedBPETokenizer

            rep.stage("learn BPE", None)
            tok = LearnedBPETokenizer.train(
                reservoir,
                vocab_size=cfg.vocab_size,
                cased=cased,
                seed=cfg.seed,
                character_coverage=cfg.character_coverage,
            )
            if tok.vocab_size != cfg.vocab_size:  # sentencepiece enforces this; keep the promise explicit
                raise GPT1Error(f"learned {tok.vocab_size} ids instead of {cfg.vocab_size}")
            sample_info = {"lines": len(reservoir), "of_lines": seen_lines, "bytes": sum(len(x) for x in reservoir)}
            del reservoir
        else:
            tok = reused
            sample_info = None
        tok.save(tok_dir)
        dtype = token_dtype(tok.total_vocab)

        # 4. encode + write --------------------------------------------------------------------------------
        rep.stage("encode", sum(n for _, n in doc_spans))
        writers = {
            "train": ShardWriter(tmp, "train", dtype, cfg.shard_tokens),
            "val": ShardWriter(tmp, "val", dtype, cfg.shard_tokens),
        }
        stats = {s: {"documents": 0, "tokens": 0, "text_bytes": 0} for s in writers}
        model_dir = str(tok_dir)

        def encode_tasks() -> Iterator[tuple[bool, tuple[str, str]]]:
            with open(words_path, "rb") as rf:
                for offset, n in doc_spans:
                    rf.seek(offset)
                    text = rf.read(n).decode("utf-8")
                    for piece, _, last in text_chunks(text, cfg.chunk_bytes):
                        yield last, (model_dir, piece.rstrip("\n"))

        nl = np.array([tok.newline_id], dtype=dtype)
        arrays: list[np.ndarray] = []
        doc_i = 0
        for last, ids in executor.map(_encode_task, encode_tasks(), size=lambda a: len(a[1])):
            if arrays:
                arrays.append(nl)  # the pieces were cut at line breaks
            arrays.append(ids.astype(dtype, copy=False))
            if not last:
                continue
            doc = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            split = "val" if doc_i in val else "train"
            writers[split].add(doc)
            st = stats[split]
            st["documents"] += 1
            st["tokens"] += len(doc)
            st["text_bytes"] += doc_text_bytes[doc_i]
            rep.advance(nbytes=doc_spans[doc_i][1], docs=1, tokens=len(doc))
            arrays = []
            doc_i += 1
        shards = writers["train"].close() + writers["val"].close()
        executor.close(ok=True)
        executor = None
        words_path.unlink()

        for s in stats:
            stats[s]["shards"] = sum(1 for e in shards if e["split"] == s)
        settings = to_dict(cfg)
        settings["cased"] = cased
        settings["workers"] = workers
        manifest = {
            "format_version": FORMAT_VERSION,
            "tool": {"name": "gpt1", "version": __version__},
            "settings": settings,
            "inputs": inputs,
            "tokenizer": {
                "dir": "tokenizer",
                "kind": tok.kind,
                "vocab_size": tok.vocab_size,
                "total_vocab": tok.total_vocab,
                "newline_id": tok.newline_id,
                "learned": learn,
                "source": None if learn else str(cfg.tokenizer),
                "model_sha256": sha256_file(tok_dir / "sentencepiece.model"),
                "sample": sample_info,
            },
            "dtype": dtype.name,
            "splits": stats,
            "shards": shards,
            "warnings": problems.messages,
        }
        write_manifest(tmp, manifest)

        # 5. move into place ----------------------------------------------------------------------------------
        if out.exists():
            if not cfg.overwrite:
                raise GPT1Error(f"{out}: appeared while preparing; pass --overwrite to replace it")
        move_into_place(tmp, out)
        ok = True
        return PrepareResult(out, manifest)
    finally:
        if executor is not None:
            executor.close(ok=False)
        if not ok:
            shutil.rmtree(tmp, ignore_errors=True)
        rep.done()

