"""Filesystem helpers: outputs that appear whole or not at all, and the one file checksum every format uses."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import shutil
import sys
import uuid
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def real_target(path: str | Path) -> Path:
    """Where an output really is: a symlinked ``--out`` (or a symlinked parent) is replaced at its target, and the
    link is kept."""
    return Path(os.path.realpath(Path(path).expanduser()))


def temp_sibling(target: str | Path, tag: str = "partial") -> Path:
    """A hidden name beside the real ``target`` to build its replacement in (the same file system, so the swap is a
    rename): ``.NAME.TAG-PID-RANDOM``. :func:`recover` knows every tag."""
    real = real_target(target)
    return real.parent / f".{real.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


LEFTOVER_TAGS = ("partial", "old", "new", "tmp", "fetch")
"""The hidden siblings an interrupted write can leave beside an output ``NAME``: ``.NAME.<tag>-…``."""

_HIDDEN_TEMP = re.compile(rf"^\.(.+)\.(?:{'|'.join(LEFTOVER_TAGS)})-[0-9a-f-]+$")


def visible_path(path: str | os.PathLike[str]) -> str:
    """``path`` with each hidden temporary sibling of :func:`temp_sibling` or :func:`write_text_atomic`
    (``.NAME.partial-PID-ID``) named as the output it becomes (``NAME``): what a message shows the user, who never
    sees those names (``RUN/.checkpoints.partial-1-ab/x`` → ``RUN/checkpoints/x``)."""
    parts = Path(path).parts
    return str(Path(*(m.group(1) if (m := _HIDDEN_TEMP.match(p)) else p for p in parts))) if parts else str(path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
exchange_supported = sys.platform.startswith("linux")
"""Whether :func:`move_into_place` tries the one-step swap (tests turn it off to exercise the fallback)."""


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system or the
    file system cannot."""
    if not exchange_supported:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def move_into_place(tmp: Path, target: Path) -> None:
    """Rename a finished temporary directory to ``target`` (a symlinked ``target`` is replaced at its target).

    An existing ``target`` is swapped with the new one in one atomic step where the system can (Linux); elsewhere
    in three renames that :func:`recover` can always finish or undo: ``tmp → .NAME.new-ID``, ``target →
    .NAME.old-ID``, ``.NAME.new-ID → target``. Either way, after any interruption ``target`` is the old output or
    the new one, never missing; the old one is deleted last."""
    tmp, target = Path(tmp), real_target(target)
    if not os.path.lexists(target):
        os.rename(tmp, target)
        fsync_dir(target.parent)
        return
    ident = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    old = target.parent / f".{target.name}.old-{ident}"
    if _exchange(tmp, target):
        fsync_dir(target.parent)
        os.rename(tmp, old)  # tmp now holds the old output
    else:
        new = target.parent / f".{target.name}.new-{ident}"
        os.rename(tmp, new)
        os.rename(target, old)
        os.rename(new, target)
    fsync_dir(target.parent)
    _remove(old)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


def leftovers(target: str | Path) -> dict[str, list[Path]]:
    """The hidden siblings of ``target`` an interrupted write left, by tag (see :data:`LEFTOVER_TAGS`)."""
    real = real_target(target)
    found: dict[str, list[Path]] = {t: [] for t in LEFTOVER_TAGS}
    try:
        names = os.listdir(real.parent)
    except OSError:
        return found
    for name in names:
        for t in LEFTOVER_TAGS:
            if name.startswith(f".{real.name}.{t}-"):
                found[t].append(real.parent / name)
    return found


def recover(target: str | Path) -> list[str]:
    """Finish or undo what an interrupted write of ``target`` left beside it; returns what was done, one line each.

    Only the holder of ``target``'s lock may call it (gptcli.files.locks does, on taking the lock): then nobody else is
    writing there. A missing ``target`` with a ``.NAME.new-ID`` is finished (that replacement was complete); with
    only a ``.NAME.old-ID`` it is undone (the old output put back). What remains (partial builds, old outputs
    already replaced, file temporaries) is removed."""
    real = real_target(target)
    found = leftovers(real)
    done: list[str] = []
    if not os.path.lexists(real):
        back = sorted(found["new"], key=_mtime, reverse=True) or sorted(found["old"], key=_mtime, reverse=True)
        if back:
            os.rename(back[0], real)
            fsync_dir(real.parent)
            done.append(f"{real}: put back from {back[0].name} (an interrupted replacement)")
            found = leftovers(real)
    for paths in found.values():
        for p in paths:
            _remove(p)
            done.append(f"removed {p.name} (left by an interrupted run)")
    return done


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return 0.0


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write a text file so that readers see the old content or the new one, never a part: write a hidden
    temporary sibling, flush it to disk, rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes, read in chunks (shards, checkpoint files, cache entries, task data files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x1b``), as ``ls`` and ``git`` show such names: a
    newline or a terminal escape in a path the user gave must not print as a forged line or a colour."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def inside(directory: str | Path, rel: object) -> Path | None:
    """``directory / rel`` when ``rel`` is a relative path (a string) that stays inside ``directory`` once every
    symlink is followed; None for anything else (``../../etc/passwd``, ``/abs/path``, a link out, a non-string)."""
    if not isinstance(rel, str) or not rel or "\0" in rel or os.path.isabs(rel):
        return None
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, rel))
    return Path(directory) / rel if full != root and full.startswith(root.rstrip(os.sep) + os.sep) else None


def regular_file_problem(path: Path, limit: int | None = None) -> str | None:
    """Why ``path`` is not a regular file gpt1 may read whole (missing, a FIFO, a device, a directory, over
    ``limit`` bytes); None when it is one."""
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        return "missing" if e.errno == errno.ENOENT else (e.strerror or str(e))
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a socket"
        )
        return f"not a regular file ({kind})"
    if limit is not None and st.st_size > limit:
        return f"{st.st_size:,} bytes, more than the {limit:,} such a file can be"
    return None


def read_bytes_inside(directory: str | Path, rel: object, limit: int, what: str) -> bytes:
    """The bytes of file ``rel`` of ``directory``, refused in one line (see :func:`inside`,
    :func:`regular_file_problem`) when it lies outside it, is not a regular file or is over ``limit`` bytes."""
    from gptcli.errors import GPT1Error

    path = inside(directory, rel)
    if path is None:
        raise GPT1Error(
            f"{directory}: {what} names {rel!r}, which is not a file inside {directory} (restore the directory)"
        )
    problem = regular_file_problem(path, limit)
    if problem is not None:
        raise GPT1Error(f"{path}: {problem} (restore the {what})")
    with open(path, "rb") as f:
        return f.read(limit + 1)[:limit]
