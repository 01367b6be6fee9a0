"""The ``prepare`` pipeline: raw documents → GPT-1 text pipeline → BPE ids → Arrow shards + manifest.

GPT-1 (§4.1 "Setup") cleans BooksCorpus with ftfy, standardizes punctuation and whitespace, splits words with
spaCy and learns a 40,000-merge BPE; this module does the same for any text, streaming (memory is bounded by a few
work chunks, one document, the BPE sample and one shard). :func:`prepare` reads top to bottom as its stages. For
the same inputs and settings the shards are byte-identical whatever the number of workers, because documents are
cut at line breaks, within which ftfy, the standardization and spaCy all work, and results come back in order.

This module is the stages and what they hand each other; the parts they use live beside it, one concept each:
which files are read (:mod:`gptcli.data.inputs`), one file's documents and the cuts inside a text
(:mod:`gptcli.data.documents`), the worker processes and their jobs (:mod:`gptcli.data.workers`), the corpus format
(:mod:`gptcli.data.shards`) and the BPE itself (:mod:`gptcli.tokenizers.learned`, or OpenAI's original from
:mod:`gptcli.tokenizers.openai` given with ``--tokenizer``).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from gptcli import __version__
from gptcli.config import to_dict
from gptcli.data.documents import Problems, SplitBy, iter_documents, tail_cut
from gptcli.data.inputs import input_root, resolve_inputs
from gptcli.data.shards import FORMAT_VERSION, ShardWriter, token_dtype, tokenizer_fingerprint, write_manifest
from gptcli.data.workers import Executor, encode_task, text_chunks, words_task
from gptcli.errors import GPT1Error
from gptcli.files.fsutil import move_into_place, regular_file_problem, sha256_file, temp_sibling
from gptcli.files.locks import output_lock
from gptcli.files.outputs import check_output, mark
from gptcli.progress import SILENT, Progress, staged
from gptcli.tokenizers.base import Tokenizer
from gptcli.tokenizers.learned import LearnedBPETokenizer

WORDS_FILE = "words.tmp"


@dataclass
class PrepareConfig:
    """Settings of ``gpt1 prepare`` (defaults follow the paper where it says something)."""

    inputs: list[str] = field(default_factory=list)
    """Text files (.txt: one document each, or as --split-by cuts it; .jsonl / .parquet: one per record / row;
    .raw / .tokens named directly: text, as WikiText's files), directories (searched recursively for .txt, .jsonl
    and .parquet) or glob patterns."""
    out: Path | None = Path("corpus")
    """Output corpus directory (must not exist unless ``overwrite``; never one of the inputs, nor around them).
    The default, ``./corpus``, is where `gpt1 pretrain` looks when given no --data."""
    vocab_size: int = 40478
    """BPE ids learned, newline included, specials excluded (GPT-1: 40,478)."""
    tokenizer: Path | None = None
    """Encode with this tokenizer instead of learning one: a tokenizer directory, a corpus, checkpoint or run
    directory (its tokenizer), or a folder of OpenAI's released BPE files (encoder_bpe_40000.json +
    vocab_40000.bpe, or vocab.json + merges.txt)."""
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
# the pipeline, stage by stage


class _LineEncoder(Protocol):
    """What prepare needs of a tokenizer beyond :class:`Tokenizer` (both BPE kinds have it; the kinds without
    ``encode_lines`` are refused before any work, by :func:`_reused_tokenizer`)."""

    @property
    def cased(self) -> bool: ...

    @property
    def newline_id(self) -> int: ...


def _lines(tok: Tokenizer) -> _LineEncoder:
    return cast(_LineEncoder, tok)  # every tokenizer prepare holds is a line encoder (see _LineEncoder)


@dataclass
class _Plan:
    """What a run works from, settled before any text is read."""

    cfg: PrepareConfig
    out: Path
    files: list[Path]
    workers: int
    cased: bool
    """The case setting in force: a reused tokenizer's own wins over ``cfg.cased``."""
    reused: Tokenizer | None = None
    """The tokenizer given with ``cfg.tokenizer`` (a learned BPE or OpenAI's original), or None to learn one."""
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
    tail_at: int | None = None
    """With a single input document: the character where its validation tail starts (:func:`tail_cut`)."""
    stats: list[tuple[int, ...]] = field(default_factory=list)
    """Each input's :func:`_identity` before it was first read: the inputs must still match it after the last."""


@dataclass
class _Words:
    """The spaCy words of every document, in a temporary file, and the BPE sample drawn from them."""

    path: Path
    spans: list[tuple[int, int]] = field(default_factory=list)
    """``(offset, length)`` of each document's words in the file."""
    text_bytes: list[int] = field(default_factory=list)
    """Bytes of input text each document came from."""
    sample: _Reservoir | None = None


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


def prepare(
    cfg: PrepareConfig, progress: Progress | None = None, *, given: Collection[str] | None = None
) -> PrepareResult:
    """Run the whole pipeline; returns the output directory and its manifest. ``out`` is locked for the run
    (:func:`gptcli.files.locks.output_lock`), which also finishes or undoes what an interrupted run left beside it.
    ``given``: the names of the settings the user set (the command line's and a --config file's), so that one
    spelling its default is still checked against a reused tokenizer (:func:`check_reused_tokenizer`).

    The stages:

    1. **plan**: check the settings, expand the inputs, check ``out`` (:func:`gptcli.files.outputs.check_output`: only
       a corpus gpt1 prepared may be replaced, never one holding or inside an input), load a reused tokenizer.
    2. **scan** every input: size, sha256, usable documents; bad files are reported (skipped, or fatal with
       ``strict``). Document-level validation membership is drawn here from the seed; a corpus of a single
       document is instead cut in two at a line break (:func:`~gptcli.data.documents.tail_cut`): its training head
       and its validation tail.
    3. **words**: each document is cut at line breaks into ~``chunk_bytes`` pieces that a pool of warm worker
       processes turns into pipeline lines (ftfy + standardization → spaCy → lowercase). Results come back in
       order and go to a temporary words file; a seeded reservoir of training lines is kept on the side.
    4. **learn** the sentencepiece BPE on the reservoir (unless a tokenizer is given).
    5. **encode** the words file in order, again in chunks over the pool (workers hand back compact numpy
       arrays), and write the shards of each split.
    6. **manifest**, then **move into place**: the output is built in a hidden sibling directory, marked as a corpus
       and renamed into place at the very end, so a failed or interrupted run never leaves a directory that looks
       complete, and an old corpus it replaces survives until then.

    Progress: one stage per pass with its size in bytes, per-file problems as warnings.
    """
    with output_lock(_check(cfg)):
        return _prepare(cfg, progress, given)


def _prepare(cfg: PrepareConfig, progress: Progress | None, given: Collection[str] | None) -> PrepareResult:
    report = progress or SILENT
    plan = _plan(cfg, given)
    problems = Problems(cfg.strict, report)
    with _partial_dir(plan.out) as tmp:
        scan = _scan(plan, problems, report)
        with Executor(plan.workers, cfg.chunk_bytes) as executor:  # loads spaCy, then forks the warm workers
            words = _split_words(plan, scan, executor, tmp / WORDS_FILE, report)
            tok, sample_info = _learn_or_reuse(plan, words, report)
            words.sample = None  # the sample's lines are no longer needed: free them before encoding
            tok.save(tmp / "tokenizer")
            encoded = _encode(plan, scan, words, tok, executor, tmp, report)
        words.path.unlink()
        oversized = _oversized_validation(encoded.splits, cfg.val_fraction)
        if oversized:
            problems.messages.append(oversized)
            report.note(oversized, level="warn")
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
        raise GPT1Error(f"--val-fraction {cfg.val_fraction} is impossible (pass a fraction in (0, 0.5], e.g. 0.01)")
    if cfg.workers < 0:
        raise GPT1Error(f"--workers {cfg.workers} is impossible (pass 0 for all cores, or a number of processes)")
    if cfg.tokenizer is None and cfg.vocab_size < 16:
        raise GPT1Error(
            f"--vocab-size {cfg.vocab_size} is too small for a BPE vocabulary (pass 16 or more; the paper used 40,478)"
        )
    if cfg.sample_lines < 1 or cfg.shard_tokens < 1 or cfg.chunk_bytes < 1:
        raise GPT1Error("sample_lines, shard_tokens and chunk_bytes must be positive (set them to 1 or more)")
    return Path(cfg.out)


def _input_paths(cfg: PrepareConfig, files: list[Path]) -> list[Path]:
    """Every path the run reads: the inputs as given (files and directories; for a glob, the files it matched),
    their files and a reused tokenizer — the output may neither contain nor lie inside any of them."""
    given = [Path(s) for s in map(str, cfg.inputs) if input_root(s) == Path(os.path.expanduser(s))]
    return given + files + ([Path(cfg.tokenizer)] if cfg.tokenizer is not None else [])


def _reused_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer ``--tokenizer`` names (:func:`gptcli.checkpoint.tokenizer_home`: a tokenizer directory of any
    kind, or that of a corpus, a checkpoint or a run), or OpenAI's released BPE files
    (:func:`gptcli.tokenizers.openai.find_bpe_files`' names)."""
    from gptcli.checkpoint import tokenizer_home
    from gptcli.tokenizers import load_tokenizer
    from gptcli.tokenizers.openai import FILE_NAMES, OpenAIBPETokenizer

    p = Path(path)
    home = tokenizer_home(p)
    if home is not None:
        tok = load_tokenizer(home)
        if not hasattr(tok, "encode_lines"):  # what the workers call (gptcli.data.workers.encode_task)
            raise GPT1Error(
                f"{home}: prepare cannot encode with a {tok.kind!r} tokenizer (it has no encode_lines; "
                "pass a sentencepiece or an OpenAI BPE tokenizer)"
            )
        return tok
    if any((p / v).is_file() and (p / m).is_file() for v, m in FILE_NAMES):
        return OpenAIBPETokenizer.from_dir(p)
    bpe_files = " or ".join(f"{v} + {m}" for v, m in FILE_NAMES)
    raise GPT1Error(
        f"{p}: no tokenizer here (pass a tokenizer directory, a prepared corpus, a checkpoint or run "
        f"directory holding tokenizer/, or a folder of OpenAI's BPE files: {bpe_files})"
    )


def _plan(cfg: PrepareConfig, given: Collection[str] | None = None) -> _Plan:
    """Check the settings, expand the inputs and load a reused tokenizer: every error found before any work."""
    out = _check(cfg)
    skipped: list[tuple[Path, str]] = []
    files = resolve_inputs(cfg.inputs, skipped)
    check_output(out, "corpus", overwrite=cfg.overwrite, inputs=_input_paths(cfg, files))
    plan = _Plan(cfg, out, files, workers=cfg.workers or os.cpu_count() or 1, cased=cfg.cased, skipped=skipped)
    if cfg.tokenizer is not None:
        tok = _reused_tokenizer(cfg.tokenizer)
        check_reused_tokenizer(cfg, tok, given)
        plan.reused = tok
        plan.cased = _lines(tok).cased  # the tokenizer's own setting: its vocabulary was made that way
    return plan


_LEARNED_AS = {
    "vocab_size": (lambda v: f"--vocab-size {v}", lambda v: f"has {v:,} ids"),
    "cased": (lambda v: "--cased" if v else "--no-cased", lambda v: "is cased" if v else "is uncased"),
}
"""The settings of learning that every tokenizer records as ``vocab_size`` and ``cased`` (the others, e.g.
sample_lines, it does not; OpenAI's original BPE: 40,478 ids, uncased): how the option of a value is spelt, and how
the tokenizer's own value is said."""


def check_reused_tokenizer(cfg: PrepareConfig, tok: Tokenizer, given: Collection[str] | None) -> None:
    """Refuse a setting of learning (``_LEARNED_AS``) set by the user that disagrees with the reused tokenizer: it
    would be silently ignored. ``given`` names the settings the user set; without it (a PrepareConfig built in
    Python) a plain dataclass cannot tell ``vocab_size=40478`` from the default, so only values other than the
    default count as set."""
    for name, (option, has) in _LEARNED_AS.items():
        value, theirs = getattr(cfg, name), getattr(tok, name)
        chosen = name in given if given is not None else value != getattr(PrepareConfig, name)
        if chosen and value != theirs:
            flag = option(value).split()[0]
            raise GPT1Error(
                f"{option(value)} disagrees with the reused tokenizer {cfg.tokenizer}, which {has(theirs)} "
                f"(leave {flag} out to encode with it, or drop --tokenizer to learn a new vocabulary)"
            )


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


def _identity(f: Path) -> tuple[int, ...]:
    """What changes when a file is written to or replaced: device, inode, size, modification time."""
    try:
        st = f.stat()
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_unchanged(files: list[Path], before: list[tuple[int, ...]]) -> None:
    """Refuse inputs written to (or replaced) since they were first read. The inputs are read more than once (scan,
    checksum, words) and an appended file would be encoded partly, counted and split as an earlier version, its
    manifest matching neither: an input must hold still from the first read to the last."""
    for f, then in zip(files, before):
        now = _identity(f)
        if now != then:
            grew = f" ({then[2]:,} → {now[2]:,} bytes)" if then and now and now[2] != then[2] else ""
            raise GPT1Error(
                f"{f}: changed while prepare read it{grew} (prepare it once it is complete, or prepare a copy)"
            )


def _scan(plan: _Plan, problems: Problems, report: Progress) -> _Scan:
    """Read every input once: its size, checksum and usable documents (problems reported here, once); then draw
    the validation documents (or, for a single document, find where its validation tail starts)."""
    for path, why in plan.skipped:  # every input left out is a warning and a line in the manifest
        problems(path, why)
    stats = [_identity(f) for f in plan.files]
    sizes = [st[2] if st else 0 for st in stats]
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
        scan = _Scan(inputs, sum(sizes), 2, {1}, tail_at=_single_document_cut(plan), stats=stats)
    else:
        n_val = max(1, round(plan.cfg.val_fraction * n_docs))
        val = set(random.Random(plan.cfg.seed).sample(range(n_docs), n_val))
        scan = _Scan(inputs, sum(sizes), n_docs, val, stats=stats)
    check_unchanged(plan.files, stats)  # before the long passes: an input still being written is refused at once
    return scan


def _documents(plan: _Plan) -> Iterator[str]:
    """Every document of the inputs, in order, read again (problems were reported by the scan already)."""
    quiet = Problems(False, SILENT)
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


def _split_words(plan: _Plan, scan: _Scan, executor: Executor, path: Path, report: Progress) -> _Words:
    """Clean and split every document into words (in the pool), into a file; sample training lines for the BPE."""
    words = _Words(path)
    if plan.reused is None:
        words.sample = _Reservoir(plan.cfg.sample_lines, plan.cfg.seed + 1)
    results = executor.map(words_task, _word_tasks(plan, scan), size=lambda a: len(a[0]))
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
    check_unchanged(plan.files, scan.stats)  # the last read of the inputs: what was scanned is what was encoded
    if len(words.spans) != scan.n_docs:  # the inputs changed between the scan and this pass
        raise GPT1Error(f"inputs changed while preparing ({scan.n_docs} documents scanned, {len(words.spans)} read)")
    return words


def _learn_or_reuse(plan: _Plan, words: _Words, report: Progress) -> tuple[Tokenizer, dict[str, int] | None]:
    """The tokenizer to encode with, and the manifest's description of the sample it was learned from."""
    if plan.reused is not None:
        return plan.reused, None
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


def _encode(
    plan: _Plan, scan: _Scan, words: _Words, tok: Tokenizer, executor: Executor, tmp: Path, report: Progress
) -> _Encoded:
    """BPE-encode every document (in the pool) and write it to its split's shards."""
    dtype = token_dtype(tok.total_vocab)
    writers = {s: ShardWriter(tmp, s, dtype, plan.cfg.shard_tokens) for s in ("train", "val")}
    splits = {s: {"documents": 0, "tokens": 0, "text_bytes": 0} for s in writers}
    tasks = _encode_tasks(words, str(tmp / "tokenizer"), plan.cfg.chunk_bytes)
    results = executor.map(encode_task, tasks, size=lambda a: len(a[1]))
    tokens = 0
    with staged(report, "encode", sum(n for _, n in words.spans), unit="B"):
        for doc_i, doc in enumerate(_joined_ids(results, _lines(tok).newline_id, dtype)):
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


VAL_SHARE_SLACK = 2.0
"""How many times --val-fraction of the tokens the validation split may hold before prepare warns: whole documents
are held out, so with few (or very uneven) documents one of them can be most of the corpus."""


def _oversized_validation(splits: dict[str, dict[str, int]], val_fraction: float) -> str | None:
    """A one-line warning when the validation documents hold far more of the tokens than ``val_fraction``, else
    None. The split itself is kept as drawn, so that a corpus's numbers never depend on its documents' sizes."""
    val, total = splits["val"]["tokens"], splits["val"]["tokens"] + splits["train"]["tokens"]
    if total == 0 or val / total <= VAL_SHARE_SLACK * val_fraction:
        return None
    n_val, n_docs = splits["val"]["documents"], splits["val"]["documents"] + splits["train"]["documents"]
    return (
        f"the validation split holds {val / total:.0%} of the tokens ({val:,} of {total:,}; --val-fraction "
        f"{val_fraction:g}): {n_val} of {n_docs} documents were held out whole (pass --split-by paragraph or line "
        "to hold out parts of the documents, or give more documents)"
    )


def _manifest(
    plan: _Plan,
    scan: _Scan,
    tok: Tokenizer,
    sample_info: dict[str, int] | None,
    encoded: _Encoded,
    warnings: list[str],
    tok_dir: Path,
) -> dict[str, Any]:
    """What was made from what, with every setting and checksum (format: docs/formats.md)."""
    learned = plan.reused is None
    model = tok_dir / "sentencepiece.model"
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
            "newline_id": _lines(tok).newline_id,
            "learned": learned,
            "source": None if learned else str(plan.cfg.tokenizer),
            "model_sha256": sha256_file(model) if model.is_file() else None,  # OpenAI's BPE has no model file
            "fingerprint": tokenizer_fingerprint(tok_dir),  # any kind, as `gpt1 eval` compares tokenizers
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
