"""benchmarks/gpu_check: the one-shot GPU check must work the first time it meets a GPU.

The dry run executes every check on CPU at toy sizes (a check that only means something on CUDA must say
``skipped``, never ``ok``); the runner tests feed it checks that raise, crash and hang, and expect each to be
recorded while the next one still runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check"  # a package folder: `python benchmarks/gpu_check` runs it

# Checks whose figures mean nothing without CUDA: the dry run runs their code, then must report them skipped.
CUDA_ONLY = {
    "gpus_refusal",
    "attention_kernel",
    "precision_steps",
    "host_syncs",
    "resume",
    "compile_loss",
    "throughput_8x512_eager",
    "throughput_8x512_compile",
    "throughput_32x512_eager",
    "throughput_32x512_compile",
    "throughput_64x512_eager",
    "throughput_64x512_compile",
    "throughput_8x512_cudagraphs",
    "throughput_8x512_autotune",
    "throughput_64x512_cudagraphs",
    "throughput_64x512_autotune",
    "step_profile",
    "cudagraphs_training",
    "chunked_loss",
}


def load_script():
    """The suite's package as its command imports it (``gpu_check`` from benchmarks/), every module loaded."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    importlib.import_module("gpu_check.cli")  # the runner, the suite and every check module with it
    return importlib.import_module("gpu_check")


@pytest.mark.slow
def test_dry_run_records_every_check_and_none_fails(tmp_path):
    out = tmp_path / "dry.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--json", str(out), "--work", str(tmp_path / "w")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    record = json.loads(out.read_text(encoding="utf-8"))
    checks = {c["name"]: c for c in record["checks"]}
    names = [c.name for c in load_script().suite.CHECKS]
    assert list(checks) == names, proc.stdout[-3000:]
    failed = {n: c.get("error") for n, c in checks.items() if c["status"] not in ("ok", "skipped")}
    assert not failed, json.dumps(failed, indent=1)[-4000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert record["finished"] and record["mode"] == "dry-run"
    assert record["summary"]["ok"] + record["summary"]["skipped"] == len(names)
    assert record["env"]["torch"] and record["env"]["cpu_count"] >= 1
    assert record["not_testable_here"]
    for name in CUDA_ONLY:
        assert checks[name]["status"] == "skipped" and checks[name]["reason"], name
    for c in checks.values():
        assert c["status"] != "skipped" or c["reason"], c["name"]
    # What the CPU can show, it showed.
    assert checks["fused_adamw"]["status"] == "ok" and checks["fused_adamw"]["figures"]["defaults_fused"]
    assert checks["launched_vs_inprocess"]["figures"]["max_rel_loss"] <= 1e-4
    assert checks["resume"]["figures"]["rel_diff_after_resume"] <= 1e-4
    assert checks["corpus"]["figures"]["tokens"]["train"] > 0
    # Every command's results were found (eval's lie a folder per checkpoint and task down: the GPU run read none).
    assert all(v is not None for v in checks["finetune_eval_zeroshot"]["figures"]["scores"].values())
    assert checks["throughput_8x512_compile"]["figures"]["tokens_per_s"] > 0


# --- the runner: what a short GPU run must never lose-------------------------------------------------------------


def _raises(ctx):
    raise ValueError("a check that raises")


def _crashes(ctx):
    import faulthandler

    ctx.record(before_crash=1)
    faulthandler.disable()  # pytest's handler would print this expected crash's stack on the terminal
    os.kill(os.getpid(), signal.SIGSEGV)


def _hangs(ctx):
    ctx.record(seen_before_hang=True)
    time.sleep(120)


def _child_process_hangs(ctx):
    # A grandchild in a session of its own, like a launched worker: the timeout must kill it too.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    ctx.record(grandchild=proc.pid)
    time.sleep(120)


def _fine(ctx):
    ctx.record(answer=42)
    return "fine"


@pytest.fixture
def runner(tmp_path, monkeypatch):
    gc = load_script()
    checks = [
        gc.registry.Check("raises", _raises, 30, "raises"),
        gc.registry.Check("crashes", _crashes, 30, "segfaults"),
        gc.registry.Check("hangs", _hangs, 3, "sleeps past its timeout"),
        gc.registry.Check("hangs_with_grandchild", _child_process_hangs, 3, "leaves a process behind"),
        gc.registry.Check("after", _fine, 30, "still runs"),
    ]
    monkeypatch.setattr(gc.suite, "CHECKS", checks)
    args = argparse.Namespace(deadline=120.0, timeout_scale=1.0, fresh_processes=True, dry_run=True)
    r = gc.runner.Runner(args, tmp_path / "work", tmp_path / "record.json", tmp_path / "record-logs")
    r.mp = multiprocessing.get_context("fork")  # the children see the checks patched in above
    return gc, r, checks


def test_the_record_holds_no_path_of_this_machine(runner, tmp_path):
    """The record goes into docs/performance/: the logs folder is named relative to it, and a traceback's files
    relative to the checkout (gptcli/…) or to their site-packages (the first GPU run's named the checkout's and a
    virtual environment's absolute paths)."""
    gc, r, checks = runner
    r.run(checks[0])  # raises: its traceback passes through this checkout's benchmarks/gpu_check/runner.py
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["logs"] == "record-logs"
    error = "\n".join(record["checks"][-1]["error"])
    assert 'File "benchmarks/gpu_check/runner.py"' in error and str(gc.ROOT) not in error
    assert (
        gc.runner.portable('  File "/opt/x/lib/python3.12/site-packages/typer/main.py", line 9')
        == '  File "site-packages/typer/main.py", line 9'
    )


def test_every_failure_is_recorded_and_the_next_check_runs(runner, tmp_path):
    gc, r, checks = runner
    seen = []
    for chk in checks:
        r.run(chk)
        seen.append(json.loads((tmp_path / "record.json").read_text())["checks"][-1])  # rewritten after each
    status = {c["name"]: c["status"] for c in seen}
    assert status == {
        "raises": "fail",
        "crashes": "fail",
        "hangs": "timeout",
        "hangs_with_grandchild": "timeout",
        "after": "ok",
    }
    by_name = {c["name"]: c for c in seen}
    assert any("ValueError: a check that raises" in line for line in by_name["raises"]["error"])
    assert "signal 11" in by_name["crashes"]["error"][0] and by_name["crashes"]["figures"] == {"before_crash": 1}
    assert by_name["hangs"]["figures"] == {"seen_before_hang": True}  # a killed check keeps what it recorded
    grandchild = by_name["hangs_with_grandchild"]["figures"]["grandchild"]
    time.sleep(0.5)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
    assert by_name["after"]["figures"] == {"answer": 42} and by_name["after"]["note"] == "fine"
    assert (tmp_path / "record-logs" / "raises.log").is_file()


def test_fresh_processes_run_a_check_too(tmp_path):
    """--fresh-processes: each check a new interpreter (``--child NAME``) instead of a fork of the server, and each
    gpt1 command a fresh ``python -m gptcli``, as on the GPU."""
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--dry-run",
            "--fresh-processes",
            "--only",
            "gpus_refusal,fused_adamw",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    record = json.loads(out.read_text(encoding="utf-8"))
    statuses = [(c["name"], c["status"]) for c in record["checks"]]
    assert statuses == [("env", "ok"), ("gpus_refusal", "skipped"), ("fused_adamw", "ok")], proc.stdout
    assert record["checks"][1]["figures"]["error"].startswith("error: --gpus 1: no CUDA device")
    assert record["finished"] and (tmp_path / "r-logs" / "fused_adamw.log").is_file()


def test_a_check_past_the_global_deadline_is_skipped_with_the_reason(runner):
    gc, r, checks = runner
    r.deadline = time.monotonic() + 1
    entry = r.run(checks[-1])
    assert entry["status"] == "skipped" and "deadline" in entry["reason"]
    assert r.record["summary"]["skipped"] == 1


def test_the_deadline_leaves_a_command_for_what_it_cut(runner, tmp_path):
    """A check killed at the global deadline before its own timeout, and those skipped after it, are marked
    ``cut_by_deadline`` and named in ``rerun`` (env first); a check that hung past its own timeout is a finding, not
    cut. The second H200 run lost its seven throughput checks so, with nothing saying how to finish them."""
    gc, r, checks = runner
    by = {c.name: c for c in checks}
    hung = r.run(by["hangs"])  # its own 3 s, well inside the deadline
    r.deadline = time.monotonic() + 6  # a check with its own 30 s has 6: the deadline kills it
    cut = r.run(dataclasses.replace(by["hangs_with_grandchild"], timeout_s=30))
    skipped = r.run(by["after"])
    assert hung["status"] == "timeout" and not hung["cut_by_deadline"]
    assert cut["status"] == "timeout" and cut["cut_by_deadline"]
    assert skipped["status"] == "skipped" and skipped["cut_by_deadline"]
    command = gc.cli.rerun_command(r.record["checks"], tmp_path / "record.json")
    assert command == "python3 benchmarks/gpu_check --only env,hangs_with_grandchild,after --json record-rest.json"
    assert gc.cli.rerun_command([hung], tmp_path / "record.json") is None


def test_sigterm_records_the_running_check_and_stops(tmp_path):
    """The machine may be taken back mid-run: the record still says what ran and what was cut short."""
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--dry-run",
            "--only",
            "compile_loss,throughput_32x512_eager",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(1200):  # until env is recorded and compile_loss (seconds of tracing) has started
            if out.is_file() and json.loads(out.read_text(encoding="utf-8"))["checks"]:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    record = json.loads(out.read_text(encoding="utf-8"))
    assert proc.returncode == 1, output
    assert not record["finished"]
    assert [c["name"] for c in record["checks"]] == ["env", "compile_loss"]  # the last never started
    cut = record["checks"][-1]
    assert cut["status"] == "timeout" and "interrupted (SIGTERM)" in cut["error"][0]


def test_env_on_a_cuda_device_finds_the_peak_row(tmp_path, monkeypatch):
    """The env check's CUDA branch, on a faked H200 (the first GPU run failed there: it unpacked GPU_PEAK_FLOPS, a
    dict of rows, as pairs, and the run stopped for want of ``cuda_available``)."""
    import torch

    from gptcli.system.runtime import GPU_PEAK_FLOPS

    gc = load_script()
    props = type("Props", (), {"total_memory": 141 * 2**30})()
    for name, value in {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "get_device_name": lambda i=0: "NVIDIA H200",
        "get_device_properties": lambda i=0: props,
        "get_device_capability": lambda i=0: (9, 0),
        "is_bf16_supported": lambda: True,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    precision = torch.get_float32_matmul_precision()
    try:
        res = gc.runner.run_check("env", False, str(tmp_path), None)
    finally:
        torch.set_float32_matmul_precision(precision)  # Ctx configures CUDA's backends: keep the CPU's as they were
    assert res["status"] == "ok", res
    figures = res["figures"]
    assert figures["cuda_available"] is True and figures["peak_table_key"] == "NVIDIA H200"
    assert figures["peak_flops"] == GPU_PEAK_FLOPS["NVIDIA H200"] and figures["capability"] == "9.0"


def test_kernel_groups_sort_the_h200_runs_kernels():
    """step_profile's grouping on the kernel names the first H200 run recorded (an eager bf16 update at 8×512)."""
    gc = load_script()
    record = json.loads((REPO / "docs/performance/h200_gpu_check_8x512_32x512.json").read_text(encoding="utf-8"))
    kernels = next(c for c in record["checks"] if c["name"] == "attention_kernel")["figures"]["top_kernels"]
    kernels = [k for k in kernels if "#" not in k["kernel"]]  # that run still listed the optimizer's annotation
    groups = gc.profiling.kernel_groups(kernels)
    assert groups["matmul"]["calls"] == 3 + 36  # the three CUTLASS sm80 products and Hopper's nvjet ones
    assert groups["attention"]["calls"] == 12 and groups["optimizer"]["calls"] == 9 and groups["loss"]["calls"] == 2
    assert sum(g["ms"] for g in groups.values()) == pytest.approx(sum(k["ms"] for k in kernels), abs=1e-6)
    assert list(groups) == sorted(groups, key=lambda g: -groups[g]["ms"])


@pytest.mark.parametrize("default", [(), ("cuda",), ("cpu", "cuda")])
def test_a_timed_pair_sets_both_arms_whatever_the_librarys_default(default):
    """``timing.naming`` names the device in one arm and not in the other, whatever the library ships: once ``"cuda"``
    became ``tied.PADDED_HEAD_DEVICES``'s default, the old helper (which only added the device, None meaning "as it
    is") would have timed the padded product against itself. Other devices named stay named, and the default comes
    back afterwards."""
    gc = load_script()
    holder = argparse.Namespace(DEVICES=default)
    with gc.timing.naming(holder, "DEVICES", "cuda", True):
        assert "cuda" in holder.DEVICES and set(default) <= set(holder.DEVICES)
    with gc.timing.naming(holder, "DEVICES", "cuda", False):
        assert "cuda" not in holder.DEVICES and set(default) - {"cuda"} <= set(holder.DEVICES)
    assert holder.DEVICES == default


def test_the_sync_line_names_places_only_when_there_are_any():
    """The H200's clean run read "0 syncs per update at -"; now "0 syncs per update", and the places when any."""
    gc = load_script()
    assert gc.check_device.sync_note(0, 4, {}, 0) == "0 syncs per update"
    assert (
        gc.check_device.sync_note(6, 4, {"trainer.py:90": 4, "loop.py:12": 2}, 2)
        == "1.5 syncs per update at trainer.py:90 ×1, loop.py:12 ×0.5 + 0.5 in the backward pass"
    )


def test_kept_gradients_give_the_trainers_update(tmp_path):
    """cudagraphs_training's candidate arm (gradients kept and zeroed in place, not freed: the Trainer's keep_grads,
    as --compile-mode reduce-overhead sets it) must be the same update as the default, or a difference on the GPU
    would not be the graphs'. The check's trainer passes it on. Eager, CPU, two micro-batches."""
    import torch

    from gptcli.model.build import build_model, preset

    gc = load_script()
    ctx = gc.context.Ctx(dry=True, work=tmp_path, result_path=None)  # CPU, fp32
    data = [torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    results = []
    for kept in (False, True):
        torch.manual_seed(0)
        model = build_model(preset("tiny", vocab_size=64, n_layer=1, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0))
        tr = gc.models.trainer(ctx, model, keep_grads=kept)
        assert tr.keep_grads is kept
        results.append(
            [(float(r.loss), float(r.grad_norm)) for r in (tr.step(i, list(d.chunk(2))) for i, d in enumerate(data))]
        )
        if kept:
            assert all(p.grad is not None and not p.grad.any() for p in model.parameters())  # zeroed, not freed
    assert results[0] == results[1]
