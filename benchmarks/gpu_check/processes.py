"""Processes the checks start: ``gpt1`` commands (a fresh interpreter on the GPU, a fork in the dry run) and the
killing of a process tree, since a launched worker runs in a session of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import ROOT

PACKAGE = Path(__file__).resolve().parent
"""This suite's folder: ``python PACKAGE`` runs it (a check's fresh interpreter)."""


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def fresh_cli(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``python -m gptcli ARGS``; on a timeout its whole tree is killed (subprocess.run would kill the launcher
    alone and leave a `--gpus` worker, in a session of its own, holding the GPU)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptcli", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def forked_cli(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``gptcli.cli.main(args)`` in a forked child with its output in files: a CompletedProcess like
    subprocess.run's (TimeoutExpired after ``timeout`` seconds, the child's tree killed)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # the child: run the command, never return into the check
        code = 1
        try:
            os.chdir(cwd)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.environ.update(cli_env())
            from gptcli.cli import main as gpt1_main

            try:
                gpt1_main(args)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > end:
            kill_tree(pid)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(["gpt1", *args], timeout)
        time.sleep(0.05)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", errors="replace"))
        f.close()
    return subprocess.CompletedProcess(["gpt1", *args], os.waitstatus_to_exitcode(status), texts[0], texts[1])


def tail(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (by parent pid), found while they still hang together; a launched
    worker runs in a session of its own, so the process group alone would miss it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_tree(pid: int) -> None:
    for p in descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
