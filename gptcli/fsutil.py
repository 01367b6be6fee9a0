"""Filesystem helpers: outputs that appear whole or not at all, and the one file checksum every format uses."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
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

    Only the holder of ``target``'s lock may call it (gptcli.locks does, on taking the lock): then nobody else is
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
