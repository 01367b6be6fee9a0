"""The files of one ``--gpus``/``--procs`` launch: its temporary folder, and the workers' output it keeps.

Each launch works in one folder under a per-user root in the system's temporary directory (the resolved config the
workers read, their heartbeats, elastic's per-rank logs); the folder's name carries the launcher's pid and host. A
launcher killed with SIGKILL cannot remove its folder, so every launch first sweeps this host's folders whose owner is
no longer alive, never one of a live process. The workers' output is held here rather than shown (a rank that dies
takes the others down, and their tracebacks would bury the one line that says what happened); :func:`save_output`
appends it to the run's ``workers.log`` for whoever wants the details.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

# The file in a run directory that keeps what the workers of each launch printed.
WORKERS_LOG = "workers.log"
# Set in our workers: the folder where a worker leaves the error it would have printed (the launcher reports it).
KEEP_ENV = "GPT1_DIST_OUTPUT"
# launch-<pid>-<host>-<random>: the pid is only meaningful on its host (a temporary folder may be shared).
_NAME = re.compile(r"^launch-(\d+)-(.*)-[^-]+$")
_LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


def debugging() -> bool:
    """``gpt1 --debug`` or ``GPT1_DEBUG=1``: then the workers print everything, tracebacks included."""
    return os.environ.get("GPT1_DEBUG", "") not in ("", "0")


def launch_root() -> Path:
    """The per-user folder that holds the launches' folders (``$TMPDIR/gpt1-launches-<uid>``)."""
    user = f"-{os.getuid()}" if hasattr(os, "getuid") else ""
    return Path(tempfile.gettempdir()) / f"gpt1-launches{user}"


def this_host() -> str:
    """This machine's name as it appears in a launch folder's name."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists; where that cannot be asked, True (its folder is then never swept)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep(root: Path) -> list[Path]:
    """Remove the launch folders in ``root`` whose launcher is no longer alive; returns those removed."""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or match.group(2) != this_host() or entry.is_symlink() or not entry.is_dir():
            continue
        if alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _private_root(root: Path) -> Path:
    """``root``, created for this user alone; a fresh private folder instead when the name is taken by something
    that is not this user's folder (a file, a link, another user's folder)."""
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(root)
        if os.path.isdir(root) and not os.path.islink(root) and st.st_uid == getattr(os, "getuid", lambda: st.st_uid)():
            return root
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"{root.name}-"))


@contextmanager
def launch_folder() -> Iterator[Path]:
    """A new folder for one launch, removed when the launch ends; folders of dead launchers are swept first."""
    root = launch_root()
    for attempt in range(3):  # another launcher may remove the empty root between our mkdir and mkdtemp
        base = _private_root(root)
        if attempt == 0:
            sweep(base)  # only in a root this user owns: never in a folder someone else put at that name
        try:
            folder = Path(tempfile.mkdtemp(prefix=f"launch-{os.getpid()}-{this_host()}-", dir=base))
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        try:
            base.rmdir()  # only when empty: the last launch leaves no trace
        except OSError:
            pass


def keep_for_launcher(text: str) -> bool:
    """In a worker of our launcher, append ``text`` (an error or traceback it would print) to its rank's file for
    the launcher, and return True; False elsewhere (then the caller prints it)."""
    folder = os.environ.get(KEEP_ENV)
    if not folder:
        return False
    try:
        with open(os.path.join(folder, f"rank-{os.environ.get('RANK', '0')}.txt"), "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        return False
    return True


def keep_uncaught() -> None:
    """In a worker of our launcher: an exception that escapes the command's own handling (the launcher's SIGTERM
    arriving while a worker handles its peer's death, an error in a thread) is kept for the launcher as well."""
    if not os.environ.get(KEEP_ENV):
        return
    previous, previous_thread = sys.excepthook, threading.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not keep_for_launcher("".join(traceback.format_exception(kind, value, tb))):
            previous(kind, value, tb)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        if not keep_for_launcher(f"in thread {getattr(args.thread, 'name', '?')}: {text}"):
            previous_thread(args)

    sys.excepthook = hook
    threading.excepthook = thread_hook


@contextmanager
def held_launcher_log(path: Path) -> Iterator[None]:
    """The elastic launcher's own log lines (``Sending process … closing signal``, ``failed (exitcode: -9)``) go to
    ``path`` instead of the terminal while the job runs."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = []
    for name in _LAUNCHER_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
        handler.close()


def _pieces(folder: Path) -> Iterator[tuple[str, str]]:
    """(label, text) of everything the launch in ``folder`` kept, in a stable order."""
    for path in sorted(folder.glob("elastic/**/*.log")):
        if path.parent.name.isdigit():  # <run>/attempt_0/<local rank>/stdout.log
            yield f"local rank {path.parent.name}, {path.stem}", _read(path)
    for path in sorted(folder.glob("kept/rank-*.txt")):
        yield f"{path.stem.replace('-', ' ')}, error", _read(path)
    yield "launcher", _read(folder / "launcher.log")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def save_output(folder: Path, run: Path, header: str) -> Path | None:
    """Append what the workers of the launch in ``folder`` printed to ``run/workers.log`` under ``header``; the
    log's path, or None when ``run`` is not a folder (the workers never created it) or no worker printed anything."""
    pieces = [(label, text) for label, text in _pieces(folder) if text.strip()]
    if all(label == "launcher" for label, _ in pieces) or not run.is_dir():
        return None  # elastic's lines alone (a stop forwarded to the workers) are no news
    path = run / WORKERS_LOG
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"===== {header}\n")
            for label, text in pieces:
                f.write(f"----- {label}\n{text}{'' if text.endswith(chr(10)) else chr(10)}")
    except OSError:  # a full disk must not hide what happened to the job
        return None
    return path
