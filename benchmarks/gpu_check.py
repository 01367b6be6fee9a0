"""One-shot GPU check: run it once on a lent CUDA machine, keep the JSON, send it back.

    python benchmarks/gpu_check.py --json gpu_check.json            # the real run (9-14 minutes on an H200)
    python benchmarks/gpu_check.py --dry-run --json dry.json        # every check on CPU, tiny sizes (about a minute)
    python benchmarks/gpu_check.py --only attention_kernel,fused_adamw --json part.json

A lent GPU is there for minutes, so the script is built to waste none of them:

- **Every check is independent.** Each runs in its own process (on the GPU a fresh interpreter: a fork of a server
  that has imported spaCy cannot use CUDA; in the dry run a fork of a server that imported torch once, so a check
  starts in milliseconds), under a per-check timeout and a global ``--deadline`` (default 560 s, inside a
  10-minute command). A check that fails, raises, crashes CUDA, runs out of memory or hangs is recorded, its
  process tree killed, and the next one runs.
- **Nothing is lost.** The JSON record is rewritten atomically when the run starts (environment first) and after
  every check; a check's figures reach it even while the check still runs, so a killed run keeps what it saw.
  Checks the deadline cut short are named at the end, with the ``--only`` command that finishes them in another
  call.
- **The script is known to work.** ``--dry-run`` runs every check on CPU with the ``tiny`` preset; a check that only
  means something on CUDA reports ``skipped`` with the reason (after running its code), never ``ok``.
  tests/benchmarks/test_gpu_check.py runs it.

Checks, cheapest and most telling first, the long throughput runs last (``--list`` prints them): the environment;
the ``--gpus N+1`` refusal; which attention kernel a bf16 training step runs (torch.profiler); fused AdamW; a bf16 and
an fp16 + GradScaler step; what dtype the LSTM computes in under bf16; KV-cache parity of generation and scoring; host
syncs per update; then on real text (docstrings of this Python's standard library, prepared by ``gpt1 prepare``, as
the quickstart does): ``gpt1 pretrain --gpus 1`` against an in-process step, checkpoint → resume, finetune →
eval → zeroshot; then ``torch.compile`` of the loss; CUDA graphs with accumulated micro-batches and under DDP; then
tokens/s, MFU and peak memory of the ``gpt1`` preset at 8×512 (the 8-GPU share of the paper's batch; also with CUDA
graphs) and 64×512 (the paper's batch on one GPU), eager and compiled; where a compiled 64×512 update spends its GPU
time, by kind of kernel; the output product against the padded embedding against the plain one; last 32×512.
What one GPU cannot show is listed in the JSON under ``not_testable_here``. How to read the JSON:
docs/distributed.md, "The one-shot GPU check".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # this checkout's gptcli, not whichever one is installed
    sys.path.insert(0, str(ROOT))

DEFAULT_DEADLINE_S = 560
PAPER_VOCAB = 40478
STATUSES = ("ok", "fail", "skipped", "timeout")
FRESH_ENV = "GPT1_GPU_CHECK_FRESH"
"""Set by ``--fresh-processes``: the dry run's commands, too, start as fresh interpreters (as on the GPU)."""

NOT_TESTABLE = [
    {
        "what": "gradient averaging across GPUs (the NCCL all-reduce with world size > 1)",
        "why": "with one GPU the world size is 1 and DDP's all-reduce is an identity",
    },
    {
        "what": "per-rank device placement (LOCAL_RANK → cuda:N, DDP device_ids, one process per GPU)",
        "why": "only cuda:0 exists",
    },
    {
        "what": "the launcher's heartbeat watchdog and the collective timeout with NCCL peers",
        "why": "needs a second rank to stop responding",
    },
    {
        "what": "all-reduce bandwidth and its overlap with the backward pass; scaling efficiency over 8 GPUs",
        "why": "needs several GPUs (NVLink/NVSwitch)",
    },
    {"what": "multi-node rendezvous (--nodes, --master-addr, --rdzv-endpoint)", "why": "needs several machines"},
]


# --- sizes: the real run and the CPU dry run ----------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """What every check runs at. The real run uses the paper's model; the dry run the same code at toy sizes."""

    preset: str
    lstm_preset: str
    vocab: int
    """Vocabulary of the in-process models (the paper's 40,478 ids on the GPU)."""
    seq: int
    batch: int
    """Sequences per step of the profile, precision, compile and sync checks."""
    updates: int
    """Training updates of the precision, sync and compile checks."""
    throughput: tuple[tuple[int, int], ...]
    """(batch, seq) of the throughput sizes: 8×512 (one GPU's share of 64 over 8), 32×512, and 64×512 (the paper's
    whole batch on one GPU)."""
    warm_steps: int
    timed_steps: int
    modules: int
    """Standard-library modules read for the real-text corpus."""
    text_root: str | None
    """A package folder of the standard library to read instead of all of it (the dry run: walking the whole
    library, site-packages included, takes seconds before the first docstring)."""
    corpus_vocab: int
    pt_preset: str
    """Preset of the launched-vs-in-process and resume runs (with the corpus's vocabulary)."""
    pt_seq: int
    pt_batch: int
    compile_backend: str
    """inductor on the GPU (what ``--compile`` uses); aot_eager on CPU, which traces the same graphs (breaks and
    recompiles included) without minutes of C++ compilation."""
    throughput_backend: str
    """The throughput runs' backend: inductor on the GPU; on CPU plain eager, the cheapest trace that still runs
    the compiled code path."""
    n_layer: int | None
    """Transformer blocks of the in-process models (None: the preset's)."""
    compile_layers: int
    """Blocks of the compile_loss check's model (the throughput checks compile the whole preset)."""
    resume_layers: int
    """Blocks of the resume check's runs: checkpoints of the full model (1.4 GB with AdamW's moments) take seconds
    each to write and hash, and the state being checked (RNG, optimizer step) is the same at any depth."""


REAL = Sizes(
    preset="gpt1",
    lstm_preset="lstm",
    vocab=PAPER_VOCAB,
    seq=512,
    batch=8,
    updates=4,
    throughput=((8, 512), (32, 512), (64, 512)),
    warm_steps=3,
    timed_steps=30,
    modules=150,
    text_root=None,
    corpus_vocab=4000,
    pt_preset="gpt1",
    pt_seq=256,
    pt_batch=8,
    compile_backend="inductor",
    throughput_backend="inductor",
    n_layer=None,
    compile_layers=2,
    resume_layers=2,
)
DRY = Sizes(
    preset="tiny",
    lstm_preset="lstm-tiny",
    vocab=512,
    seq=64,
    batch=2,
    updates=2,
    throughput=((2, 64), (4, 64), (8, 64)),
    warm_steps=1,
    timed_steps=2,
    modules=40,
    text_root="email",
    corpus_vocab=400,
    pt_preset="tiny",
    pt_seq=32,
    pt_batch=4,
    compile_backend="aot_eager",
    throughput_backend="eager",
    n_layer=1,
    compile_layers=1,
    resume_layers=1,
)


# --- what a check sees ---------------------------------------------------------------------------------------------


class Skipped(Exception):
    """The check ran what it could but its result means nothing here (e.g. a CUDA kernel on CPU)."""


class Failed(Exception):
    """The check ran and what it measured is not what gpt1 expects."""


class Ctx:
    """A check's view of the run: device, sizes, the shared work folder and ``record`` for its figures."""

    def __init__(self, dry: bool, work: Path, result_path: Path | None) -> None:
        import torch

        self.dry = dry
        self.sizes = DRY if dry else REAL
        self.work = work
        self.result_path = result_path
        self.figures: dict[str, Any] = {}
        self.cuda = torch.cuda.is_available() and not dry
        self.device = torch.device("cuda" if self.cuda else "cpu")
        # bf16 autocast is what `--precision auto` picks on a bf16 GPU; fp32 keeps the CPU dry run quick everywhere.
        self.precision = "bf16" if self.cuda else "fp32"
        if self.cuda:
            from gptcli.runtime import configure_backends

            configure_backends(self.device)

    def record(self, **figures: Any) -> None:
        """Add figures and write them out at once, so that a check killed later still reports them."""
        self.figures.update(figures)
        if self.result_path is not None:
            write_json_atomic(self.result_path, {"status": "running", "figures": self.figures})

    def need_cuda(self, why: str) -> None:
        """End a check whose figures only mean something on CUDA (its code has run by now)."""
        if not self.cuda:
            raise Skipped(why)

    def cli(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """``gpt1 ARGS`` in a process of its own, from this checkout; its output goes into the check's log.

        On the GPU a fresh ``python -m gptcli``. In the dry run a fork of this process (torch and gptcli are
        imported already), which saves seconds of imports per command on a slow CPU; on the GPU that is no
        option, since a fork cannot use CUDA once its parent has touched it."""
        t0 = time.perf_counter()
        fork = self.dry and not os.environ.get(FRESH_ENV)
        proc = (forked_cli if fork else fresh_cli)(list(args), self.work, timeout)
        print(
            f"$ gpt1 {' '.join(args)}\n(exit {proc.returncode}, {time.perf_counter() - t0:.1f} s)\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}",
            flush=True,
        )
        if check and proc.returncode != 0:
            raise Failed(f"gpt1 {args[0]} exited with {proc.returncode}:\n{tail(proc.stderr, 25)}")
        return proc


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


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write ``doc`` to a temporary file beside ``path`` and rename it over: a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(finite(doc), f, indent=1, default=str, allow_nan=False)  # a NaN loss is a finding, not a crash
        f.write("\n")
    os.replace(tmp, path)


def finite(x: Any) -> Any:
    """JSON has no NaN/inf: write them as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


# --- shared pieces of the in-process checks ------------------------------------------------------------------------


def build(ctx: Ctx, preset: str | None = None, vocab: int | None = None, **overrides: Any):
    """A freshly initialised model of ``preset`` (default: the run's) on the device, seeded."""
    import torch

    from gptcli.model.build import build_model
    from gptcli.model.build import preset as make_preset

    name = preset or ctx.sizes.preset
    if ctx.sizes.n_layer and not name.startswith("lstm"):
        overrides.setdefault("n_layer", ctx.sizes.n_layer)
    torch.manual_seed(0)
    cfg = make_preset(name, vocab_size=vocab or ctx.sizes.vocab, **overrides)
    return build_model(cfg).to(ctx.device)


def trainer(ctx: Ctx, model, precision: str | None = None, loss_fn: Callable | None = None):
    """A Trainer as pretraining builds it: fused AdamW (make_optimizer), lm_loss, clipping 1.0, constant lr."""
    from gptcli.train.optim import make_optimizer
    from gptcli.train.pretrain import lm_loss
    from gptcli.train.trainer import Trainer

    opt = make_optimizer(model, 2.5e-4)
    return Trainer(
        model,
        opt,
        loss_fn or lm_loss,
        lambda s: 2.5e-4,
        device=ctx.device,
        precision=precision or ctx.precision,
        grad_clip=1.0,
    )


def batches(ctx: Ctx, n: int, b: int, t: int, vocab: int | None = None, seed: int = 0) -> list:
    """``n`` batches of ``b`` windows of ``t + 1`` ids on the device. Random ids: kernels, dtypes and speed do not
    depend on the text (the checks whose numbers do depend on it use the real-text corpus)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab or ctx.sizes.vocab, (b, t + 1), generator=g).to(ctx.device) for _ in range(n)]


def sync(ctx: Ctx) -> None:
    import torch

    if ctx.cuda:
        torch.cuda.synchronize()


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def profile_step(ctx: Ctx, step: Callable[[], Any]):
    """A torch.profiler trace of one call of ``step`` (CPU ops, and CUDA kernels on the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    with profile(activities=activities) as prof:
        step()
        sync(ctx)
    return prof


def op_names(prof) -> dict[str, int]:
    """Names of every profiled event (CPU ops and device kernels) with their counts."""
    out: dict[str, int] = {}
    for e in prof.key_averages():
        out[e.key] = out.get(e.key, 0) + int(e.count)
    return out


def device_time_us(e) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        v = getattr(e, attr, None)
        if v:
            return float(v)
    return 0.0


def cuda_kernels(prof, top: int = 12) -> list[dict[str, Any]]:
    """The device kernels that took the most time, name shortened, with milliseconds and calls."""
    from torch.autograd import DeviceType

    # A record_function range (the optimizer's "Optimizer.step#AdamW.step") is listed on the device too, over the
    # kernels it holds: a user annotation, not a kernel, so not counted twice.
    rows = [
        (device_time_us(e), e.key, int(e.count))
        for e in prof.key_averages()
        if getattr(e, "device_type", None) == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    rows.sort(reverse=True)
    return [{"kernel": k[:160], "ms": round(us / 1000, 3), "calls": c} for us, k, c in rows[:top]]


def matching(names: dict[str, int], pattern: str) -> dict[str, int]:
    rx = re.compile(pattern, re.IGNORECASE)
    return {k[:160]: v for k, v in names.items() if rx.search(k)}


# --- the checks ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[Ctx], str]
    """Runs the check, records figures through ``ctx.record``; returns a one-line note (raises Skipped/Failed)."""
    timeout_s: int
    """Per-check limit on the GPU (the dry run's own limit is the same)."""
    what: str


CHECKS: list[Check] = []


def check(name: str, timeout_s: int, what: str) -> Callable:
    def register(fn: Callable[[Ctx], str]) -> Callable[[Ctx], str]:
        CHECKS.append(Check(name, fn, timeout_s, what))
        return fn

    return register


@check("env", 60, "versions, the GPU, gptcli.runtime's peak-FLOPs row for it, CPUs, the git commit")
def check_env(ctx: Ctx) -> str:
    import torch

    import gptcli
    from gptcli.runtime import GPU_PEAK_FLOPS

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "gptcli": getattr(gptcli, "__version__", None),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    ctx.record(**info)  # what is known before the first CUDA call: the runner reads cuda_available from here
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = torch.cuda.get_device_name(0)
        # The row gpt1's MFU reads (runtime.peak_for_gpu_name: the exact device name), with its peaks per precision.
        key = name.strip() if name.strip() in GPU_PEAK_FLOPS else None
        info.update(
            gpu_count=torch.cuda.device_count(),
            gpu=name,
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            bf16_supported=torch.cuda.is_bf16_supported(),
            nccl=nccl_version(),
            driver=nvidia_smi_driver(),
            peak_table_key=key,
            peak_flops=dict(GPU_PEAK_FLOPS[key]) if key else None,
            sdpa_backends={
                b: getattr(torch.backends.cuda, f"{b}_sdp_enabled")()
                for b in ("flash", "mem_efficient", "math", "cudnn")
                if hasattr(torch.backends.cuda, f"{b}_sdp_enabled")
            },
        )
    ctx.record(**info)
    if ctx.cuda and info.get("peak_table_key") is None:
        raise Failed(f"{info['gpu']!r} matches no row of gptcli.runtime.GPU_PEAK_FLOPS: MFU will read n/a")
    if not ctx.cuda:
        return f"torch {torch.__version__}, no CUDA (dry run), {os.cpu_count()} CPUs"
    return f"{info['gpu']} (table row {info['peak_table_key']!r}), torch {torch.__version__}, CUDA {torch.version.cuda}"


def nccl_version() -> str | None:
    try:
        import torch.cuda.nccl as nccl

        v = nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def nvidia_smi_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


@check("gpus_refusal", 60, "`gpt1 pretrain --gpus N+1` on N GPUs: non-zero exit and one `error:` line")
def check_gpus_refusal(ctx: Ctx) -> str:
    import torch

    n = (torch.cuda.device_count() if torch.cuda.is_available() else 0) + 1
    proc = ctx.cli(
        "pretrain",
        "--data",
        str(ctx.work / "no-corpus"),
        "--out",
        str(ctx.work / "refused"),
        "--preset",
        "tiny",
        "--gpus",
        str(n),
        timeout=60,
        check=False,
    )
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    ctx.record(gpus=n, exit_code=proc.returncode, stderr_lines=len(lines), error=errors[0] if errors else None)
    if proc.returncode == 0 or len(errors) != 1 or "Traceback" in proc.stderr:
        raise Failed(
            f"expected a non-zero exit and one `error:` line, got exit {proc.returncode}:\n{tail(proc.stderr, 10)}"
        )
    ctx.need_cuda("without CUDA `--gpus` refuses for want of any GPU, not for too few (the refusal itself worked)")
    return errors[0]


@check("attention_kernel", 120, "the SDPA kernel a gpt1 bf16 training step runs (causal, dropout 0.1): flash?")
def check_attention_kernel(ctx: Ctx) -> str:
    import torch

    from gptcli.model import kernels as kernel_room

    def gptcli_path() -> str:
        """The path gptcli's attention takes here: SDPA, or the CPU kernel's choice when the kernels are on."""
        if not kernel_room.enabled(ctx.device):
            return "sdpa"
        from gptcli.model.kernels.attention import attention_path

        return attention_path(ctx.device.type, torch.bfloat16, 0.1, ctx.sizes.seq)

    model = build(ctx)
    tr = trainer(ctx, model, precision="bf16")
    data = batches(ctx, 2, ctx.sizes.batch, ctx.sizes.seq)
    tr.step(0, [data[0]])  # warm-up: cuBLAS handles, allocator, lazy inits stay out of the trace
    prof = profile_step(ctx, lambda: tr.step(1, [data[1]]))
    names = op_names(prof)
    sdpa_ops = matching(names, r"scaled_dot_product|flash|efficient_attention|cudnn_attention|_attention_backward")
    kernels = matching(
        {k["kernel"]: k["calls"] for k in cuda_kernels(prof, top=10_000)}, r"flash|fmha|attention|attn|sdpa|mha"
    )
    ctx.record(
        gptcli_path=gptcli_path(),
        aten_ops=sdpa_ops,
        attention_kernels=kernels,
        top_kernels=cuda_kernels(prof),
        batch=ctx.sizes.batch,
        seq=ctx.sizes.seq,
    )
    ctx.need_cuda("flash attention is a CUDA kernel; on CPU gptcli writes attention out (chunked/plain path)")
    # Any fused (flash-style) backend passes: PyTorch picks among them by GPU and version (on an H200 under torch
    # 2.11 it picked cuDNN's sm90 flash kernels over FlashAttention-2, 2026-12-04); the math fallback (the (T, T)
    # scores in memory) fails.
    fused = {
        b: (
            any(f"_{b}_attention_forward" in k for k in sdpa_ops),
            any(f"_{b}_attention_backward" in k for k in sdpa_ops),
        )
        for b in ("flash", "cudnn", "efficient")
    }
    both = [b for b, (fwd, bwd) in fused.items() if fwd and bwd]
    ctx.record(fused_backend=both[0] if both else None)
    if not both:
        raise Failed(f"training ran no fused attention kernel forward and backward; SDPA ops: {sorted(sdpa_ops)}")
    return f"{both[0]} attention forward + backward; kernels: {', '.join(list(kernels)[:3])}"


@check("fused_adamw", 90, "make_optimizer's AdamW is the fused implementation (defaults and the profiled op)")
def check_fused_adamw(ctx: Ctx) -> str:
    model = build(ctx)
    tr = trainer(ctx, model)
    data = batches(ctx, 2, ctx.sizes.batch, ctx.sizes.seq)
    tr.step(0, [data[0]])
    prof = profile_step(ctx, lambda: tr.step(1, [data[1]]))
    names = op_names(prof)
    fused_ops = matching(names, r"_fused_adamw|fused_adam|FusedAdam")
    steps = {str(s["step"].device) for s in tr.optimizer.state.values() if "step" in s}
    ctx.record(
        defaults_fused=tr.optimizer.defaults.get("fused"),
        defaults_foreach=tr.optimizer.defaults.get("foreach"),
        fused_ops=fused_ops,
        step_tensor_devices=sorted(steps),
        other_optimizer_ops=matching(names, r"_foreach_|adamw"),
    )
    if not tr.optimizer.defaults.get("fused") or not any("_fused_adamw" in k for k in fused_ops):
        raise Failed(f"AdamW is not fused: defaults fused={tr.optimizer.defaults.get('fused')}, ops {fused_ops}")
    if ctx.cuda and steps != {str(next(model.parameters()).device)}:
        raise Failed(f"fused AdamW's step tensors are on {sorted(steps)}, not on the parameters' device")
    return (
        f"fused (aten::_fused_adamw_ ×{sum(v for k, v in fused_ops.items() if '_fused_adamw' in k)}), "
        f"step on {', '.join(sorted(steps))}"
    )


@check("precision_steps", 120, "bf16 autocast updates and fp16 + GradScaler updates: finite losses, scaler scale")
def check_precision_steps(ctx: Ctx) -> str:
    n = ctx.sizes.updates
    data = batches(ctx, n, ctx.sizes.batch, ctx.sizes.seq)
    bf16 = trainer(ctx, build(ctx), precision="bf16")
    res = [bf16.step(i, [d]) for i, d in enumerate(data)]
    losses = [float(r.loss) for r in res]
    ctx.record(bf16_losses=finite(losses), bf16_grad_norms=finite([float(r.grad_norm) for r in res]))
    if not all(math.isfinite(x) for x in losses):
        raise Failed(f"bf16 losses not finite: {losses}")
    ctx.need_cuda(
        "fp16 with a GradScaler is CUDA-only in gpt1 (resolve_precision refuses fp16 on CPU); the bf16 updates ran"
    )
    fp16 = trainer(ctx, build(ctx), precision="fp16")
    scales = [fp16.scaler.get_scale()]
    res16 = []
    for i, d in enumerate(data):
        res16.append(fp16.step(i, [d]))
        scales.append(fp16.scaler.get_scale())
    losses16 = [float(r.loss) for r in res16]
    norms16 = [float(r.grad_norm) for r in res16]
    skipped = sum(not math.isfinite(g) for g in norms16)
    ctx.record(
        fp16_losses=finite(losses16), fp16_grad_norms=finite(norms16), fp16_scales=scales, fp16_skipped_updates=skipped
    )
    if not all(math.isfinite(x) for x in losses16):
        raise Failed(f"fp16 losses not finite: {losses16}")
    if skipped == len(norms16):
        raise Failed(f"every fp16 update was skipped by the GradScaler (scales {scales})")
    return (
        f"bf16 loss {losses[-1]:.3f}; fp16 loss {losses16[-1]:.3f}, scale {scales[0]:g} → {scales[-1]:g}, "
        f"{skipped} skipped"
    )


@check("lstm_dtype", 90, "the dtype nn.LSTM computes in when the run asks for bf16 (forward hook on its output)")
def check_lstm_dtype(ctx: Ctx) -> str:
    import torch

    model = build(ctx, preset=ctx.sizes.lstm_preset)
    seen: dict[str, str] = {}

    def hook(module, inputs, output) -> None:
        seen.setdefault("input", str(inputs[0].dtype))
        seen.setdefault("output", str(output[0].dtype))
        seen.setdefault("hidden_state", str(output[1][0].dtype))

    handle = model.lstm.register_forward_hook(hook)
    tr = trainer(ctx, model, precision="bf16")
    data = batches(ctx, 2, ctx.sizes.batch, ctx.sizes.seq)
    sync(ctx)
    t0 = time.perf_counter()
    res = tr.step(0, [data[0]])
    sync(ctx)
    handle.remove()
    ctx.record(
        asked="bf16",
        lstm_input=seen.get("input"),
        lstm_output=seen.get("output"),
        lstm_state=seen.get("hidden_state"),
        weights=str(model.lstm.weight_ih_l0.dtype),
        cudnn=bool(ctx.cuda and torch.backends.cudnn.is_available()),
        loss=float(res.loss),
        step_s=round(time.perf_counter() - t0, 3),
    )
    if not math.isfinite(float(res.loss)):
        raise Failed(f"the LSTM's bf16 loss is {float(res.loss)}")
    from gptcli.model.lstm import recurrent_dtype

    # What gptcli says the layer computes in (fp32 on CUDA: its autocast would make it fp16), and what it did.
    want = str(recurrent_dtype(ctx.device.type, torch.bfloat16))
    ctx.record(expected_output=want)
    if seen.get("output") != want:
        raise Failed(f"asked bf16: the LSTM computed in {seen.get('output')}, gptcli says {want}")
    return f"asked bf16: nn.LSTM got {seen.get('input')}, computed {seen.get('output')} (as gptcli says)"


@check("kv_cache_parity", 120, "generation and scoring with the KV cache against without, fp32 and bf16")
def check_kv_cache_parity(ctx: Ctx) -> str:
    from gptcli.runtime import autocast

    model = build(ctx).eval()
    tol = {"fp32": 2e-3, "bf16": 6e-2}  # logits relative to their largest magnitude; log-probabilities per token
    out: dict[str, Any] = {}
    for precision in ("fp32", "bf16"):
        with autocast(ctx.device, precision):  # type: ignore[arg-type]
            out[precision] = {**logit_parity(ctx, model), **generate_parity(ctx, model)}
        out[precision].update(scoring_parity(ctx, model, precision))
        ctx.record(**out, tolerance=tol)
    bad = [
        f"{p} {k} {v[k]:.2e}"
        for p, v in out.items()
        for k in ("logits_rel_diff", "score_diff_per_token")
        if v[k] > tol[p]
    ]
    if bad:
        raise Failed(f"cached and uncached paths disagree beyond the tolerance: {', '.join(bad)}")
    return ", ".join(
        f"{p}: logits {v['logits_rel_diff']:.1e}, scores {v['score_diff_per_token']:.1e}/token, "
        f"greedy tokens {'equal' if v['greedy_equal'] else 'differ'}"
        for p, v in out.items()
    )


def logit_parity(ctx: Ctx, model) -> dict[str, Any]:
    """Logits at every new position, decoded one token at a time with the cache against one full forward pass."""
    import torch

    from gptcli.model.build import new_cache

    prompt, steps = 16, 24
    ids = torch.randint(0, model.config.vocab_size, (1, prompt + steps), generator=torch.Generator().manual_seed(1))
    ids = ids.to(ctx.device)
    with torch.no_grad():
        dtype = torch.get_autocast_dtype(ctx.device.type) if torch.is_autocast_enabled(ctx.device.type) else None
        cache = new_cache(model, 1, device=ctx.device, dtype=dtype or torch.float32, length=prompt + steps)
        cached = [model.lm_logits(model(ids[:, :prompt], cache)[:, -1:])]
        for i in range(prompt, prompt + steps - 1):
            cached.append(model.lm_logits(model(ids[:, i : i + 1], cache)))
        full = model.lm_logits(model(ids))[:, prompt - 1 : prompt + steps - 1]
    c = torch.cat(cached, dim=1).float()
    f = full.float()
    return {"logits_rel_diff": float((c - f).abs().max() / f.abs().max()), "positions": steps}


def generate_parity(ctx: Ctx, model) -> dict[str, Any]:
    from gptcli.model.generate import SamplingConfig, generate

    prompt = list(range(1, 17))
    runs = {
        use: generate(model, prompt, SamplingConfig(max_new_tokens=24, greedy=True, use_cache=use))
        for use in (True, False)
    }
    first = next((i for i, (a, b) in enumerate(zip(runs[True], runs[False])) if a != b), None)
    # Random weights give near-tied logits, so a greedy token may flip on a rounding difference; the logits above
    # are the test, this is a figure.
    return {"greedy_equal": runs[True] == runs[False], "greedy_first_difference": first}


def scoring_parity(ctx: Ctx, model, precision: str) -> dict[str, Any]:
    """score() through its cached path (a shared 80-token context) against the same requests as plain rows."""
    import torch

    from gptcli.eval.scoring import Request, score

    g = torch.Generator().manual_seed(2)
    vocab = model.config.vocab_size
    context = torch.randint(0, vocab, (80,), generator=g).tolist()
    reqs = [Request.of(context, torch.randint(0, vocab, (5,), generator=g).tolist()) for _ in range(4)]
    cached = score(model, reqs, precision=precision, cache_min_context=8)  # type: ignore[arg-type]
    plain = score(model, reqs, precision=precision, cache_min_context=10**9)  # type: ignore[arg-type]
    diff = max(abs(a.logprob - b.logprob) / max(a.count, 1) for a, b in zip(cached, plain))
    return {
        "score_diff_per_token": diff,
        "scores_cached": [round(s.logprob, 4) for s in cached],
        "scores_plain": [round(s.logprob, 4) for s in plain],
    }


@check(
    "packed_finetune",
    180,
    "a fine-tuning update on RTE-like ragged sequences, packed (the default layout) "
    "against padded: same loss, speed of each; on CUDA also the packed row's attention as jagged nested tensors "
    "(packed.JAGGED_DEVICES) against the grid: same loss, speed of each",
)
def check_packed_finetune(ctx: Ctx) -> str:
    import random

    import torch

    from gptcli.data.batching import collate, collate_packed
    from gptcli.data.transforms import Encoded
    from gptcli.model import packed as packing
    from gptcli.model.classifier import FinetuneModel
    from gptcli.model.heads import HeadConfig, TaskHead
    from gptcli.train.finetune_job import TaskLoss

    body = build(ctx, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)  # no dropout: the two layouts must agree
    body.add_special_tokens(3)
    extract = body.config.total_vocab - 1
    model = FinetuneModel(
        body,
        TaskHead(HeadConfig(kind="entailment", n_embd=body.config.n_embd, n_labels=2, extract_id=extract, pdrop=0.0)),
    ).to(ctx.device)
    rng = random.Random(0)
    n, top = (32, ctx.sizes.seq) if ctx.cuda else (8, ctx.sizes.seq)
    # RTE's random batches: lengths spread from a few dozen tokens to the context (61% of positions padding).
    enc = [
        Encoded(
            [[rng.randrange(ctx.sizes.vocab) for _ in range(rng.randint(top // 8, top - 1))] + [extract]],
            label=i % 2,
            index=i,
        )
        for i in range(n)
    ]
    padded, packed = collate(enc).to(ctx.device), collate_packed(enc, extract).to(ctx.device)
    ctx.record(sequences=n, real_fraction=round(packed.packing.tokens / padded.ids.numel(), 3))
    # (name, batch, the packed row's attention as jagged nested tensors): the jagged path only where CUDA runs it.
    variants = [("padded", padded, False), ("packed", packed, False)]
    nested = _nested_causal(ctx)
    ctx.record(nested_causal_sdpa=nested)
    if ctx.cuda and nested.startswith("runs"):
        variants.append(("packed_jagged", packed, True))
    losses = {}
    for name, b, jagged in variants:  # the same weights: compare before any update
        with _naming(packing, "JAGGED_DEVICES", ctx.device.type, jagged), torch.no_grad():
            losses[name] = float(TaskLoss(0.5)(model, b))
        ctx.record(**{f"loss_{name}": losses[name]})
        if rel(losses[name], losses["padded"]) > 1e-4:
            raise Failed(f"{name} loss {losses[name]} differs from padded {losses['padded']}")
    notes = []
    # fp32 (TF32 on CUDA) as the figures of the first GPU run; bf16 autocast too where CUDA runs it (fine-tuning's
    # `--precision auto` there). The fp32 keys keep their names; the bf16 ones end in _bf16.
    for precision in ("fp32", "bf16") if ctx.cuda else ("fp32",):
        tr = trainer(ctx, model, precision=precision, loss_fn=TaskLoss(0.5))
        end = "" if precision == "fp32" else f"_{precision}"
        times = {}
        for name, b, jagged in variants:
            with _naming(packing, "JAGGED_DEVICES", ctx.device.type, jagged):
                times[name] = _timed_updates(ctx, tr, [b], timed=8, warm=2)
        ctx.record(
            **{f"update_s_{name}{end}": round(t, 4) for name, t in times.items()},
            **{f"speedup{end}": round(times["padded"] / times["packed"], 2)},
        )
        note = f"{precision}: packed {times['padded'] / times['packed']:.2f}× padded"
        if "packed_jagged" in times:  # > 1: the jagged path is the faster, and packed.JAGGED_DEVICES should name it
            ctx.record(**{f"jagged_vs_grid{end}": round(times["packed"] / times["packed_jagged"], 3)})
            note += f", jagged attention {times['packed'] / times['packed_jagged']:.2f}× the grid's"
        notes.append(note)
    return f"{'; '.join(notes)} per update (losses equal), real tokens {packed.packing.tokens / padded.ids.numel():.0%}"


@contextlib.contextmanager
def _naming(module, attr: str, device_type: str, named: bool):
    """``module.<attr>``, a tuple of device types, naming ``device_type`` (``named``) or not inside the block, whatever
    the library's default: a check that times a path against the other sets both arms itself."""
    saved = getattr(module, attr)
    others = tuple(d for d in saved if d != device_type)
    setattr(module, attr, (*others, device_type) if named else others)
    try:
        yield
    finally:
        setattr(module, attr, saved)


def _nested_causal(ctx: Ctx) -> str:
    """Whether the packed rows' jagged attention (``packed._jagged_attention``: causal SDPA over jagged nested
    tensors, the candidate variable-length path on CUDA) runs here and equals attention per sequence (on CPU
    PyTorch has no causal kernel for it)."""
    import torch
    import torch.nn.functional as F

    from gptcli.model.packed import Packing, _jagged_attention

    lengths = [37, 5, 120]
    x = torch.randn(sum(lengths), 3, 4, 64, device=ctx.device)  # each token's q, k, v: 4 heads of 64
    try:
        dtype = torch.bfloat16 if ctx.cuda else torch.float32
        with torch.autocast(ctx.device.type, dtype=dtype, enabled=ctx.cuda):
            got = _jagged_attention(x, 0.0, Packing.of([[0] * n for n in lengths])).float()
            want = torch.cat(
                [
                    F.scaled_dot_product_attention(*s.permute(1, 2, 0, 3), is_causal=True).transpose(0, 1).float()
                    for s in x.split(lengths)
                ]
            )
        return f"runs, max difference {float((got - want).abs().max()):.1e}"
    except Exception as e:  # noqa: BLE001 - the answer is what went wrong
        return f"does not run: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


@check("host_syncs", 120, "host-device synchronisations per training update (torch.cuda.set_sync_debug_mode)")
def check_host_syncs(ctx: Ctx) -> str:
    import warnings

    import numpy as np
    import torch

    from gptcli.data.windows import WindowSampler
    from gptcli.train.trainer import split_micro_batches

    b, t = ctx.sizes.batch, ctx.sizes.seq
    tr = trainer(ctx, build(ctx))
    arrays = [np.random.default_rng(0).integers(0, ctx.sizes.vocab, 64 * (t + 1)).astype(np.uint16)]
    sampler = WindowSampler(arrays, t, b, seed=0)

    def update(step: int) -> None:  # what pretrain's _update does: sample, pin, copy, step
        batch = sampler.next_batch()
        if ctx.cuda:
            batch = batch.pin_memory().to(ctx.device, non_blocking=True)
        tr.step(step, split_micro_batches(batch, b))

    update(0)  # warm-up outside the count
    sync(ctx)
    n = ctx.sizes.updates
    where: dict[str, int] = {}
    # A sync on the Python thread (forward, Trainer, optimizer) becomes a Python warning; one on autograd's device
    # thread (the backward pass) has no Python frame and is printed by c10 on stderr: both are counted.
    with warnings.catch_warnings(record=True) as caught, captured_stderr() as err:
        warnings.simplefilter("always")
        if ctx.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(1, n + 1):
                update(i)
            sync(ctx)
        finally:
            if ctx.cuda:
                torch.cuda.set_sync_debug_mode("default")
    printed = [ln for ln in err.text.splitlines() if "synchroniz" in ln.lower()]
    # The mode's own notice ("Synchronization debug mode is a prototype feature…", once per process) is no sync:
    # the first GPU run counted it as one (0.25 per update over 4 updates).
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower() and "prototype feature" not in str(w.message)]
    for w in syncs:
        key = f"{Path(w.filename).name}:{w.lineno}"
        where[key] = where.get(key, 0) + 1
    total = len(syncs) + len(printed)
    ctx.record(
        updates=n,
        sync_warnings=len(syncs),
        printed_sync_warnings=len(printed),
        per_update=total / n,
        where=where,
        messages=sorted({str(w.message).splitlines()[0][:200] for w in syncs}),
        printed=sorted(set(ln[:200] for ln in printed))[:10],
    )
    ctx.need_cuda("set_sync_debug_mode only watches CUDA; the updates ran")
    return sync_note(total, n, where, len(printed))


def sync_note(total: int, n: int, where: dict[str, int], printed: int) -> str:
    """host_syncs' line: syncs per update, where they come from (when any do), those printed by the backward pass."""
    at = f" at {', '.join(f'{k} ×{v / n:g}' for k, v in where.items())}" if where else ""
    return f"{total / n:g} syncs per update{at}" + (f" + {printed / n:g} in the backward pass" if printed else "")


class captured_stderr:  # noqa: N801 - used as a context manager
    """File descriptor 2 into a temporary file for the block (C++ prints included), then back; what it caught is
    in ``text`` and is also copied to the real stderr (the check's log)."""

    def __enter__(self) -> captured_stderr:
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode("utf-8", errors="replace")
        self.file.close()
        sys.stderr.write(self.text)


# --- real text -----------------------------------------------------------------------------------------------------


def corpus_paths(ctx: Ctx) -> tuple[Path, Path]:
    """The prepared corpus and the CoLA-format task folder written by the ``corpus`` check (Skipped without)."""
    corpus, task = ctx.work / "corpus", ctx.work / "task"
    if not (corpus / "manifest.json").is_file() or not (task / "train.tsv").is_file():
        raise Skipped("needs the corpus check's real-text corpus, which did not finish")
    return corpus, task


@check("corpus", 240, "real text: stdlib docstrings → `gpt1 prepare` corpus + a CoLA-format task (as quickstart)")
def check_corpus(ctx: Ctx) -> str:
    # The quickstart's offline text: this Python's standard-library docstrings, nothing downloaded. Held-out
    # modules' prose sentences, as written and word-shuffled, are a CoLA-format task (`--task cola`).
    import sysconfig

    from gptcli.pipelines.quickstart import QuickstartConfig, hold_out, stdlib_documents, task_splits
    from gptcli.tasks import shuffled

    root = Path(sysconfig.get_paths()["stdlib"])
    if ctx.sizes.text_root and (root / ctx.sizes.text_root).is_dir():
        root = root / ctx.sizes.text_root
    docs = stdlib_documents(root, max_modules=ctx.sizes.modules)
    train_docs, held_docs = hold_out(docs, 0.3, seed=0)
    text = ctx.work / "text.jsonl"
    with open(text, "w", encoding="utf-8") as f:
        for module, body in train_docs:
            f.write(json.dumps({"module": module, "text": body}) + "\n")
    _, splits = task_splits(train_docs, held_docs, QuickstartConfig())
    shuffled.write_task_files(splits, ctx.work / "task")
    ctx.record(
        text=f"standard library: {root.name}",
        modules=len(docs),
        characters=sum(len(t) for _, t in train_docs),
        task_examples={k: len(v) for k, v in splits.items()},
    )
    ctx.cli(
        "prepare",
        str(text),
        "--out",
        str(ctx.work / "corpus"),
        "--vocab-size",
        str(ctx.sizes.corpus_vocab),
        "--val-fraction",
        "0.05",
        "--workers",
        "1" if ctx.dry else "0",
        timeout=220,
    )
    from gptcli.data.shards import open_corpus

    manifest = json.loads((ctx.work / "corpus" / "manifest.json").read_text(encoding="utf-8"))
    tokens = {k: v.get("tokens") for k, v in manifest.get("splits", {}).items()}
    vocab = open_corpus(ctx.work / "corpus").tokenizer.vocab_size
    ctx.record(tokens=tokens, vocab_size=vocab)
    return f"{len(train_docs)} modules → {tokens.get('train'):,} training tokens, vocabulary {vocab}"


def pretrain_args(ctx: Ctx, corpus: Path, out: Path, steps: int, *extra: str) -> list[str]:
    s = ctx.sizes
    return [
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(out),
        "--preset",
        s.pt_preset,
        "--seq-len",
        str(s.pt_seq),
        "--batch-size",
        str(s.pt_batch),
        "--max-steps",
        str(steps),
        "--log-every",
        "1",
        "--eval-every",
        "0",
        "--eval-batches",
        "1",
        "--save-every",
        "0",
        "--keep-last",
        "2",
        "--no-verify",
        "--quiet",
        "--device",
        "cuda" if ctx.cuda else "cpu",
        *extra,
    ]


def train_records(run: Path) -> dict[int, dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    recs = [json.loads(x) for x in lines if x.strip()]
    return {r["step"]: r for r in recs if r.get("kind") == "train"}


@check(
    "launched_vs_inprocess",
    180,
    "`gpt1 pretrain --gpus 1` (launcher, NCCL, DDP) against an in-process "
    "Trainer step on real text: losses and gradient norms",
)
def check_launched(ctx: Ctx) -> str:
    corpus, _ = corpus_paths(ctx)
    steps = 3
    launch = ["--gpus", "1"] if ctx.cuda else ["--procs", "1"]
    # fp32 (TF32 matmuls on the GPU) and no dropout: both sides then compute the same function.
    run = ctx.work / "launched"
    ctx.cli(
        *pretrain_args(
            ctx, corpus, run, steps, "--precision", "fp32", "--dropout", "0", "--warmup-steps", "2", *launch
        ),
        timeout=170,
    )
    launched = train_records(run)
    mine = inprocess_updates(ctx, corpus, steps)
    rows = [
        {
            "step": s,
            "loss": launched[s]["loss"],
            "loss_inprocess": mine[s - 1][0],
            "grad_norm": launched[s]["grad_norm"],
            "grad_norm_inprocess": mine[s - 1][1],
        }
        for s in range(1, steps + 1)
    ]
    worst_loss = max(rel(r["loss"], r["loss_inprocess"]) for r in rows)
    worst_norm = max(rel(r["grad_norm"], r["grad_norm_inprocess"]) for r in rows)
    tol = {"loss": 1e-4, "grad_norm": 1e-3}
    ctx.record(
        path=" ".join(launch), updates=rows, max_rel_loss=worst_loss, max_rel_grad_norm=worst_norm, tolerance=tol
    )
    if worst_loss > tol["loss"] or worst_norm > tol["grad_norm"]:
        raise Failed(f"launched and in-process updates differ: loss {worst_loss:.2e}, grad norm {worst_norm:.2e}")
    return f"{' '.join(launch)} vs in-process, {steps} updates: loss {worst_loss:.1e}, grad norm {worst_norm:.1e}"


def inprocess_updates(ctx: Ctx, corpus: Path, steps: int) -> list[tuple[float, float]]:
    """(loss, grad norm) of the first updates as pretrain() computes them, assembled from the library's parts."""
    import torch

    from gptcli.data.shards import open_corpus
    from gptcli.data.windows import WindowSampler
    from gptcli.model.build import build_model
    from gptcli.runtime import configure_backends
    from gptcli.train.optim import lr_at, make_optimizer
    from gptcli.train.pretrain import PretrainConfig, build_model_config, lm_loss, plan_steps
    from gptcli.train.trainer import Trainer, split_micro_batches

    s = ctx.sizes
    cfg = PretrainConfig(
        data=corpus,
        preset=s.pt_preset,
        seq_len=s.pt_seq,
        batch_size=s.pt_batch,
        max_steps=steps,
        warmup_steps=2,
        precision="fp32",
        model={"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0},
    )
    configure_backends(ctx.device)
    data = open_corpus(corpus)
    mcfg = build_model_config(cfg, data.tokenizer.vocab_size)
    sampler = WindowSampler(data.arrays("train"), cfg.seq_len, cfg.batch_size, cfg.seed)
    total = plan_steps(cfg, sampler.steps_per_epoch)
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(ctx.device)
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps, cfg.decay)
    tr = Trainer(
        model,
        opt,
        lm_loss,
        lambda i: lr_at(i, total, cfg.lr, cfg.warmup_steps, cfg.schedule),
        device=ctx.device,
        precision="fp32",
        grad_clip=cfg.grad_clip,
    )
    out = []
    for i in range(steps):
        res = tr.step(i, split_micro_batches(sampler.next_batch().to(ctx.device), cfg.batch_size))
        out.append((float(res.loss), float(res.grad_norm)))
    return out


@check(
    "resume",
    240,
    "checkpoint → resume: next losses equal to an uninterrupted run; CUDA RNG state restored; "
    "the fused optimizer's step tensor on the parameters' device",
)
def check_resume(ctx: Ctx) -> str:
    corpus, _ = corpus_paths(ctx)
    total, stop = 6, 3
    # Dropout on (the CUDA RNG must be restored for the masks to repeat); a constant schedule after warm-up, so that
    # a run of 3 updates and one of 6 share their first learning rates.
    common = (
        "--precision",
        "fp32",
        "--schedule",
        "constant",
        "--warmup-steps",
        "2",
        "--n-layer",
        str(ctx.sizes.resume_layers),
    )
    whole, parts = ctx.work / "resume-whole", ctx.work / "resume-parts"
    ctx.cli(*pretrain_args(ctx, corpus, whole, total, *common), timeout=120)
    ctx.cli(*pretrain_args(ctx, corpus, parts, stop, *common), timeout=120)
    ctx.cli(*pretrain_args(ctx, corpus, parts, total, *common, "--resume"), timeout=120)
    a, b = train_records(whole), train_records(parts)
    rows = [{"step": s, "uninterrupted": a[s]["loss"], "resumed": b[s]["loss"]} for s in range(1, total + 1)]
    noise = max(rel(b[s]["loss"], a[s]["loss"]) for s in range(1, stop + 1))  # the same updates, run twice
    after = max(rel(b[s]["loss"], a[s]["loss"]) for s in range(stop + 1, total + 1))
    ctx.record(
        n_layer=ctx.sizes.resume_layers,
        losses=rows,
        rel_diff_before_stop=noise,
        rel_diff_after_resume=after,
        tolerance=1e-4,
    )
    state = restored_state(ctx, parts / "checkpoints" / f"step-{stop:07d}")
    ctx.record(**state)
    if after > 1e-4:
        raise Failed(f"resumed losses differ from the uninterrupted run by {after:.2e} (before the stop: {noise:.2e})")
    ctx.need_cuda("CUDA RNG state and the fused step tensor's device only exist on CUDA; CPU losses matched")
    if not state["cuda_rng_saved"] or not state["cuda_rng_restored"]:
        raise Failed("the checkpoint's CUDA RNG state was not saved or not restored")
    if state["step_tensor_devices"] != [state["param_device"]]:
        raise Failed(f"restored step tensors on {state['step_tensor_devices']}, params on {state['param_device']}")
    return (
        f"after resume: {after:.1e} (run-to-run before the stop {noise:.1e}); CUDA RNG restored; step on "
        f"{state['param_device']}"
    )


@check(
    "out_of_memory",
    180,
    "a run whose update does not fit (the GPU capped at 1 GiB more than in use): one "
    "OutOfMemory naming "
    "--micro-batch-size, and its advice followed until the run fits and finishes; the memory given back after",
)
def check_out_of_memory(ctx: Ctx) -> str:
    """PyTorch's "CUDA out of memory" inside a real update, turned into gpt1's one line (gptcli/train/run/memory.py)
    with the GPU's figures, and the advice it gives followed until the run fits. The GPU is capped for this process
    (``torch.cuda.set_per_process_memory_fraction``) so that a small run stands for a paper-sized one; the dry run,
    with no memory to cap, refuses micro-batches over 2 sequences in the trainer instead."""
    import gc

    import torch

    from gptcli.train.pretrain import PretrainConfig, pretrain
    from gptcli.train.run.memory import OutOfMemory

    corpus, _ = corpus_paths(ctx)
    s = ctx.sizes
    # The resume check's depth: the finishing run writes a checkpoint, which at 12 blocks takes seconds to hash.
    cfg = PretrainConfig(
        data=corpus,
        out=ctx.work / "oom",
        preset=s.pt_preset,
        model={"n_layer": s.resume_layers},
        seq_len=s.pt_seq,
        batch_size=64,
        max_steps=2,
        warmup_steps=1,
        eval_every=0,
        eval_batches=1,
        save_every=0,
        log_every=1,
        verify_data=False,
        device="cuda" if ctx.cuda else "cpu",
        precision=ctx.precision,
    )
    attempts: list[dict[str, Any]] = []
    with _memory_cap(ctx, gib=1.0):
        micro = None
        for _ in range(8):
            message = _oom_message(lambda: pretrain(dataclasses.replace(cfg, micro_batch_size=micro)), OutOfMemory)
            gc.collect()  # the failed update's tensors, held in reference cycles of its frames, before the next try
            if ctx.cuda:
                torch.cuda.empty_cache()
            attempts.append({"micro_batch_size": micro or cfg.batch_size, "error": message})
            ctx.record(attempts=attempts)
            if message is None:
                break
            advice = re.search(r"pass --micro-batch-size (\d+):", message)
            if advice is None:
                raise Failed(f"the error names no --micro-batch-size: {message}")
            micro = int(advice[1])
    if ctx.cuda:
        ctx.record(allocated_after_gib=round(torch.cuda.memory_allocated() / 2**30, 2))
    first = attempts[0]["error"] or ""
    shape = r"^(cuda:\d|cpu) ran out of memory in update 1 of 2(; [\d.]+ of [\d.]+ GiB in use)? \(pass --micro-batch"
    if not re.match(shape, first):
        raise Failed(f"the first run's error is not the one line expected: {first!r}")
    if attempts[-1]["error"] is not None:
        raise Failed(f"still out of memory after {len(attempts)} runs following the advice")
    sizes = " → ".join(str(a["micro_batch_size"]) for a in attempts)
    ctx.need_cuda("the dry run's trainer refused the large micro-batches itself; the advice was followed")
    if "GiB in use" not in first:
        raise Failed(f"the CUDA error does not say how much memory was in use: {first!r}")
    return f"micro-batches {sizes}: fitted and finished; first error: {first[:160]}"


@contextlib.contextmanager
def _memory_cap(ctx: Ctx, gib: float):
    """This process's GPU allocations capped at ``gib`` more than it holds now (restored after); in the dry run, a
    trainer that raises PyTorch's out-of-memory error for micro-batches over 2 sequences."""
    import torch

    if ctx.cuda:
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        torch.cuda.empty_cache()
        held = torch.cuda.memory_allocated(ctx.device)  # what earlier checks left: the cap comes on top of it
        ctx.record(cap_gib=gib, held_before_gib=round(held / 2**30, 2))
        torch.cuda.set_per_process_memory_fraction(min(1.0, (held + gib * 2**30) / total), ctx.device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, ctx.device)
        return
    from gptcli.train.trainer import Trainer

    real = Trainer.step

    def step(self, i, micro_batches):
        if max(len(mb) for mb in micro_batches) > 2:
            raise torch.OutOfMemoryError("CPU stand-in: out of memory (the dry run's cap)")
        return real(self, i, micro_batches)

    Trainer.step = step
    try:
        yield
    finally:
        Trainer.step = real


def _oom_message(run: Callable[[], Any], error: type) -> str | None:
    """``run()``; the message of the ``error`` it raised, else None. Only the text leaves this frame: the exception's
    traceback holds the failed update's tensors, which must be freed before the next attempt."""
    try:
        run()
    except error as e:
        return str(e)
    return None


def restored_state(ctx: Ctx, path: Path) -> dict[str, Any]:
    """Restore a checkpoint's optimizer and RNG state into a fresh model here and look at what came back."""
    import torch

    from gptcli import checkpoint as ckpt
    from gptcli.train.optim import make_optimizer
    from gptcli.train.run.training_state import read_training_state, restore_training_state

    saved = ckpt.load_checkpoint(path, map_location=ctx.device, load_tokenizer=False, verify=False)
    model = saved.model.to(ctx.device)
    opt = make_optimizer(model, 2.5e-4)
    doc, tensors = read_training_state(path, verify=False)
    cuda_saved = "rng.torch_cuda.0" in tensors
    if ctx.cuda:
        torch.cuda.manual_seed_all(12345)  # something else, so that equality below means "restored"
    restore_training_state(doc, tensors, opt)
    restored = bool(ctx.cuda and cuda_saved and torch.equal(torch.cuda.get_rng_state(0), tensors["rng.torch_cuda.0"]))
    steps = sorted({str(s["step"].device) for s in opt.state.values() if "step" in s})
    return {
        "cuda_rng_saved": cuda_saved,
        "cuda_rng_restored": restored,
        "optimizer_fused": opt.defaults.get("fused"),
        "step_tensor_devices": steps,
        "param_device": str(next(model.parameters()).device),
    }


@check(
    "finetune_eval_zeroshot",
    240,
    "`gpt1 pretrain` (tiny) → `finetune --task cola` → `eval` → `zeroshot` on the real-text CoLA-format task",
)
def check_finetune_eval_zeroshot(ctx: Ctx) -> str:
    corpus, task = corpus_paths(ctx)
    device = "cuda" if ctx.cuda else "cpu"
    steps = 4 if ctx.dry else 30
    pre, ft, ev, zs = (ctx.work / f"e2e-{n}" for n in ("pretrain", "finetune", "eval", "zeroshot"))
    seconds: dict[str, float] = {}

    def timed(name: str, *args: str) -> None:
        t0 = time.perf_counter()
        ctx.cli(*args, timeout=200)
        seconds[name] = round(time.perf_counter() - t0, 1)
        ctx.record(seconds=seconds)

    timed(
        "pretrain",
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(pre),
        "--preset",
        "tiny",
        "--seq-len",
        "64",
        "--batch-size",
        "8",
        "--max-steps",
        str(steps),
        "--warmup-steps",
        "2",
        "--lr",
        "1e-3",
        "--eval-every",
        "0",
        "--eval-batches",
        "2",
        "--no-verify",
        "--quiet",
        "--device",
        device,
    )
    limit = (
        ["--max-train-examples", "16", "--max-eval-examples", "8"]
        if ctx.dry
        else ["--max-train-examples", "256", "--max-eval-examples", "64"]
    )
    timed(
        "finetune",
        "finetune",
        "--task",
        "cola",
        "--init",
        str(pre),
        "--out",
        str(ft),
        "--data-dir",
        str(task),
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--lr",
        "5e-4",
        *limit,
        "--device",
        device,
        "--quiet",
    )
    timed(
        "eval",
        "eval",
        "--checkpoint",
        str(ft),
        "--task",
        "cola",
        "--split",
        "dev",
        "--data-dir",
        str(task),
        "--out",
        str(ev),
        "--max-examples",
        "8" if ctx.dry else "64",
        "--device",
        device,
        "--precision",
        "auto",
    )
    timed(
        "zeroshot",
        "zeroshot",
        "--task",
        "cola",
        "--checkpoint",
        str(pre),
        "--data-dir",
        str(task),
        "--split",
        "dev",
        "--limit",
        "8" if ctx.dry else "64",
        "--out",
        str(zs),
        "--device",
        device,
    )
    # eval writes one folder per checkpoint and task under --out (e2e-eval/e2e-finetune/cola-dev/results.json).
    evaluated = sorted(ev.rglob("results.json"))
    scores = {
        "finetune_dev": read_scores(ft / "results.json"),
        "eval_dev": read_scores(evaluated[0]) if evaluated else None,
        "zeroshot_dev": read_scores(zs / "results.json"),
    }
    ctx.record(scores=scores)
    return f"all four commands ran on {device} ({sum(seconds.values()):.0f} s)"


def read_scores(path: Path) -> Any:
    """The numbers of a results.json (whatever its layout), or None when it is missing."""
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))

    def numbers(x: Any, depth: int = 0) -> Any:
        if isinstance(x, dict) and depth < 4:
            kept = {k: numbers(v, depth + 1) for k, v in x.items() if k not in ("predictions", "config", "history")}
            return {k: v for k, v in kept.items() if v not in (None, {}, [])}
        return finite(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    return numbers(doc)


# --- compile and throughput ----------------------------------------------------------------------------------------


def dynamo_counts() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "break_reasons": [str(r).splitlines()[0][:200] for r in breaks],
    }


@check(
    "compile_loss",
    240,
    "torch.compile of lm_loss: graph breaks and recompiles (torch._dynamo), loss and gradient norm against eager",
)
def check_compile_loss(ctx: Ctx) -> str:
    import torch
    import torch._dynamo

    from gptcli.runtime import autocast
    from gptcli.train.pretrain import lm_loss

    b, t = ctx.sizes.batch, ctx.sizes.seq
    data = batches(ctx, ctx.sizes.updates, b, t)
    # The preset's widths with fewer blocks: every block is the same code, so breaks and recompiles show in two as
    # in twelve, at a sixth of the compile time (the throughput checks compile all twelve, and count again).
    layers = {"n_layer": ctx.sizes.compile_layers}
    # The training configuration (dropout 0.1) through explain: graph count and every break with its reason.
    model = build(ctx, **layers).train()
    with autocast(ctx.device, ctx.precision):  # type: ignore[arg-type]
        ex = torch._dynamo.explain(lm_loss)(model, data[0])
    ctx.record(
        n_layer=ctx.sizes.compile_layers,
        batch=b,
        seq=t,
        explain={
            "graphs": ex.graph_count,
            "graph_breaks": ex.graph_break_count,
            "break_reasons": [str(r.reason).splitlines()[0][:200] for r in ex.break_reasons],
        },
    )
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()  # what follows counts the compiled training updates alone
    del model
    # Equality needs the same function on both sides: no dropout (compiled dropout draws other masks).
    no_dropout = {**layers, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
    eager, compiled = (
        trainer(ctx, build(ctx, **no_dropout), loss_fn=fn)
        for fn in (lm_loss, torch.compile(lm_loss, backend=ctx.sizes.compile_backend))
    )
    rows, counts = [], []
    for i, d in enumerate(data):
        e = eager.step(i, [d])
        t0 = time.perf_counter()
        c = compiled.step(i, [d])
        sync(ctx)
        rows.append(
            {
                "loss_eager": float(e.loss),
                "loss_compiled": float(c.loss),
                "grad_norm_eager": float(e.grad_norm),
                "grad_norm_compiled": float(c.grad_norm),
                "compiled_step_s": round(time.perf_counter() - t0, 2),
            }
        )
        counts.append(dynamo_counts())
        ctx.record(updates=rows, dynamo=counts[-1])
    # The first update starts from the same weights: loss and gradient norm must agree to the tolerance. Later
    # ones drift apart as the two sides' rounding differences enter the weights: a figure, within 5× the tolerance.
    tol = {"fp32": 1e-4, "bf16": 1e-2}[ctx.precision]
    first = max(
        rel(rows[0]["loss_compiled"], rows[0]["loss_eager"]),
        rel(rows[0]["grad_norm_compiled"], rows[0]["grad_norm_eager"]),
    )
    later = max(rel(r["loss_compiled"], r["loss_eager"]) for r in rows)
    recompiles = counts[-1]["unique_graphs"] - counts[0]["unique_graphs"]
    ctx.record(
        backend=ctx.sizes.compile_backend,
        precision=ctx.precision,
        first_update_rel_diff=first,
        max_rel_loss_diff=later,
        tolerance=tol,
        recompiles_after_first_update=recompiles,
    )
    breaks = max(ex.graph_break_count, counts[-1]["graph_breaks"])
    if first > tol or later > 5 * tol:
        raise Failed(f"compiled vs eager differ: first update {first:.2e}, losses {later:.2e} (tolerance {tol:g})")
    # On CPU gptcli's own dropout (model/dropout.py, keep_mask: random_ and nonzero) is what breaks the graph; the
    # GPU takes F.dropout, so only there do breaks and recompiles say something about `--compile` in training.
    ctx.need_cuda(
        f"compiled with {ctx.sizes.compile_backend} on CPU, where gptcli's CPU dropout breaks the graph "
        f"{breaks} times; the GPU takes F.dropout and inductor (compiled and eager agreed to {first:.1e})"
    )
    problems = []
    if breaks:
        problems.append(f"{breaks} graph break(s): {ctx.figures['explain']['break_reasons'][:3]}")
    if recompiles:
        problems.append(f"{recompiles} recompile(s) after the first update")
    if problems:
        raise Failed("; ".join(problems))
    return (
        f"{ex.graph_count} graph, no breaks, no recompiles; compiled vs eager {first:.1e} (tolerance {tol:g}); "
        f"first update {rows[0]['compiled_step_s']} s"
    )


@check(
    "cudagraphs_training",
    300,
    'CUDA graphs (torch.compile mode="reduce-overhead") in the training '
    "loop's harder cases: 2 micro-batches per update (accumulated gradients) and DDP (one process), with the "
    "gradients freed between updates (as the Trainer does) and kept and zeroed in place: losses and gradient "
    "norms against the same compiled loss without graphs",
)
def check_cudagraphs_training(ctx: Ctx) -> str:
    """What ``throughput_8x512_cudagraphs`` does not show before a ``--compile-mode`` can be offered. With CUDA graph
    trees a graph's outputs live in memory its next replay overwrites, and where a parameter's ``.grad`` is None
    autograd keeps the backward graph's output itself as the gradient: a second micro-batch's backward then adds
    into memory the graphs own (pytorch/pytorch#169545: "accessing tensor output of CUDAGraphs that has been
    overwritten by a subsequent run", open as of torch 2.11). Kept gradients, zeroed in place instead of freed, give
    autograd a buffer of its own to add into: that is the candidate. DDP's gradient buckets are the other case.
    Same weights, no dropout, 4 updates per arm; an arm that raises is recorded, not fatal."""
    import torch

    from gptcli.train.distributed import DDPParallel, DistInfo

    layers = {"n_layer": ctx.sizes.compile_layers, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
    b, t = ctx.sizes.batch, ctx.sizes.seq
    halves = [list(d.chunk(2)) for d in batches(ctx, 4, b, t)]  # each update as two accumulated micro-batches
    arms = (("default", None, False), ("graphs", "reduce-overhead", False), ("graphs_kept", "reduce-overhead", True))
    rows: dict[str, Any] = {}
    with _one_process_group(ctx):
        device = torch.device("cuda", torch.cuda.current_device()) if ctx.cuda else ctx.device  # DDP wants an index
        par = DDPParallel(DistInfo(rank=0, local_rank=0, world_size=1), device)
        for case, wrap in (("accumulated", lambda m: m), ("ddp", par.wrap)):
            for arm, mode, kept in arms:
                tr = trainer(ctx, wrap(build(ctx, **layers)), loss_fn=compiled_loss(ctx, mode))
                if kept:
                    _keep_gradients(tr.optimizer)
                try:
                    res = [tr.step(i, mbs) for i, mbs in enumerate(halves)]
                    rows[f"{case}_{arm}"] = [{"loss": float(r.loss), "grad_norm": float(r.grad_norm)} for r in res]
                except Exception as e:  # noqa: BLE001 - the known failure is a finding to record, not the end
                    rows[f"{case}_{arm}"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                ctx.record(updates=rows)
                del tr
                torch._dynamo.reset()
    tol = {"fp32": 1e-4, "bf16": 1e-3}[ctx.precision]
    diffs = {
        f"{case}_{arm}": _worst_rel(rows[f"{case}_{arm}"], rows[f"{case}_default"])
        for case in ("accumulated", "ddp")
        for arm, _, _ in arms[1:]
    }
    ctx.record(max_rel_diff=diffs, tolerance=tol, micro_batches=2, batch=b, seq=t, n_layer=layers["n_layer"])
    for case in ("accumulated", "ddp"):
        if isinstance(rows[f"{case}_default"], dict):
            raise Failed(f"the compiled loss without graphs failed ({case}): {rows[f'{case}_default']['error']}")
    bad = {k: v for k, v in diffs.items() if k.endswith("_kept") and not (v is not None and v <= tol)}
    ctx.need_cuda("CUDA graphs exist on CUDA only (the same compiled loss ran in every arm)")
    note = ", ".join(f"{k} {'raised' if v is None else f'{v:.1e}'}" for k, v in diffs.items())
    if bad:
        raise Failed(f"CUDA graphs with kept gradients change or break the update: {note} (tolerance {tol:g})")
    return f"graphs against none, 4 updates of 2 micro-batches: {note}"


def _keep_gradients(optimizer) -> None:
    """Every parameter's ``.grad`` allocated (zeros) now and zeroed in place after each update instead of freed."""
    import torch

    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    zero_grad = optimizer.zero_grad
    optimizer.zero_grad = lambda set_to_none=True: zero_grad(set_to_none=False)


def _worst_rel(rows, reference) -> float | None:
    """The largest relative difference of loss or gradient norm between two arms' updates; None if either raised."""
    if isinstance(rows, dict) or isinstance(reference, dict):
        return None
    return max(max(rel(g["loss"], d["loss"]), rel(g["grad_norm"], d["grad_norm"])) for g, d in zip(rows, reference))


@contextlib.contextmanager
def _one_process_group(ctx: Ctx):
    """A process group of this process alone (NCCL on the GPU, gloo on CPU), for DDP as ``--gpus 1`` builds it."""
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if ctx.cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _timed_arms(
    ctx: Ctx, model, module, attr: str, arms: tuple[str, str], runs: tuple[tuple[int, bool], ...]
) -> list[str]:
    """An A/B of ``model``'s updates with ``module.<attr>`` not naming this device (``arms[0]``) and naming it
    (``arms[1]``), for each (throughput size, compiled) of ``runs``: figures ``update_s_<arm>_<label>``,
    ``peak_gib_<arm>_<label>`` (on the GPU) and ``<arms[1]>_vs_<arms[0]>_<label>`` (> 1: the named path is
    faster); returns the ``<label> <gain>×`` notes."""
    import torch

    from gptcli.train.pretrain import lm_loss

    off, on = arms
    notes = []
    for size, compiled in runs:
        b, t = ctx.sizes.throughput[size]
        label = f"{b}x{t}_{'compile' if compiled else 'eager'}"
        data = batches(ctx, 2, b, t)
        for name in arms:
            with _naming(module, attr, ctx.device.type, name == on):
                if ctx.cuda:
                    torch.cuda.reset_peak_memory_stats()
                tr = trainer(ctx, model, loss_fn=compiled_loss(ctx) if compiled else lm_loss)
                seconds = _timed_updates(ctx, tr, data, timed=10)
                peak = torch.cuda.max_memory_allocated() / 2**30 if ctx.cuda else None
                ctx.record(**{f"update_s_{name}_{label}": round(seconds, 5), f"peak_gib_{name}_{label}": peak})
                del tr
        gain = ctx.figures[f"update_s_{off}_{label}"] / ctx.figures[f"update_s_{on}_{label}"]
        ctx.record(**{f"{on}_vs_{off}_{label}": round(gain, 3)})
        notes.append(f"{label} {gain:.2f}×")
    return notes


def _timed_updates(ctx: Ctx, tr, data: list, timed: int, warm: int = 3) -> float:
    """Seconds per update over ``timed`` updates after ``warm`` ones (compilation and autotuning among them)."""
    for i in range(warm):
        tr.step(i, [data[i % len(data)]])
    sync(ctx)
    t0 = time.perf_counter()
    for i in range(timed):
        tr.step(warm + i, [data[i % len(data)]])
    sync(ctx)
    return (time.perf_counter() - t0) / timed


def compiled_loss(ctx: Ctx, mode: str | None = None) -> Callable:
    """``lm_loss`` compiled as ``--compile`` does (inductor on the GPU), in ``mode`` where given (on the GPU only:
    torch.compile takes a mode with inductor alone)."""
    import torch

    from gptcli.train.pretrain import lm_loss

    if mode and ctx.cuda:
        return torch.compile(lm_loss, mode=mode)
    return torch.compile(lm_loss, backend=ctx.sizes.throughput_backend)


def throughput(ctx: Ctx, size: int, compiled: bool, mode: str | None = None) -> str:
    """tokens/s, MFU and peak memory of the run's preset (dropout as in training) at one of the sizes; compiled in
    torch.compile's ``mode`` where given."""
    import torch

    from gptcli.runtime import gpu_peak_flops
    from gptcli.train.pretrain import lm_loss

    b, t = ctx.sizes.throughput[size]
    s = ctx.sizes
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    # On CPU gptcli's own dropout breaks the compiled graph at every use (compile_loss says so), which would make
    # the dry run's trace minutes long: the dry run measures nothing, so it runs without dropout.
    model = build(ctx, **({} if ctx.cuda else {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}))
    loss_fn = compiled_loss(ctx, mode) if compiled else lm_loss
    tr = trainer(ctx, model, loss_fn=loss_fn)
    data = batches(ctx, 4, b, t)
    ctx.record(
        batch=b,
        seq=t,
        precision=ctx.precision,
        compiled=compiled,
        backend=s.throughput_backend if compiled else None,
        mode=mode if compiled and ctx.cuda else None,
        scope="one process, no DDP: a data-parallel run adds DDP's gradient buckets (about one more fp32 copy "
        "of the gradients, 0.47 GB for gpt1) and the all-reduce",
    )
    t0 = time.perf_counter()
    for i in range(s.warm_steps):  # compilation, autotuning and the allocator's first growth
        tr.step(i, [data[i % 4]])
    sync(ctx)
    ctx.record(warmup_s=round(time.perf_counter() - t0, 2), warmup_steps=s.warm_steps)
    t0 = time.perf_counter()
    for i in range(s.timed_steps):
        res = tr.step(s.warm_steps + i, [data[i % 4]])
    sync(ctx)
    dt = time.perf_counter() - t0
    tps = s.timed_steps * b * t / dt
    peak = gpu_peak_flops(ctx.device, ctx.precision) if ctx.cuda else None  # type: ignore[arg-type]
    mfu = tps * model.flops_per_token(t) / peak if peak else None
    mem = torch.cuda.max_memory_allocated() / 2**30 if ctx.cuda else None
    ctx.record(
        tokens_per_s=round(tps, 1),
        step_ms=round(1000 * dt / s.timed_steps, 2),
        mfu=mfu,
        peak_flops=peak,
        max_memory_allocated_gib=mem,
        timed_steps=s.timed_steps,
        last_loss=float(res.loss),
        **({"dynamo": dynamo_counts()} if compiled else {}),
    )
    if not math.isfinite(float(res.loss)):
        raise Failed(f"loss became {float(res.loss)}")
    ctx.need_cuda("tokens/s, MFU and GPU memory only mean something on the GPU (the loop ran)")
    return f"{tps:,.0f} tokens/s, MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}, peak {mem:.1f} GiB"


KERNEL_GROUPS = [  # first match wins: cuDNN's attention kernels are wgmma kernels too
    ("attention", r"sdpa|flash|fmha|attention|attn"),
    ("optimizer", r"adam|multi_tensor_apply"),
    ("loss", r"log_?softmax|nll_loss|cross_entropy"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|wgmma|cublas|matmul"),
    ("copy", r"memcpy|memset|copy_kernel|CatArrayBatched"),
    ("fused elementwise and norms (triton)", r"^triton_"),
]


def kernel_groups(kernels: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """GPU milliseconds and calls per kind of kernel (KERNEL_GROUPS, by name; "other" for the rest)."""
    out: dict[str, dict[str, float]] = {}
    for k in kernels:
        group = next((g for g, rx in KERNEL_GROUPS if re.search(rx, k["kernel"], re.IGNORECASE)), "other")
        row = out.setdefault(group, {"ms": 0.0, "calls": 0})
        row["ms"] = round(row["ms"] + k["ms"], 3)
        row["calls"] += k["calls"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))


def _throughput_checks(size: int, label: str) -> None:
    """Register the throughput checks of one size (an index into ``Sizes.throughput``): eager, compiled, and at
    8 × 512 also with CUDA graphs."""
    for compiled in (False, True):
        check(
            f"throughput_{label}_{'compile' if compiled else 'eager'}",
            240 if compiled else 90,
            f"gpt1 preset bf16 at {label.replace('x', '×')} per GPU, {'--compile' if compiled else 'eager'}: "
            "tokens/s, MFU, torch.cuda.max_memory_allocated",
        )(lambda ctx, _s=size, _c=compiled: throughput(ctx, _s, _c))
    if label == "8x512":
        # An eager update there is 18 ms for 4,096 tokens on an H200 (17 % MFU, the first run): launch-bound. CUDA
        # graphs (mode="reduce-overhead") replay a step's kernels without launching each.
        check(
            "throughput_8x512_cudagraphs",
            240,
            "gpt1 preset bf16 at 8×512 per GPU, torch.compile "
            'mode="reduce-overhead" (CUDA graphs): tokens/s, MFU, torch.cuda.max_memory_allocated',
        )(lambda ctx: throughput(ctx, 0, True, mode="reduce-overhead"))


# The sizes in the order a cut run should lose them: 8 × 512 (an 8-GPU run's share) and 64 × 512 (the paper's batch)
# first, 32 × 512 last. Between them the chunked loss (the candidate for what the compiled update's kernels show),
# then the checks whose question the second H200 run answered (those kernels; the padded head, taken).
_throughput_checks(0, "8x512")
_throughput_checks(2, "64x512")


@check(
    "chunked_loss",
    300,
    "a bf16 update of the gpt1 preset with its output layer and loss over blocks of rows "
    "(chunked_nll.CHUNKED_LOSS_DEVICES) against the padded product's whole logits: same loss and gradient norm, "
    "seconds per update and peak memory eager and compiled at 64×512",
)
def check_chunked_loss(ctx: Ctx) -> str:
    """The candidate after the padded head: never writing the 64 × 512 × 40,512 logits (2.65 GB in bf16) nor their
    gradient; ``step_profile`` puts the loss at 6 % of a compiled update's kernels and the three output products at
    15 %. Both arms take the padded, aligned product; no dropout, so both compute one loss."""
    import torch

    from gptcli.model import chunked_nll
    from gptcli.model.kernels import set_kernels
    from gptcli.runtime import autocast
    from gptcli.train.pretrain import lm_loss

    if not ctx.cuda:
        set_kernels("reference")  # the dry run: the CPU's own blockwise loss would win over the candidate
    model = build(ctx, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    first = batches(ctx, 1, *ctx.sizes.throughput[0])[0]
    start = {}
    for name in ("whole", "chunked"):  # the same weights: loss and gradient norm before any update
        with _naming(chunked_nll, "CHUNKED_LOSS_DEVICES", ctx.device.type, name == "chunked"):
            model.zero_grad(set_to_none=True)
            with autocast(ctx.device, ctx.precision):  # type: ignore[arg-type]
                loss = lm_loss(model, first)
            ctx.record(**{f"grad_fn_{name}": type(loss.grad_fn).__name__})  # which loss really ran
            loss.backward()
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            start[name] = (float(loss), float(norm))
    model.zero_grad(set_to_none=True)
    if ctx.figures["grad_fn_chunked"] != "_ChunkedNLLBackward":
        raise Failed(f"the chunked arm's loss came from {ctx.figures['grad_fn_chunked']}, not chunked_nll")
    ctx.record(
        loss_whole=start["whole"][0],
        loss_chunked=start["chunked"][0],
        grad_norm_whole=start["whole"][1],
        grad_norm_chunked=start["chunked"][1],
    )
    diff = max(rel(start["chunked"][0], start["whole"][0]), rel(start["chunked"][1], start["whole"][1]))
    if diff > 1e-2:
        raise Failed(f"the chunked loss differs from the whole logits' by {diff:.1e}: {start}")
    last = len(ctx.sizes.throughput) - 1
    notes = _timed_arms(
        ctx, model, chunked_nll, "CHUNKED_LOSS_DEVICES", ("whole", "chunked"), ((last, False), (last, True))
    )
    ctx.need_cuda("what the blocks save is GPU memory traffic and memory (the CPU has its own blockwise loss)")
    b, t = ctx.sizes.throughput[last]
    mem = {n: ctx.figures[f"peak_gib_{n}_{b}x{t}_compile"] for n in ("whole", "chunked")}
    return (
        f"chunked against whole logits, per update: {', '.join(notes)}; peak compiled {mem['whole']:.1f} → "
        f'{mem["chunked"]:.1f} GiB; loss {diff:.1e} (> 1: "cuda" belongs in chunked_nll.CHUNKED_LOSS_DEVICES)'
    )


@check(
    "step_profile",
    240,
    "where a compiled gpt1 bf16 update at 64×512 spends its GPU time: kernels by kind "
    "(matmul, attention, loss, optimizer, fused elementwise, copies) against the update's wall time",
)
def check_step_profile(ctx: Ctx) -> str:
    model = build(ctx, **({} if ctx.cuda else {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}))
    tr = trainer(ctx, model, loss_fn=compiled_loss(ctx))
    b, t = ctx.sizes.throughput[-1]
    data = batches(ctx, 2, b, t)
    for i in range(ctx.sizes.warm_steps):  # compilation and autotuning stay out of the trace
        tr.step(i, [data[i % 2]])
    sync(ctx)
    t0 = time.perf_counter()
    for i in range(3):
        tr.step(ctx.sizes.warm_steps + i, [data[i % 2]])
    sync(ctx)
    step_ms = 1000 * (time.perf_counter() - t0) / 3
    prof = profile_step(ctx, lambda: tr.step(ctx.sizes.warm_steps + 3, [data[0]]))
    kernels = cuda_kernels(prof, top=10_000)
    kernel_ms = sum(k["ms"] for k in kernels)
    groups = kernel_groups(kernels)
    ctx.record(
        batch=b,
        seq=t,
        step_ms=round(step_ms, 2),
        kernel_ms=round(kernel_ms, 2),
        gpu_busy=round(kernel_ms / step_ms, 3) if step_ms else None,
        groups=groups,
        top_kernels=kernels[:30],
    )
    ctx.need_cuda("the GPU's kernels are what this check reads (the compiled CPU step ran)")
    shares = ", ".join(f"{g} {100 * v['ms'] / kernel_ms:.0f}%" for g, v in list(groups.items())[:4])
    return f"{kernel_ms:.1f} ms of kernels in a {step_ms:.1f} ms update; {shares}"


@check(
    "padded_head",
    240,
    "a bf16 update of the gpt1 preset with its output product against the embedding padded "
    "to aligned rows (tied.PADDED_HEAD_DEVICES) against the plain product: same loss, seconds per update "
    "eager at 8×512 and 64×512, compiled at 64×512",
)
def check_padded_head(ctx: Ctx) -> str:
    import torch

    from gptcli.model import tied
    from gptcli.runtime import autocast
    from gptcli.train.pretrain import lm_loss

    model = build(ctx, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)  # no dropout: both give one loss
    losses = {}
    first = batches(ctx, 1, *ctx.sizes.throughput[0])[0]
    for name in ("plain", "padded"):  # the same weights: the losses before any update
        with (
            _naming(tied, "PADDED_HEAD_DEVICES", ctx.device.type, name == "padded"),
            torch.no_grad(),
            autocast(ctx.device, ctx.precision),
        ):  # type: ignore[arg-type]
            losses[name] = float(lm_loss(model, first))
    ctx.record(loss_plain=losses["plain"], loss_padded=losses["padded"])
    if rel(losses["padded"], losses["plain"]) > 1e-3:
        raise Failed(f"padded head's loss {losses['padded']} differs from the plain {losses['plain']}")
    last = len(ctx.sizes.throughput) - 1
    notes = _timed_arms(
        ctx, model, tied, "PADDED_HEAD_DEVICES", ("plain", "padded"), ((0, False), (last, False), (last, True))
    )
    ctx.need_cuda("the products' alignment is what this measures, on the GPU (the CPU's padding is kernels/tied.py's)")
    return (
        f'padded head against plain, per update: {", ".join(notes)} (> 1: "cuda" belongs in tied.PADDED_HEAD_DEVICES)'
    )


_throughput_checks(1, "32x512")


# --- running checks in their own processes -------------------------------------------------------------------------


def run_check(name: str, dry: bool, work: str, result_path: str | None) -> dict[str, Any]:
    """Run one check here; returns (and writes to ``result_path``) its status, figures, note and error."""
    chk = next(c for c in CHECKS if c.name == name)
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
        # server imported has asked torch about devices (spaCy's thinc calls torch.cuda.device_count() at import),
        # which is what the first GPU run found (2026-12-04). The dry run keeps the fast fork server.
        self.mp = None if args.fresh_processes or not args.dry_run else forkserver()
        self.current: int | None = None
        """The pid of the running check's process."""
        self.record: dict[str, Any] = {
            "tool": "benchmarks/gpu_check.py",
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
                    __file__,
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


NEEDS_CORPUS = {"launched_vs_inprocess", "resume", "finetune_eval_zeroshot"}


def select(only: str | None) -> list[Check]:
    """The checks to run, in their order: all, or those named, with ``env`` always (the record starts with it) and
    ``corpus`` when a check reads its real-text corpus."""
    if not only:
        return list(CHECKS)
    names = {n.strip() for n in only.split(",") if n.strip()}
    unknown = sorted(names - {c.name for c in CHECKS})
    if unknown:
        sys.exit(f"gpu_check: unknown check(s) {', '.join(unknown)} (--list shows them)")
    names.add("env")
    if names & NEEDS_CORPUS:
        names.add("corpus")
    return [c for c in CHECKS if c.name in names]


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
        for c in CHECKS:
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
    stretch the full run past one 10-minute command (the second H200 run: 545 s for the first 16 checks, where the
    first took 296 s): the next call then needs no reading of the record to know what is left."""
    cut = [c["name"] for c in checks if c.get("cut_by_deadline")]
    if not cut:
        return None
    if "env" not in cut:
        cut.insert(0, "env")  # every record says where it was measured
    return f"python3 benchmarks/gpu_check.py --only {','.join(cut)} --json {out.stem}-rest.json"


if __name__ == "__main__":
    sys.exit(main())
