"""Which files `gpt1 prepare` reads: files, folders (recursively) and glob patterns, expanded by one rule.

- **Only regular files are read.** A FIFO (it would block forever), a device (``/dev/zero`` never ends), a socket,
  a broken link or a link loop is skipped, and every skipped input is reported: a warning, and a line in the
  manifest's ``warnings`` (with ``--strict``, an error). Named on the command line, such a file is an error.
- **Links are followed, once.** A symlinked file is read as the file it points to; a symlinked folder is walked
  like any folder. A folder reached a second time (a link loop, or two links to one folder) is not walked again,
  and is reported; the same file reached by two paths is read once.
- **Globs** (``*``, ``?``, ``[…]``, and ``**`` for any depth) are matched while walking with the same rule, so a
  recursive glob over a folder loop ends. A path that exists is that path, even when its name has glob characters.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import regular_file_problem

SUFFIXES = (".txt", ".jsonl", ".parquet")
# Named explicitly (a file or a glob), also these plain-text suffixes (a directory walk keeps to SUFFIXES, so that it
# never picks up files a user did not mean): WikiText's wiki.*.raw and wiki.*.tokens.
TEXT_SUFFIXES = (".txt", ".raw", ".tokens")
NAMED_SUFFIXES = SUFFIXES + TEXT_SUFFIXES[1:]

Skipped = list[tuple[Path, str]]
"""(path, why) of every input left out, for the warnings and the manifest."""


def resolve_inputs(specs: Iterable[str | Path], skipped: Skipped | None = None) -> list[Path]:
    """Expand files, directories (recursively) and globs into an ordered, de-duplicated list of regular files;
    what is left out goes to ``skipped`` (see the module docstring)."""
    skipped = [] if skipped is None else skipped
    files: list[Path] = []
    for spec in specs:
        s = os.path.expanduser(str(spec))
        is_glob = any(c in s for c in "*?[") and not os.path.lexists(s)
        files += _glob_inputs(str(spec), s, skipped) if is_glob else _path_inputs(Path(s), skipped)
    seen: set[str] = set()
    out = []
    for f in files:
        key = os.path.realpath(f)  # never raises, even on a link loop
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise GPT1Error("no input files given")
    return out


def walk(root: Path, skipped: Skipped) -> list[Path]:
    """Every entry under ``root`` that is not a folder, in sorted order, following symlinked folders once each."""
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()

    def visit(d: Path) -> None:
        try:
            st = os.stat(d)
        except OSError as e:
            skipped.append((d, f"skipped: cannot open the folder ({e.strerror or e})"))
            return
        key = (st.st_dev, st.st_ino)
        if key in seen:
            skipped.append((d, "skipped: a link to a folder already read (a loop, or a second path to it)"))
            return
        seen.add(key)
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            skipped.append((d, f"skipped: cannot list the folder ({e.strerror or e})"))
            return
        for entry in entries:
            p = Path(entry.path)
            if _is_dir(p):
                visit(p)
            else:
                found.append(p)

    visit(root)
    return found


def _is_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(p).st_mode)
    except OSError:
        return False  # a broken link or a loop: an entry that is not a folder (reported as a file)


def _keep(p: Path, suffixes: tuple[str, ...], skipped: Skipped) -> bool:
    """Whether ``p`` (of an input suffix) is a regular file to read; otherwise reported, unless its suffix says it
    was never an input."""
    if p.suffix.lower() not in suffixes:
        return False
    problem = regular_file_problem(p)
    if problem is None:
        return True
    if problem == "missing":
        return True  # a broken link or a link loop: kept, and reported when read ("cannot read"), as it always was
    skipped.append((p, f"skipped: {problem}; only regular files are read"))
    return False


def _dir_inputs(d: Path, skipped: Skipped) -> list[Path]:
    return [p for p in walk(d, skipped) if _keep(p, SUFFIXES, skipped)]


def _glob_inputs(given: str, pattern: str, skipped: Skipped) -> list[Path]:
    matches = _glob(pattern, skipped)
    if not matches:
        raise GPT1Error(f"{given}: no files match this pattern")
    files: list[Path] = []
    for m in matches:
        if _is_dir(m):
            files += _dir_inputs(m, skipped)
        elif _keep(m, NAMED_SUFFIXES, skipped):
            files.append(m)
    if not files:
        raise GPT1Error(f"{given}: matches no .txt, .jsonl or .parquet file")
    return files


def input_root(spec: str) -> Path:
    """What an input spec reads from: the path itself, or for a glob the folder before its first wildcard."""
    s = os.path.expanduser(spec)
    if not any(c in s for c in "*?[") or os.path.lexists(s):
        return Path(s)
    parts = Path(s).parts
    fixed = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _glob(pattern: str, skipped: Skipped) -> list[Path]:
    """The paths matching ``pattern``, found by walking the folder before its first wildcard with :func:`walk`
    (folders and files alike; ``**`` is any depth), so that no folder is walked twice."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    base = Path(*parts[:fixed]) if fixed else Path(".")
    if not _is_dir(base):
        return []
    wanted = tuple(parts[fixed:])
    out = []
    candidates = walk(base, skipped)
    folders = {q for p in candidates for q in p.relative_to(base).parents if q != Path(".")}
    for rel in sorted({p.relative_to(base) for p in candidates} | folders):
        if _matches(wanted, rel.parts):
            out.append(base / rel if fixed else rel)
    # A folder that matches stands for the files under it: drop the matches inside a matched folder.
    matched_dirs = {m for m in out if _is_dir(m)}
    return [m for m in out if not any(d in m.parents for d in matched_dirs)]


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether a relative path's ``parts`` match a glob's: ``**`` is any number of folders, ``*``/``?``/``[…]``
    stay within one name, and a wildcard does not match a leading ``.`` (as glob does)."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(rest, parts[k:]) for k in range(len(parts) + 1))
    if not parts:
        return False
    name = parts[0]
    if name.startswith(".") and not head.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, head) and _matches(rest, parts[1:])


def _path_inputs(p: Path, skipped: Skipped) -> list[Path]:
    if _is_dir(p):
        files = _dir_inputs(p, skipped)
        if not files:
            raise GPT1Error(f"{p}: directory holds no .txt, .jsonl or .parquet file")
        return files
    if os.path.lexists(p):
        if p.suffix.lower() not in NAMED_SUFFIXES:
            raise GPT1Error(
                f"{p}: unsupported file type {p.suffix or '(none)'!r}; expected .txt, .jsonl or .parquet "
                "(or WikiText's .raw / .tokens)"
            )
        problem = regular_file_problem(p)
        if problem is not None and problem != "missing":  # a broken link is reported when read ("cannot read")
            raise GPT1Error(f"{p}: {problem}; prepare reads only regular files (give the file itself)")
        return [p]
    raise GPT1Error(
        f"{p}: no such file or directory (check the path: give .txt, .jsonl or .parquet files, folders "
        "of them, or a glob)"
    )
