"""The command line: which checks to run, the run itself, and the command that finishes what the deadline cut."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import suite
from .context import DEFAULT_DEADLINE_S, FRESH_ENV
from .registry import Check
from .runner import Interrupted, Runner, run_check

NEEDS_CORPUS = {"launched_vs_inprocess", "resume", "finetune_eval_zeroshot"}


def select(only: str | None) -> list[Check]:
    """The checks to run, in their order: all, or those named, with ``env`` always (the record starts with it) and
    ``corpus`` when a check reads its real-text corpus."""
    if not only:
        return list(suite.CHECKS)
    names = {n.strip() for n in only.split(",") if n.strip()}
    unknown = sorted(names - {c.name for c in suite.CHECKS})
    if unknown:
        sys.exit(f"gpu_check: unknown check(s) {', '.join(unknown)} (--list shows them)")
    names.add("env")
    if names & NEEDS_CORPUS:
        names.add("corpus")
    return [c for c in suite.CHECKS if c.name in names]


def print_line(entry: dict[str, Any]) -> None:
    detail = entry.get("note") or entry.get("reason") or " | ".join((entry.get("error") or [""])[-2:])
    print(f"[{entry['status']:^7}] {entry['name']:<28} {entry['seconds']:6.1f} s  {detail}"[:400], flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="gpu_check.json", help="the record, rewritten after every check")
    ap.add_argument("--dry-run", action="store_true", help="every check on CPU at toy sizes (tests the script)")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds for all checks together")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every per-check timeout")
    ap.add_argument("--only", help="comma-separated check names (default: all, in order)")
    ap.add_argument("--list", action="store_true", help="print the checks and exit")
    ap.add_argument("--work", help="working folder (default: a fresh temporary one, removed afterwards)")
    ap.add_argument(
        "--fresh-processes",
        action="store_true",
        help="start each check (and in the dry run each gpt1 command) as a fresh interpreter instead of "
        "forking it from one that has imported torch: slower, the GPU run's way of starting commands",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for c in suite.CHECKS:
            print(f"{c.name:<28} {c.timeout_s:4d} s  {c.what}")
        return 0
    if args.dry_run:
        # The dry run must not see a GPU (nor let gpt1 pick one), and one thread per process keeps small ops from
        # spin-waiting on a busy machine.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.fresh_processes:
        os.environ[FRESH_ENV] = "1"
    if args.child:
        import faulthandler

        faulthandler.enable()  # a crash leaves its Python stack in the log the runner reads
        res = run_check(args.child, args.dry_run, args.work or tempfile.mkdtemp(prefix="gpt1-gpucheck-"), args.result)
        if not args.result:
            print(json.dumps(res, indent=1))
        return 0
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    checks = select(args.only)
    out = Path(args.json).resolve()
    logs = out.with_name(f"{out.stem}-logs")  # beside the record: what to send back with it

    def interrupt(signum, frame) -> None:  # noqa: ARG001
        raise Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    with tempfile.TemporaryDirectory(prefix="gpt1-gpucheck-") as tmp:
        work = Path(args.work).resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runner = Runner(args, work, out, logs)
        print(
            f"gpu_check ({runner.record['mode']}): {len(checks)} checks, deadline {args.deadline:.0f} s, "
            f"record in {out}, logs in {logs}",
            flush=True,
        )
        try:
            for chk in checks:
                entry = runner.run(chk)
                print_line(entry)
                # Only a definite "no CUDA" ends the run: an env check that failed after its first figures (or
                # before any) must not cost the GPU checks that follow.
                no_cuda = (entry.get("figures") or {}).get("cuda_available") is False
                if chk.name == "env" and not args.dry_run and no_cuda:
                    print("gpu_check: no CUDA device is visible; run with --dry-run to test the script on CPU")
                    runner.record["finished"] = True
                    runner.save()
                    return 2
        except Interrupted as e:
            print_line(runner.record["checks"][-1])
            print(f"gpu_check: interrupted by {e}; the record keeps every check up to this one: {out}", flush=True)
            return 1
        runner.record["finished"] = True
        runner.record["rerun"] = rerun_command(runner.record["checks"], out)
        runner.save()
    s = runner.record["summary"]
    print(
        f"gpu_check: {s['ok']} ok, {s['fail']} failed, {s['timeout']} timed out, {s['skipped']} skipped in "
        f"{runner.record['total_s']:.0f} s; record: {out}",
        flush=True,
    )
    if runner.record["rerun"]:
        print(
            f"gpu_check: the deadline cut checks short; to finish them in another call: {runner.record['rerun']}",
            flush=True,
        )
    return 1 if s["fail"] or s["timeout"] else 0


def rerun_command(checks: list[dict[str, Any]], out: Path) -> str | None:
    """The command that runs the checks the global deadline cut short (skipped before they began, or killed at it
    before their own timeout), into a record beside this one; None when the deadline cut none. A slow host can
    stretch the full run past one 10-minute command: the next call then needs no reading of the record to know what
    is left."""
    cut = [c["name"] for c in checks if c.get("cut_by_deadline")]
    if not cut:
        return None
    if "env" not in cut:
        cut.insert(0, "env")  # every record says where it was measured
    return f"python3 benchmarks/gpu_check --only {','.join(cut)} --json {out.stem}-rest.json"
