"""Running checks in their own processes, under their own timeouts and the global deadline, into one record that is
rewritten after every check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import suite
from .context import DRY, NOT_TESTABLE, REAL, STATUSES, Ctx, Failed, Skipped, finite, write_json_atomic
from .processes import PACKAGE, ROOT, kill_tree, tail
from .registry import Check


def run_check(name: str, dry: bool, work: str, result_path: str | None) -> dict[str, Any]:
    """Run one check here; returns (and writes to ``result_path``) its status, figures, note and error."""
    chk = next(c for c in suite.CHECKS if c.name == name)
    path = Path(result_path) if result_path else None
    t0 = time.perf_counter()
    ctx = None
    result: dict[str, Any]
    try:
        ctx = Ctx(dry, Path(work), path)
        note = chk.fn(ctx)
        result = {"status": "ok", "note": note}
    except Skipped as e:
        result = {"status": "skipped", "reason": str(e)}
    except Failed as e:
        result = {"status": "fail", "error": str(e).splitlines()[-30:]}
    except BaseException as e:  # noqa: BLE001 - anything a check raises is its result, not the runner's end
        result = {
            "status": "fail",
            "error": traceback.format_exc().splitlines()[-25:],
            "exception": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
        }
    result.update(figures=finite(ctx.figures if ctx else {}), seconds=round(time.perf_counter() - t0, 2))
    if path is not None:
        write_json_atomic(path, result)
    return result


def _child(name: str, dry: bool, work: str, result_path: str, log_path: str, timeout: float) -> None:
    """Body of a check's process: its own session and log; a crash or a hang leaves its Python stack there."""
    import faulthandler

    os.setsid()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable()  # a segfault (a CUDA driver crash) writes where it happened
    if timeout > 5:
        faulthandler.dump_traceback_later(timeout - 3)  # where a hang hangs, just before the runner kills it
    run_check(name, dry, work, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a check's leftover threads (NCCL, compile workers) cannot hang it


class Interrupted(Exception):
    """SIGTERM or SIGINT reached the runner: record the check that was running, stop its tree, stop."""


def portable(line: str) -> str:
    """An error line with this checkout's paths relative to it and installed packages' from ``site-packages/``: the
    record is kept in the repository (docs/performance/), where one machine's folders mean nothing."""
    return re.sub(r"/[^\s\"']*/site-packages/", "site-packages/", line.replace(f"{ROOT}{os.sep}", ""))


class Runner:
    """Starts each check in its own process, enforces the timeouts, and keeps the JSON record current."""

    def __init__(self, args: argparse.Namespace, work: Path, out: Path, logs: Path | None = None) -> None:
        self.args = args
        self.work = work
        self.out = out
        self.logs = logs or work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.deadline
        # On the GPU every check is a fresh interpreter: a fork of the server cannot use CUDA once anything the
        # server imported has asked torch about devices (spaCy's thinc calls torch.cuda.device_count() at import).
        # The dry run keeps the fast fork server.
        self.mp = None if args.fresh_processes or not args.dry_run else forkserver()
        self.current: int | None = None
        """The pid of the running check's process."""
        self.record: dict[str, Any] = {
            "tool": "benchmarks/gpu_check",
            "format": 1,
            "mode": "dry-run" if args.dry_run else "gpu",
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "deadline_s": args.deadline,
            "sizes": asdict(DRY if args.dry_run else REAL),
            "logs": os.path.relpath(self.logs, out.parent),
            "env": None,
            "checks": [],
            "not_testable_here": NOT_TESTABLE,
            "summary": {},
            "finished": False,
            "total_s": 0.0,
        }
        self.save()

    def save(self) -> None:
        self.record["total_s"] = round(time.monotonic() - self.t0, 1)
        self.record["summary"] = {s: sum(c["status"] == s for c in self.record["checks"]) for s in STATUSES}
        write_json_atomic(self.out, self.record)

    def run(self, chk: Check) -> dict[str, Any]:
        """Run one check and record it, whatever happens to it (an interruption is recorded, then re-raised)."""
        left = self.deadline - time.monotonic()
        t0 = time.monotonic()
        stop = None
        own = chk.timeout_s * self.args.timeout_scale
        if left < 5:
            res: dict[str, Any] = {
                "status": "skipped",
                "reason": f"the global deadline ({self.args.deadline:.0f} s) was reached before this check could start",
                "figures": {},
            }
        else:
            try:
                res = self.run_process(chk, min(own, left))
            except Interrupted as e:
                stop = e
                res = self.stopped(chk, f"the run was interrupted ({e}) while this check ran")
            except Exception:  # noqa: BLE001 - e.g. the process could not start: still a record, and on to the next
                res = self.stopped(chk, "the runner could not run this check:", traceback.format_exc())
        res.setdefault("seconds", round(time.monotonic() - t0, 2))
        # Skipped at the deadline, or killed at it before its own timeout: not a finding, only left for another call.
        res["cut_by_deadline"] = left < 5 or (res["status"] == "timeout" and stop is None and left < own)
        if res.get("error"):
            res["error"] = [portable(line) for line in res["error"]]
        entry = {"name": chk.name, "what": chk.what, **res}
        self.record["checks"].append(entry)
        if chk.name == "env":
            self.record["env"] = res.get("figures")
        self.save()
        if stop is not None:
            raise stop
        return entry

    def stopped(self, chk: Check, why: str, detail: str = "") -> dict[str, Any]:
        if self.current is not None:
            kill_tree(self.current)
        paths = self.paths(chk)
        log = tail(detail or read_text(paths[1]), 20).splitlines()
        return {
            "status": "timeout" if "interrupted" in why else "fail",
            "figures": read_result(paths[0]).get("figures", {}),
            "error": [why, *log],
        }

    def paths(self, chk: Check) -> tuple[Path, Path]:
        return self.logs / f"{chk.name}.json", self.logs / f"{chk.name}.log"

    def run_process(self, chk: Check, timeout: float) -> dict[str, Any]:
        result_path, log_path = self.paths(chk)
        result_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        pid, wait = self.start(chk, result_path, log_path, timeout)
        self.current = pid
        code = wait(timeout)
        timed_out = code is None
        kill_tree(pid)  # a timeout's whole tree; after a normal end, whatever it left behind
        if timed_out:
            wait(10)
        self.current = None
        res = read_result(result_path)
        seconds = round(time.monotonic() - t0, 2)
        if timed_out:
            return {
                "status": "timeout",
                "figures": res.get("figures", {}),
                "seconds": seconds,
                "error": [f"killed after {timeout:.0f} s"] + tail(read_text(log_path), 20).splitlines(),
            }
        if res.get("status") in ("ok", "fail", "skipped"):
            return {**res, "seconds": seconds}
        why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return {
            "status": "fail",
            "figures": res.get("figures", {}),
            "seconds": seconds,
            "error": [
                f"the check's process died ({why}) before reporting",
                *tail(read_text(log_path), 25).splitlines(),
            ],
        }

    def start(self, chk: Check, result_path: Path, log_path: Path, timeout: float) -> tuple[int, Callable]:
        """Start the check's process; returns its pid and ``wait(seconds) -> exit code or None (still running)``."""
        if self.mp is not None:
            proc = self.mp.Process(
                target=_child,
                name=f"gpu_check-{chk.name}",
                args=(chk.name, self.args.dry_run, str(self.work), str(result_path), str(log_path), timeout),
            )
            proc.start()
            assert proc.pid is not None
            return proc.pid, lambda s: (proc.join(s), proc.exitcode)[1]
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    str(PACKAGE),
                    "--child",
                    chk.name,
                    "--work",
                    str(self.work),
                    "--result",
                    str(result_path),
                    *(["--dry-run"] if self.args.dry_run else []),
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return popen.pid, lambda s: _poll(popen, s)


def _poll(popen: subprocess.Popen, seconds: float) -> int | None:
    try:
        return popen.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def read_result(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# What the checks and the commands they run import (a missing one is skipped by the server): the biggest are
# torch._dynamo (imported by the first model built) and spacy (the text pipeline), seconds each on a slow CPU.
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.profiler",
    "torch.distributed.elastic.multiprocessing",
    "spacy",
    "ftfy",
    "gptcli.cli",
    "gptcli.commands.pretrain",
    "gptcli.commands.finetune",
    "gptcli.commands.evaluate",
    "gptcli.commands.zeroshot",
    "gptcli.commands.prepare",
    "gptcli.commands.render",
    "gptcli.train.pretrain",
    "gptcli.train.finetune",
    "gptcli.train.distributed",
    "gptcli.data.prepare",
    "gptcli.eval.tasks",
    "gptcli.eval.perplexity",
    "gptcli.eval.zeroshot",
    "gptcli.eval.scoring",
    "gptcli.model.generate",
    "gptcli.tokenizers.text",
    "gptcli.interop.hub",
    "gptcli.pipelines.quickstart",
]


def forkserver():
    """A process server that imports torch and gptcli once (never touching CUDA); each check is forked from it,
    so it starts at once with a CUDA context of its own."""
    import multiprocessing as mp

    # Checks end with os._exit (nothing may hang in teardown), so semaphores some library made are never
    # unregistered and the resource tracker would warn of "leaked semaphore objects" at the end. It inherits -W.
    sys.warnoptions.append("ignore::UserWarning:multiprocessing.resource_tracker")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
