"""A launched job's heartbeat: how a worker that stops responding without dying, or whose launcher died, is ended.

Each worker that :func:`gptcli.train.distributed.launch` starts keeps a file ``rank-<R>`` (its pid inside) fresh
from a background thread (:func:`heartbeat`); a :class:`Watchdog` thread in the launcher kills a worker whose file
stood still for half the collective timeout (``GPT1_DIST_TIMEOUT``), so the other ranks see its connection close at
once instead of waiting the timeout out and then failing under their own names. The same worker thread ends its
worker when the launcher is gone (see :func:`heartbeat`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time


class Watchdog(threading.Thread):
    """In the launcher: kill (SIGKILL, which also ends a stopped process) any local worker whose heartbeat file has
    not changed for ``limit_s`` seconds, and remember it in ``stalled`` as ``(rank, seconds silent)``.

    Silence is measured on this thread's monotonic clock, from the last time it *saw* the file change, so a
    launcher that was itself suspended (a laptop lid) does not mistake everyone for dead when it wakes up."""

    def __init__(self, directory: str, limit_s: float) -> None:
        super().__init__(name="gpt1-watchdog", daemon=True)
        self.directory = directory
        self.limit_s = limit_s
        self.stalled: list[tuple[int, float]] = []
        self._seen: dict[str, tuple[int, float]] = {}  # file → (mtime_ns, when it changed, on our clock)
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(min(1.0, self.limit_s / 10)):
            now = time.monotonic()
            for name in os.listdir(self.directory):
                self._check(name, now)

    def _check(self, name: str, now: float) -> None:
        path = os.path.join(self.directory, name)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        last = self._seen.get(name)
        if last is None or last[0] != mtime:
            self._seen[name] = (mtime, now)
            return
        silent = now - last[1]
        rank = int(name.split("-")[1])
        if silent > self.limit_s and all(r != rank for r, _ in self.stalled):
            try:
                with open(path, encoding="utf-8") as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                return  # removed by a worker that finished
            if _is_child(pid):
                self.stalled.append((rank, silent))
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        self._done.set()


def _is_child(pid: int) -> bool:
    """Whether ``pid`` is still one of this launcher's worker processes (never kill a recycled pid). Where /proc
    does not exist, whether any process has that pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()  # the field after the state: ppid
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return False  # no such process
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


_beating: list[str] = []  # this worker's heartbeat file, removed by stop_beating()


def heartbeat(directory: str, rank: int, interval_s: float) -> threading.Thread:
    """In a launched worker: touch ``directory/rank-<rank>`` every ``interval_s`` seconds from a daemon thread (it
    stops with the process, and stands still while the process is stopped).

    It also ends the worker when its launcher (its parent) is gone, e.g. ``kill -9``: an orphan would train on
    outside the run lock that died with the launcher. Checkpoints are whole or absent, so nothing is torn."""
    path = os.path.join(directory, f"rank-{rank}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    _beating.append(path)
    launcher = os.getppid()

    def beat() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != launcher:  # orphaned: say so where a terminal may still read it, and end at once
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(f"gpt1 worker rank {rank}: the launching process is gone; stopping\n")
                    sys.stderr.flush()
                os._exit(1)
            try:
                os.utime(path)
            except OSError:
                return  # the launcher cleaned up: the job is over

    thread = threading.Thread(target=beat, name="gpt1-heartbeat", daemon=True)
    thread.start()
    return thread


def stop_beating() -> None:
    """(A worker that finished) remove its heartbeat file, so that its silence from now on is not taken for a stop."""
    for path in _beating:
        with contextlib.suppress(OSError):
            os.remove(path)


__all__ = ["Watchdog", "heartbeat", "stop_beating"]
