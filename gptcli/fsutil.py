"""Filesystem helpers: outputs that appear whole or not at all, and the one file checksum every format uses."""

from __future__ import annotations

import hashlib
import os
import shutil
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


def move_into_place(tmp: Path, target: Path) -> None:
    """Rename a finished temporary directory to ``target``; an existing ``target`` is swapped out first and
    removed only after the new one is in place, so a reader never sees a half-written directory."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(target)
    fsync_dir(target.parent)


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
