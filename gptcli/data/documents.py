"""One input file of `gpt1 prepare` → its documents, in order: the readers of each format and the cuts inside a text.

- **Formats.** A .txt (or a .raw / .tokens named directly) is one document, or the pieces ``split_by`` cuts it in;
  a .jsonl holds one document per record, a .parquet one per row (``text_field`` names the field or column).
  Project Gutenberg boilerplate is removed first when asked (``strip_gutenberg``).
- **Problems** (an unreadable, empty, binary or non-UTF-8 file, a bad record) skip the file or line and are reported
  to a :data:`Problem` callback: :class:`Problems` makes them warnings, or errors with ``--strict``.
- **Cuts** (:func:`split_text`, and :func:`tail_cut` for a single document's validation tail) are made at line
  breaks only, where the text pipeline's output does not depend on them (ftfy, the standardisation and spaCy all
  work within lines: ``gptcli.tokenizers.text``).

Which files are read at all (folders, globs, links, special files) is :mod:`gptcli.data.inputs`' rule; what is done
with the documents is :mod:`gptcli.data.prepare`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal, Protocol, cast

from gptcli.data.inputs import TEXT_SUFFIXES
from gptcli.errors import DataError, GPT1Error
from gptcli.files.fsutil import regular_file_problem
from gptcli.progress import Progress

SplitBy = Literal["file", "paragraph", "line", "wikitext"]


class Reading(Protocol):
    """The settings reading a file depends on. :class:`gptcli.data.prepare.PrepareConfig` has them (and documents
    them); they are named here as a protocol so that this module need not import the pipeline that imports it."""

    text_field: str
    strip_gutenberg: bool
    split_by: SplitBy


Problem = Callable[..., None]
"""``problem(path, message, line=None)``: told of each file or line that is skipped."""


class Problems:
    """Per-file problems: warnings (file or lines skipped) or, with ``strict``, errors."""

    def __init__(self, strict: bool, report: Progress) -> None:
        self.strict = strict
        self.report = report
        self.messages: list[str] = []

    def __call__(self, path: Path, message: str, line: int | None = None) -> None:
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


def iter_documents(path: Path, cfg: Reading, problem: Problem) -> Iterator[str]:
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


def _finish(text: str, cfg: Reading, no_header: Callable[[], None] | None = None) -> str | None:
    """A document as stored: Gutenberg boilerplate removed if asked (``no_header`` is told when there was none),
    None when no text is left."""
    if cfg.strip_gutenberg:
        from gptcli.tokenizers.text import strip_gutenberg

        text, found = strip_gutenberg(text)
        if not found and no_header is not None:
            no_header()
    return text if text.strip() else None


def _txt_documents(path: Path, cfg: Reading, problem: Problem) -> Iterator[str]:
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
    """The documents of one text as ``split_by`` cuts it (see :attr:`gptcli.data.prepare.PrepareConfig.split_by`);
    pieces holding no text are dropped. Every cut is at a line break, where the text pipeline's output does not
    depend on it."""
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


def tail_cut(text: str, fraction: float) -> int | None:
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


def _jsonl_record(raw: bytes, lineno: int, text_field: str) -> tuple[str | None, str | None]:
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


def _jsonl_documents(path: Path, cfg: Reading, problem: Problem) -> Iterator[str]:
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
            doc = _finish(cast(str, value), cfg)  # no error: the line's text is there
            if doc is not None:
                n += 1
                yield doc
    if bad:
        line, msg = bad[0]
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        problem(path, f"{msg}; line skipped{more}", line)
    if n == 0 and not bad:
        problem(path, "no documents with text in this file")


def _parquet_documents(path: Path, cfg: Reading, problem: Problem) -> Iterator[str]:
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
