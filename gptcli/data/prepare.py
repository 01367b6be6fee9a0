"""The ``prepare`` pipeline: raw documents → GPT-1 text pipeline → BPE ids → Arrow shards + manifest.

GPT-1 (§4.1 "Setup") cleans BooksCorpus with ftfy, standardizes punctuation and whitespace, splits words with
spaCy and learns a 40,000-merge BPE; this module does the same for any text, streaming. :func:`prepare` reads
top to bottom as its stages (memory is bounded by a few work chunks, one document, the BPE sample and one shard):

1. **plan**: check the settings, expand the inputs, check ``out`` (:func:`gptcli.outputs.check_output`: only
   a corpus gpt1 prepared may be replaced, never one holding or inside an input), load a reused tokenizer.
2. **scan** every input: size, sha256, usable documents; bad files are reported (skipped, or fatal with
   ``strict``). Document-level validation membership is drawn here from the seed; a corpus of a single
   document is instead cut in two at a line break (:func:`tail_cut`): its training head and its validation tail.
3. **words**: each document is cut at line breaks into ~``chunk_bytes`` pieces that a pool of warm worker
   processes turns into pipeline lines (ftfy + standardization → spaCy → lowercase). Results come back in
   order and go to a temporary words file; a seeded reservoir of training lines is kept on the side. Cutting
   at line breaks is exact: ftfy, the standardization and spaCy all work within lines (see ``text.fix``).
4. **learn** the sentencepiece BPE on the reservoir (unless a tokenizer is given).
5. **encode** the words file in order, again in chunks over the pool (workers hand back compact numpy
   arrays), and write the shards of each split.
6. **manifest**, then **move into place**: the output is built in a hidden sibling directory, marked as a corpus
   and renamed into place at the very end, so a failed or interrupted run never leaves a directory that looks
   complete, and an old corpus it replaces survives until then.

For the same inputs and settings the shards are byte-identical whatever the number of workers. Progress goes
through :class:`gptcli.progress.Progress`: one stage per pass with its size in bytes, per-file problems as
warnings.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import random
import re
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Optional

import numpy as np

from gptcli import __version__
from gptcli.config import to_dict
from gptcli.data.inputs import NAMED_SUFFIXES, SUFFIXES, TEXT_SUFFIXES, input_root, resolve_inputs  # noqa: F401
from gptcli.data.shards import FORMAT_VERSION, ShardWriter, token_dtype, write_manifest
from gptcli.errors import DataError, GPT1Error
from gptcli.fsutil import move_into_place, regular_file_problem, sha256_file, temp_sibling
from gptcli.locks import output_lock
from gptcli.outputs import check_output, mark
from gptcli.progress import SILENT, Progress, staged

SplitBy = Literal["file", "paragraph", "line", "wikitext"]
WORDS_FILE = "words.tmp"


@dataclass
class PrepareConfig:
    """Settings of ``gpt1 prepare`` (defaults follow the paper where it says something)."""

    inputs: list[str] = field(default_factory=list)
    """Text files (.txt: one document each, or as --split-by cuts it; .jsonl / .parquet: one per record / row;
    .raw / .tokens named directly: text, as WikiText's files), directories (searched recursively for .txt, .jsonl
    and .parquet) or glob patterns."""
    out: Optional[Path] = Path("corpus")
    """Output corpus directory (must not exist unless ``overwrite``; never one of the inputs, nor around them).
    The default, ``./corpus``, is where `gpt1 pretrain` looks when given no --data."""
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
    split_by: SplitBy = "file"
    """How a text file becomes documents: file = the whole file is one (a book); paragraph = each run of lines
    between blank lines; line = each non-blank line; wikitext = each WikiText article (a ' = Title = ' line and
    what follows it up to the next; ' = = Section = = ' lines stay inside). .jsonl / .parquet are not cut."""
    val_fraction: float = 0.01
    """Fraction of documents held out for validation (at least one document). A corpus of a single document
    holds out its last ~val_fraction of characters instead, cut at a paragraph break (else a line break)."""
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
    """Replace an existing corpus in ``out`` (only a corpus gpt1 prepared; any other directory is refused)."""


@dataclass
class PrepareResult:
    out: Path
    manifest: dict[str, Any]


# ---------------------------------------------------------------------------------------------------------------
# inputs


class _Problems:
    """Per-file problems: warnings (file or lines skipped) or, with ``strict``, errors."""

    def __init__(self, strict: bool, report: Progress) -> None:
        self.strict = strict
        self.report = report
        self.messages: list[str] = []

    def __call__(self, path: Path, message: str, line: Optional[int] = None) -> None:
        err = DataError(path, message, line)
        if self.strict:
            raise err
        self.messages.append(str(err))
        self.report.note(str(err), level="warn")


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


Problem = Callable[..., None]


def iter_documents(path: Path, cfg: PrepareConfig, problem: Problem) -> Iterator[str]:
    """The usable documents of one input file, in order. Problems go to ``problem`` (and skip the file/line)."""
    suffix = path.suffix.lower()
    if not _looks_usable(path, suffix, problem):
        return
    if suffix in TEXT_SUFFIXES:
        yield from _txt_documents(path, cfg, problem)
    elif suffix == ".jsonl":
        yield from _jsonl_documents(path, cfg, problem)
    elif suffix == ".parquet":
        yield from _parquet_documents(path, cfg, problem)


def _looks_usable(path: Path, suffix: str, problem: Problem) -> bool:
    """A regular file, readable, not empty and (unless Parquet) not binary: the checks every input goes through
    first (a file swapped for a FIFO after the inputs were expanded is still never opened)."""
    special = regular_file_problem(path)
    if special is not None and special != "missing":
        problem(path, f"skipped: {special}; only regular files are read")
        return False
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError as e:
        problem(path, f"cannot read: {e.strerror or e}")
        return False
    if size == 0:
        problem(path, "empty file")
        return False
    if suffix != ".parquet" and _looks_binary(head):
        problem(path, "looks like a binary file, not text; leave it out of the inputs")
        return False
    return True


def _finish(text: str, cfg: PrepareConfig, no_header: Optional[Callable[[], None]] = None) -> Optional[str]:
    """A document as stored: Gutenberg boilerplate removed if asked (``no_header`` is told when there was none),
    None when no text is left."""
    if cfg.strip_gutenberg:
        from gptcli.tokenizers.text import strip_gutenberg

        text, found = strip_gutenberg(text)
        if not found and no_header is not None:
            no_header()
    return text if text.strip() else None


def _txt_documents(path: Path, cfg: PrepareConfig, problem: Problem) -> Iterator[str]:
    """A .txt file is one document (one book per file, as in BooksCorpus), or the pieces ``split_by`` cuts it in
    (after the Gutenberg boilerplate is removed from the whole file)."""
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
    doc = _finish(text, cfg, lambda: problem(path, "no Project Gutenberg header found; kept the whole text"))
    if doc is None:
        after = " after removing the Gutenberg header" if cfg.strip_gutenberg else ""
        problem(path, f"no text in this file{after}")
        return
    yield from split_text(doc, cfg.split_by)


_BLANK_LINE = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")  # a line break and the blank lines after it
_LINE_BREAK = re.compile(r"\n")
# A WikiText article's title line: " = Title = ". Section headings (" = = Section = = ", deeper ones with more
# "= ") start with "= =" and stay inside their article.
_WIKI_TITLE = re.compile(r"[ \t]*= (?!=).*(?<!=) =[ \t\r]*")


def split_text(text: str, split_by: str) -> Iterator[str]:
    """The documents of one text as ``split_by`` cuts it (see :attr:`PrepareConfig.split_by`); pieces holding no
    text are dropped. Every cut is at a line break, where the text pipeline's output does not depend on it."""
    if split_by == "file":
        pieces: Iterable[str] = [text]
    elif split_by == "paragraph":
        pieces = _BLANK_LINE.split(text)
    elif split_by == "line":
        pieces = text.split("\n")
    elif split_by == "wikitext":
        pieces = _wikitext_articles(text)
    else:
        raise GPT1Error(f"--split-by {split_by!r} is unknown (choose file, paragraph, line or wikitext)")
    for piece in pieces:
        if piece.strip():
            yield piece


def _wikitext_articles(text: str) -> Iterator[str]:
    """WikiText articles: each title line with the lines up to the next title (text before the first title, if
    any, is a document of its own)."""
    lines = text.split("\n")
    start = 0
    for i, line in enumerate(lines):
        if i > start and _WIKI_TITLE.fullmatch(line):
            yield "\n".join(lines[start:i])
            start = i
    yield "\n".join(lines[start:])


def tail_cut(text: str, fraction: float) -> Optional[int]:
    """Where a single document's validation tail starts: the paragraph break nearest to the point that leaves
    ``fraction`` of its characters to the tail, if one lies within half the tail's length of it, else the nearest
    line break; None when no break leaves text on both sides. The tail is then contiguous and disjoint from the
    training text, and cut where the text pipeline's output does not depend on the cut."""
    want = max(1, round(fraction * len(text)))
    target = len(text) - want
    first = len(text) - len(text.lstrip())  # a cut must leave text (not only spaces) on both sides
    last = len(text.rstrip())
    for pattern, slack in ((_BLANK_LINE, want / 2), (_LINE_BREAK, float("inf"))):
        cuts = [m.end() for m in pattern.finditer(text) if first < m.end() < last]
        cuts = [at for at in cuts if abs(at - target) <= slack]
        if cuts:
            return min(cuts, key=lambda at: (abs(at - target), at))
    return None


def _jsonl_record(raw: bytes, lineno: int, text_field: str) -> tuple[Optional[str], Optional[str]]:
    """One .jsonl line → ``(text, None)``, or ``(None, what is wrong with it)``."""
    try:
        rec = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))
    except UnicodeDecodeError as e:
        return None, _utf8_error(raw, e)[0]
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg})"
    if not isinstance(rec, dict) or text_field not in rec:
        keys = ", ".join(map(str, rec)) if isinstance(rec, dict) else type(rec).__name__
        return None, f"no {text_field!r} field (found: {keys}); use --text-field"
    value = rec[text_field]
    if not isinstance(value, str):
        return None, f"field {text_field!r} is not a string"
    return value, None


def _jsonl_documents(path: Path, cfg: PrepareConfig, problem: Problem) -> Iterator[str]:
    """One document per line; bad lines are skipped and reported once per file (the first, and how many)."""
    bad: list[tuple[int, str]] = []
    n = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            value, error = _jsonl_record(raw, lineno, cfg.text_field)
            if error is not None:
                bad.append((lineno, error))
                continue
            doc = _finish(value, cfg)
            if doc is not None:
                n += 1
                yield doc
    if bad:
        line, msg = bad[0]
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        problem(path, f"{msg}; line skipped{more}", line)
    if n == 0 and not bad:
        problem(path, "no documents with text in this file")


def _parquet_documents(path: Path, cfg: PrepareConfig, problem: Problem) -> Iterator[str]:
    """One document per row of the text column."""
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
            doc = _finish(value, cfg) if isinstance(value, str) else None
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
    """Workers leave Ctrl-C to the main process, which terminates the pool and removes the partial output; and
    SIGTERM (how the pool's ``terminate`` stops them) ends a worker quietly: a forked worker inherits the command
    line's handler, which would raise in it and print the worker's traceback before the main process's error."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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

    def __enter__(self) -> "_Executor":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(ok=exc_type is None)  # a failure (or Ctrl-C) terminates the workers instead of waiting

    def close(self, ok: bool) -> None:
        if self.pool is not None:
            if ok:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
            self.pool = None


# ---------------------------------------------------------------------------------------------------------------
# the pipeline, stage by stage


@dataclass
class _Plan:
    """What a run works from, settled before any text is read."""

    cfg: PrepareConfig
    out: Path
    files: list[Path]
    workers: int
    cased: bool
    """The case setting in force: a reused tokenizer's own wins over ``cfg.cased``."""
    reused: Any = None
    """The tokenizer given with ``cfg.tokenizer`` (a LearnedBPETokenizer), or None to learn one."""
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Inputs left out while expanding them (special files, link loops): warnings, and lines in the manifest."""


@dataclass
class _Scan:
    """What the scan found: the manifest's ``inputs`` entries, the document count and the validation draw."""

    inputs: list[dict[str, Any]]
    total_bytes: int
    n_docs: int
    """Documents as stored: a single input document counts twice, as its training head and validation tail."""
    val: set[int]
    tail_at: Optional[int] = None
    """With a single input document: the character where its validation tail starts (:func:`tail_cut`)."""


@dataclass
class _Words:
    """The spaCy words of every document, in a temporary file, and the BPE sample drawn from them."""

    path: Path
    spans: list[tuple[int, int]] = field(default_factory=list)
    """``(offset, length)`` of each document's words in the file."""
    text_bytes: list[int] = field(default_factory=list)
    """Bytes of input text each document came from."""
    sample: Optional["_Reservoir"] = None


@dataclass
class _Encoded:
    """The shards written and the per-split figures of the manifest."""

    shards: list[dict[str, Any]]
    splits: dict[str, dict[str, int]]
    dtype: np.dtype


class _Reservoir:
    """A seeded uniform sample of at most ``size`` lines from a stream of unknown length (Algorithm R), so the
    BPE learns from a bounded sample of a corpus of any size."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rng = random.Random(seed)
        self.lines: list[str] = []
        self.seen = 0

    def add(self, text: str) -> None:
        for line in text.split("\n"):
            self.seen += 1
            if len(self.lines) < self.size:
                self.lines.append(line)
            else:
                j = self.rng.randrange(self.seen)
                if j < self.size:
                    self.lines[j] = line


def prepare(cfg: PrepareConfig, progress: Progress | None = None) -> PrepareResult:
    """Run the whole pipeline; returns the output directory and its manifest. ``out`` is locked for the run
    (:func:`gptcli.locks.output_lock`), which also finishes or undoes what an interrupted run left beside it."""
    with output_lock(_check(cfg)):
        return _prepare(cfg, progress)


def _prepare(cfg: PrepareConfig, progress: Progress | None) -> PrepareResult:
    report = progress or SILENT
    plan = _plan(cfg)
    problems = _Problems(cfg.strict, report)
    with _partial_dir(plan.out) as tmp:
        scan = _scan(plan, problems, report)
        with _Executor(plan.workers, cfg.chunk_bytes) as executor:  # loads spaCy, then forks the warm workers
            words = _split_words(plan, scan, executor, tmp / WORDS_FILE, report)
            tok, sample_info = _learn_or_reuse(plan, words, report)
            words.sample = None  # the sample's lines are no longer needed: free them before encoding
            tok.save(tmp / "tokenizer")
            encoded = _encode(plan, scan, words, tok, executor, tmp, report)
        words.path.unlink()
        manifest = _manifest(plan, scan, tok, sample_info, encoded, problems.messages, tmp / "tokenizer")
        write_manifest(tmp, manifest)
        _move_into_place(tmp, plan)
    return PrepareResult(plan.out, manifest)


def _check(cfg: PrepareConfig) -> Path:
    from gptcli.config import check_settings

    check_settings(cfg)  # one rule per number, the same in every command (gptcli.config.RULES)
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
    return Path(cfg.out)


def _input_paths(cfg: PrepareConfig, files: list[Path]) -> list[Path]:
    """Every path the run reads: the inputs as given (files and directories; for a glob, the files it matched),
    their files and a reused tokenizer — the output may neither contain nor lie inside any of them."""
    given = [Path(s) for s in map(str, cfg.inputs) if input_root(s) == Path(os.path.expanduser(s))]
    return given + files + ([Path(cfg.tokenizer)] if cfg.tokenizer is not None else [])


def _tokenizer_dir(path: Path) -> Path:
    p = Path(path)
    if (p / "tokenizer.json").is_file():
        return p
    if (p / "tokenizer" / "tokenizer.json").is_file():  # a prepared corpus directory
        return p / "tokenizer"
    raise GPT1Error(f"{p}: not a tokenizer directory (no tokenizer.json) nor a prepared corpus")


def _plan(cfg: PrepareConfig) -> _Plan:
    """Check the settings, expand the inputs and load a reused tokenizer: every error found before any work."""
    out = _check(cfg)
    skipped: list[tuple[Path, str]] = []
    files = resolve_inputs(cfg.inputs, skipped)
    check_output(out, "corpus", overwrite=cfg.overwrite, inputs=_input_paths(cfg, files))
    plan = _Plan(cfg, out, files, workers=cfg.workers or os.cpu_count() or 1, cased=cfg.cased, skipped=skipped)
    if cfg.tokenizer is not None:
        from gptcli.tokenizers import load_tokenizer
        from gptcli.tokenizers.learned import LearnedBPETokenizer

        plan.reused = load_tokenizer(_tokenizer_dir(cfg.tokenizer))
        if not isinstance(plan.reused, LearnedBPETokenizer):
            raise GPT1Error(
                f"{cfg.tokenizer}: prepare encodes with sentencepiece tokenizers only "
                f"(this one is {plan.reused.kind!r})"
            )
        plan.cased = plan.reused.cased  # the tokenizer's own setting wins: its vocabulary was learned that way
    return plan


@contextlib.contextmanager
def _partial_dir(out: Path) -> Iterator[Path]:
    """A hidden sibling of ``out`` to build the corpus in; removed unless the block moved it into place."""
    tmp = temp_sibling(out)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful move


def _file_size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0


def _scan(plan: _Plan, problems: _Problems, report: Progress) -> _Scan:
    """Read every input once: its size, checksum and usable documents (problems reported here, once); then draw
    the validation documents (or, for a single document, find where its validation tail starts)."""
    for path, why in plan.skipped:  # every input left out is a warning and a line in the manifest
        problems(path, why)
    sizes = [_file_size(f) for f in plan.files]
    inputs = []
    n_docs = 0
    with staged(report, "scan", sum(sizes), unit="B"):
        for f, size in zip(plan.files, sizes):
            n = sum(1 for _ in iter_documents(f, plan.cfg, problems))
            try:
                digest = sha256_file(f) if regular_file_problem(f) is None else None
            except OSError:
                digest = None
            inputs.append({"path": str(f), "bytes": size, "sha256": digest, "documents": n})
            n_docs += n
            report.advance(size, docs=n_docs)
    if n_docs == 0:
        raise GPT1Error(
            f"no usable documents in {len(plan.files)} input file{'s' if len(plan.files) != 1 else ''}"
            + (" (see the warnings above)" if problems.messages else "")
        )
    if n_docs == 1:
        return _Scan(inputs, sum(sizes), 2, {1}, tail_at=_single_document_cut(plan))
    n_val = max(1, round(plan.cfg.val_fraction * n_docs))
    val = set(random.Random(plan.cfg.seed).sample(range(n_docs), n_val))
    return _Scan(inputs, sum(sizes), n_docs, val)


def _documents(plan: _Plan) -> Iterator[str]:
    """Every document of the inputs, in order, read again (problems were reported by the scan already)."""
    quiet = _Problems(False, SILENT)
    for f in plan.files:
        yield from iter_documents(f, plan.cfg, quiet)


def _single_document_cut(plan: _Plan) -> int:
    """Where the one document's validation tail starts; a one-line document cannot be cut and is refused."""
    doc = next(_documents(plan))
    at = tail_cut(doc, plan.cfg.val_fraction)
    if at is None:
        raise GPT1Error(
            "only one usable document, on a single line: no line break to cut a validation tail at (give the text "
            "line breaks, more documents, or --split-by line/paragraph)"
        )
    return at


def _split_documents(plan: _Plan, scan: _Scan) -> Iterator[str]:
    """The documents as stored: the inputs' own, or a single one's training head and validation tail."""
    for doc in _documents(plan):
        if scan.tail_at is None:
            yield doc
        else:
            yield doc[: scan.tail_at]
            yield doc[scan.tail_at :]


def _word_tasks(plan: _Plan, scan: _Scan) -> Iterator[tuple[tuple[bool, int], tuple[str, bool, bool]]]:
    """Every document's pieces as ``((last piece?, its bytes), (piece, cased, html seen))`` work units."""
    for doc in _split_documents(plan, scan):
        for piece, seen, last in text_chunks(doc, plan.cfg.chunk_bytes):
            yield (last, len(piece.encode("utf-8"))), (piece, plan.cased, seen)


def _whole_documents(results: Iterable[tuple[tuple[bool, int], str]]) -> Iterator[tuple[str, int]]:
    """Worker results (pieces' words, in order) joined back into ``(document's words, its input bytes)``."""
    parts: list[str] = []
    nbytes = 0
    for (last, piece_bytes), result in results:
        parts.append(result)
        nbytes += piece_bytes
        if last:
            yield "\n".join(p for p in parts if p), nbytes
            parts, nbytes = [], 0


def _split_words(plan: _Plan, scan: _Scan, executor: "_Executor", path: Path, report: Progress) -> _Words:
    """Clean and split every document into words (in the pool), into a file; sample training lines for the BPE."""
    words = _Words(path)
    if plan.reused is None:
        words.sample = _Reservoir(plan.cfg.sample_lines, plan.cfg.seed + 1)
    results = executor.map(_words_task, _word_tasks(plan, scan), size=lambda a: len(a[0]))
    with staged(report, "words", scan.total_bytes, unit="B"), open(path, "wb") as wf:
        for text, nbytes in _whole_documents(results):
            doc_i = len(words.spans)
            data = text.encode("utf-8")
            words.spans.append((wf.tell(), len(data)))
            words.text_bytes.append(nbytes)
            wf.write(data)
            if words.sample is not None and doc_i not in scan.val and text:
                words.sample.add(text)
            report.advance(nbytes, docs=len(words.spans))
    if len(words.spans) != scan.n_docs:  # the inputs changed between the scan and this pass
        raise GPT1Error(f"inputs changed while preparing ({scan.n_docs} documents scanned, {len(words.spans)} read)")
    return words


def _learn_or_reuse(plan: _Plan, words: _Words, report: Progress) -> tuple[Any, Optional[dict[str, int]]]:
    """The tokenizer to encode with, and the manifest's description of the sample it was learned from."""
    if plan.reused is not None:
        return plan.reused, None
    from gptcli.tokenizers.learned import LearnedBPETokenizer

    cfg, sample = plan.cfg, words.sample
    assert sample is not None
    with staged(report, "learn BPE"):
        tok = LearnedBPETokenizer.train(
            sample.lines,
            vocab_size=cfg.vocab_size,
            cased=plan.cased,
            seed=cfg.seed,
            character_coverage=cfg.character_coverage,
        )
    if tok.vocab_size != cfg.vocab_size:  # sentencepiece enforces this; keep the promise explicit
        raise GPT1Error(f"learned {tok.vocab_size} ids instead of {cfg.vocab_size}")
    return tok, {"lines": len(sample.lines), "of_lines": sample.seen, "bytes": sum(len(x) for x in sample.lines)}


def _encode_tasks(words: _Words, model_dir: str, chunk_bytes: int) -> Iterator[tuple[bool, tuple[str, str]]]:
    """The words file, document by document, cut in pieces: ``(last piece?, (tokenizer dir, lines))``."""
    with open(words.path, "rb") as rf:
        for offset, n in words.spans:
            rf.seek(offset)
            text = rf.read(n).decode("utf-8")
            for piece, _, last in text_chunks(text, chunk_bytes):
                yield last, (model_dir, piece.rstrip("\n"))


def _joined_ids(results: Iterable[tuple[bool, np.ndarray]], newline_id: int, dtype: np.dtype) -> Iterator[np.ndarray]:
    """Worker results (pieces' ids, in order) joined back into one array per document."""
    nl = np.array([newline_id], dtype=dtype)
    arrays: list[np.ndarray] = []
    for last, ids in results:
        if arrays:
            arrays.append(nl)  # the pieces were cut at line breaks
        arrays.append(ids.astype(dtype, copy=False))
        if last:
            yield arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            arrays = []


def _encode(plan: _Plan, scan: _Scan, words: _Words, tok: Any, executor: "_Executor", tmp: Path,
            report: Progress) -> _Encoded:
    """BPE-encode every document (in the pool) and write it to its split's shards."""
    dtype = token_dtype(tok.total_vocab)
    writers = {s: ShardWriter(tmp, s, dtype, plan.cfg.shard_tokens) for s in ("train", "val")}
    splits = {s: {"documents": 0, "tokens": 0, "text_bytes": 0} for s in writers}
    tasks = _encode_tasks(words, str(tmp / "tokenizer"), plan.cfg.chunk_bytes)
    results = executor.map(_encode_task, tasks, size=lambda a: len(a[1]))
    tokens = 0
    with staged(report, "encode", sum(n for _, n in words.spans), unit="B"):
        for doc_i, doc in enumerate(_joined_ids(results, tok.newline_id, dtype)):
            split = "val" if doc_i in scan.val else "train"
            writers[split].add(doc)
            st = splits[split]
            st["documents"] += 1
            st["tokens"] += len(doc)
            st["text_bytes"] += words.text_bytes[doc_i]
            tokens += len(doc)
            report.advance(words.spans[doc_i][1], docs=doc_i + 1, tokens=tokens)
        shards = writers["train"].close() + writers["val"].close()
    for s in splits:
        splits[s]["shards"] = sum(1 for e in shards if e["split"] == s)
    return _Encoded(shards, splits, dtype)


def _manifest(plan: _Plan, scan: _Scan, tok: Any, sample_info: Optional[dict[str, int]], encoded: _Encoded,
              warnings: list[str], tok_dir: Path) -> dict[str, Any]:
    """What was made from what, with every setting and checksum (format: docs/formats.md)."""
    learned = plan.reused is None
    settings = to_dict(plan.cfg)
    settings["cased"] = plan.cased
    settings["workers"] = plan.workers
    # How validation was carved: whole documents drawn with the seed, or a single document's contiguous tail.
    settings["validation"] = "documents" if scan.tail_at is None else "tail"
    return {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "gpt1", "version": __version__},
        "settings": settings,
        "inputs": scan.inputs,
        "tokenizer": {
            "dir": "tokenizer",
            "kind": tok.kind,
            "vocab_size": tok.vocab_size,
            "total_vocab": tok.total_vocab,
            "newline_id": tok.newline_id,
            "learned": learned,
            "source": None if learned else str(plan.cfg.tokenizer),
            "model_sha256": sha256_file(tok_dir / "sentencepiece.model"),
            "sample": sample_info,
        },
        "dtype": encoded.dtype.name,
        "splits": encoded.splits,
        "shards": encoded.shards,
        "warnings": warnings,
    }


def _move_into_place(tmp: Path, plan: _Plan) -> None:
    """Mark the finished corpus as gpt1's and rename it into place; ``out`` is checked again, as it may have
    appeared (or changed) while preparing."""
    check_output(plan.out, "corpus", overwrite=plan.cfg.overwrite)
    mark(tmp, "corpus")
    move_into_place(tmp, plan.out)
