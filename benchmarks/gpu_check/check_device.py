"""Checks of the device and the basics of a training step: versions and peak row, the ``--gpus`` refusal, the
attention kernel, fused AdamW, bf16 and fp16 updates, the LSTM's dtype, host syncs per update.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .context import Ctx, Failed, finite
from .models import batches, build, sync, trainer
from .processes import ROOT, tail
from .profiling import cuda_kernels, matching, op_names, profile_step
from .registry import check


@check("env", 60, "versions, the GPU, gptcli.system.runtime's peak-FLOPs row for it, CPUs, the git commit")
def check_env(ctx: Ctx) -> str:
    import torch

    import gptcli
    from gptcli.system.runtime import GPU_PEAK_FLOPS

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
        raise Failed(f"{info['gpu']!r} matches no row of gptcli.system.runtime.GPU_PEAK_FLOPS: MFU will read n/a")
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
    # Any fused (flash-style) backend passes: PyTorch picks among them by GPU and version (on Hopper it may pick
    # cuDNN's flash kernels over FlashAttention-2); the math fallback (the (T, T)
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
    # The mode's own notice ("Synchronization debug mode is a prototype feature…", once per process) is no sync,
    # and is not counted as one.
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
