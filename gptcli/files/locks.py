"""One run per output: an exclusive lock on every output a command writes, held for the whole run.

A command that writes an output (a corpus, a run, an export, evaluation results, fetched task data, a shared cache)
first takes :func:`output_lock` on it: an ``flock`` on a hidden file ``.NAME.lock`` *beside* the output, because
replacing the output swaps the folder and a lock inside it would go with the old one. The lock file names its
holder (pid, host, command, time), so a second run on the same output is refused at once, before any work, with
one line naming the holder. The operating system releases the lock when its process dies, however it dies, so a
stale lock file never blocks anyone; a symlinked output is locked at its target.

Taking the lock also tidies what an interrupted earlier run left beside the output
(:func:`gptcli.files.fsutil.recover`): only the lock's holder may, since nobody else is writing there. A
multi-process job takes it once, in its launcher or rank 0; a worker whose parent holds the lock proceeds under it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import recover

_HELD: dict[str, list] = {}
"""Locks this process holds: lock path → [fd, depth] (re-entrant: a pipeline's stage may lock what it already has)."""


def lock_path(out: str | Path) -> Path:
    """``.NAME.lock`` beside the (symlink-resolved) output."""
    real = Path(os.path.realpath(Path(out).expanduser()))
    return real.parent / f".{real.name}.lock"


def describe(info: dict | None) -> str:
    if not info:
        return "another gpt1 run (its lock file does not say which)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("since", 0) or 0)))
    return f"pid {info.get('pid')} on host {info.get('host')}, `{info.get('command')}`, since {since}"


@contextlib.contextmanager
def output_lock(out: str | Path, *, wait: bool = False, tidy: bool = True, what: str = "") -> Iterator[Path]:
    """Hold the exclusive lock on output ``out`` for the block (see the module's docstring); yields the lock file.

    ``wait``: block until the holder is done instead of refusing (the shared caches, whose writes are short).
    ``tidy``: remove (or put back) what an interrupted run left beside ``out`` once the lock is taken.
    ``what``: how the refusal names the output (default: the path as given)."""
    path = lock_path(out)
    key = str(path)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield path
        finally:
            _HELD[key][1] -= 1
        return
    try:
        created = _make_parents(path.parent)
    except OSError as e:
        raise _unwritable(out, e) from None
    fd = None
    try:
        try:
            fd = _acquire(path, wait)
        except OSError as e:
            raise _unwritable(out, e) from None
        if fd is None:  # held by this worker's launcher
            yield path
            return
        _HELD[key] = [fd, 1]
        try:
            _write_holder(fd)
            if tidy:
                recover(Path(os.path.realpath(Path(out).expanduser())))
            yield path
        finally:
            del _HELD[key]
            _release(path, fd)
    except _Busy as busy:
        label = what or str(out)
        raise GPT1Error(
            f"{label} is in use by {describe(busy.info)} (wait for that run to end, or choose another "
            f"output; the lock is {path})"
        ) from None
    finally:
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()  # a parent made only for the lock, left empty by a run that failed early


def _unwritable(out: str | Path, e: OSError) -> Exception:
    """The lock beside ``out`` could not be made: the error names the user's path and what is wrong with it (a file
    where a directory must be, a directory gpt1 may not write in), not the hidden lock file nobody asked for."""
    given = Path(out).expanduser()
    if e.errno == errno.ENOTDIR:
        file = next((p for p in given.parents if p.exists() and not p.is_dir()), None)
        if file is not None:
            return GPT1Error(f"cannot write {given}: {file} is a file, not a directory (choose another path)")
    where = given.parent if str(given.parent) != "." else Path.cwd()
    advice = {
        errno.EACCES: "check its permissions, or write elsewhere",
        errno.EPERM: "check its permissions, or write elsewhere",
        errno.EROFS: "the file system is read-only: write elsewhere",
    }.get(e.errno or -1)
    if advice is None:  # another failure of the OS: said by the command line, about the user's directory
        return OSError(e.errno, e.strerror, str(where))
    return GPT1Error(f"cannot write in {where}: {e.strerror} ({advice})")


class _Busy(Exception):
    def __init__(self, info: dict | None) -> None:
        self.info = info


def _make_parents(d: Path) -> list[Path]:
    """Create ``d`` and its missing parents; returns the ones created, outermost first."""
    missing = []
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    made = []
    for m in reversed(missing):
        try:
            m.mkdir()
        except FileExistsError:
            continue
        made.append(m)
    return made


def _acquire(path: Path, wait: bool) -> int | None:
    """The locked fd of ``path``; None when our parent process (a job's launcher) holds it; raises _Busy."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            info = _read_holder(path)
            if info is not None and info.get("pid") == os.getppid() and info.get("host") == socket.gethostname():
                return None
            raise _Busy(info) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder released and removed the file between our open and our lock: take the new one


def _read_holder(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) else None


def _write_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)


def _command() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(("__main__.py", "gpt1")):
        argv[0] = "gpt1"
    return " ".join(argv)[:500]


def _release(path: Path, fd: int) -> None:
    """Remove the lock file (still holding it, so nobody can have locked this inode) and let go."""
    try:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            path.unlink()
    except OSError:
        pass
    os.close(fd)


def main_rank_lock(out: str | Path | None, is_main: bool) -> contextlib.AbstractContextManager:
    """:func:`output_lock` on ``out`` in rank 0 of a job (or a plain process); nothing on the other ranks (rank 0
    holds it for them) or without an ``out``."""
    if not out or not is_main:
        return contextlib.nullcontext()
    return output_lock(out)


def maybe_lock(out: str | Path | None) -> contextlib.AbstractContextManager:
    """:func:`output_lock` on ``out``, or nothing when a command writes no output (``out`` unset)."""
    return output_lock(out) if out else contextlib.nullcontext()
