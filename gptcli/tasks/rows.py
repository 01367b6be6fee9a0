"""Reading official files line by line, with exact line numbers and one bad-row policy for every loader.

GLUE, SciTail and the other TSV distributions are split on tabs with no quote processing (what
``csv.QUOTE_NONE`` does): their sentences contain unbalanced ``"`` characters that a quoting reader would
swallow across lines. Files are read as bytes and split on ``\\n`` only, so a stray ``\\r`` or U+2028 inside a
sentence never shifts a line number; a UTF-8 byte order mark (MRPC) is dropped from the first line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gptcli.errors import DataError
from gptcli.tasks.base import ReadOptions


class BadRow(Exception):
    """Raised by a row parser: what is wrong with the current row (the reader adds ``path:line``)."""


WRONG_FILE = "put the task's official file there, or point --data-dir at the task's folder"
"""What to do about a file that is not the task's (its header, or its first line, is not the format's)."""


def advised(reason: str, advice: str) -> str:
    """``reason (advice)``: a user error's ``<what> (<what to do>)``. A reason that already ends in a parenthesis
    takes the advice inside it, after a semicolon, so the line ends in one parenthesis, not two."""
    return f"{reason[:-1]}; {advice})" if reason.endswith(")") else f"{reason} ({advice})"


def reject(path: Path, line: int | None, reason: str, opts: ReadOptions) -> None:
    """Apply the bad-row policy: raise ``DataError`` saying what to do by default, else record ``path:line:
    reason`` and go on."""
    if opts.skip_bad_rows:
        opts.skipped.append(str(DataError(path, reason, line)))
        return
    raise DataError(path, advised(reason, row_advice(opts)), line)


def row_advice(opts: ReadOptions) -> str:
    """What to do about a bad row: mend the file, or (where the command can) skip such rows."""
    skip = "pass --skip-bad-rows to leave such rows out" if opts.skippable else "check that it is the task's file"
    return f"fix or remove the line, or {skip}"


def iter_lines(path: Path, opts: ReadOptions) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` for each line, 1-based, without its ``\\n``/``\\r\\n``; BOM dropped.

    A line that is not valid UTF-8 is a bad row. A final empty line (file ending in a newline) is not a row.
    """
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                reject(path, n, f"not valid UTF-8 ({e.reason} at byte {e.start})", opts)
                continue
            yield n, text


def iter_tsv(path: Path, opts: ReadOptions) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, columns)`` for each non-blank line of a TSV file, split on tabs, no quoting. A line of only
    tabs is a row (of empty fields, which its parser rejects and the bad-row policy counts), not a blank line."""
    for n, text in iter_lines(path, opts):
        if not text.strip() and "\t" not in text:
            continue  # blank lines (e.g. a trailing one) carry no row
        yield n, text.split("\t")


def column_index(path: Path, header: list[str], line: int) -> dict[str, int]:
    """Column name → position; a name the header repeats is refused (which of the two would be read?)."""
    col: dict[str, int] = {}
    for i, name in enumerate(header):
        if name in col:
            raise DataError(
                path,
                f"the header repeats column {name!r} (columns {col[name] + 1} and {i + 1}); "
                "which one holds the data is ambiguous (rename or remove one)",
                line,
            )
        col[name] = i
    return col


def check_columns(cols: list[str], n: int) -> None:
    if len(cols) != n:
        raise BadRow(f"expected {n} tab-separated columns, found {len(cols)}")


def nonempty(value: str, what: str) -> str:
    """``value`` unchanged, or :class:`BadRow` if it is empty or only whitespace."""
    if not value.strip():
        raise BadRow(f"empty {what}")
    return value


def label_of(value: str, labels: tuple[str, ...], what: str = "label") -> int:
    """Index of ``value`` in ``labels``, or :class:`BadRow` naming the allowed values."""
    try:
        return labels.index(value)
    except ValueError:
        raise BadRow(f"unknown {what} {value!r} (expected one of {', '.join(repr(x) for x in labels)})") from None


def score_of(value: str, lo: float, hi: float, what: str = "score") -> float:
    """``value`` as a float in ``[lo, hi]``, or :class:`BadRow`."""
    try:
        x = float(value)
    except ValueError:
        raise BadRow(f"{what} {value!r} is not a number") from None
    if not lo <= x <= hi:  # also rejects nan
        raise BadRow(f"{what} {value!r} is outside [{lo:g}, {hi:g}]")
    return x
