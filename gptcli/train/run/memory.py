"""Running out of memory: one error for every run, naming the setting that makes each forward pass smaller.

The commonest failure of a training run on a GPU is its memory: the paper's update (64 sequences of 512 tokens) needs
more than many GPUs have, and a fine-tuning batch of long examples can too. PyTorch says so with a traceback and
"CUDA out of memory. Tried to allocate …", which names neither the run's setting nor its value. The fix is nearly
always the same: compute each update in smaller parts (gradient accumulation gives the same update), or score
held-out data in smaller batches. :func:`out_of_memory` is that error as one line that says which flag, to what value,
and whether the run can continue from a checkpoint; the update loop raises it (:mod:`gptcli.train.run.loop`), and
each job supplies the flag and the value (:meth:`gptcli.train.run.loop.Job.memory_advice`), since only it knows what its
batches hold.

No checkpoint is written after the error: an update cut short may have changed some weights and not others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

# What every command shares about running out of memory; named here too, the training room's own words beside them.
from gptcli.system.out_of_memory import OutOfMemory, in_use, is_out_of_memory, model_out_of_memory
from gptcli.system.out_of_memory import size_text as _size


def half(n: int, divides: int | None = None) -> int | None:
    """The largest size at most ``n // 2`` (that divides ``divides``, when given); None when ``n`` is 1 already."""
    for size in range(n // 2, 0, -1):
        if divides is None or divides % size == 0:
            return size
    return None


def out_of_memory(device: torch.device, during: str, advice: str, checkpoint: Path | str | None) -> OutOfMemory:
    """The one-line error: what ran out and when (``during``: "in update 7 of 2,000"), then ``advice`` (the job's
    flag and value) and the ``checkpoint`` the run can continue from with it, if there is one."""
    then = f"; then --resume continues from {checkpoint}" if checkpoint is not None else ""
    return OutOfMemory(f"{device} ran out of memory {during}{in_use(device)} ({advice}{then})")


# --- before the first update, on a CPU -------------------------------------------------------------------------------
# A CPU run that asks for more memory than the machine has is not told so: Linux lets the allocations through and
# then kills the process (exit 137, "Killed"), often minutes in, with nothing said. So a CPU run estimates what its
# largest forward/backward holds and says, before the first update, when that is more than is free.
#
# Bytes a training update of the Transformer holds on a CPU with the kernels on (peak RSS of the second update over
# its tokens; how they were found: docs/reliability.md): per token, per block and
# unit of width; per token and vocabulary entry (the output layer's logits, their gradient, the loss); and per
# parameter, the gradients and AdamW's two moments (and, under bf16 autocast, the weights' bf16 copies).
PER_TOKEN_BLOCK_WIDTH = {"fp32": 81, "bf16": 75}
PER_TOKEN_VOCAB = {"fp32": 13, "bf16": 2}
PER_PARAM = {"fp32": 12, "bf16": 14}


def update_bytes(n_layer: int, n_embd: int, vocab: int, params: int, tokens: int, precision: str) -> int:
    """Bytes a CPU training update of ``tokens`` tokens (its largest forward/backward) needs beyond the weights."""
    per_token = PER_TOKEN_BLOCK_WIDTH[precision] * n_layer * n_embd + PER_TOKEN_VOCAB[precision] * vocab
    return PER_PARAM[precision] * params + per_token * tokens


def free_bytes(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Memory this process can still take: the kernel's MemAvailable, or less where a cgroup (a container, a job
    scheduler) limits the process; None where neither can be read (not Linux)."""
    limits = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for folder, limit_file, usage_file in _cgroup_memory(proc / "self" / "cgroup", cgroups):
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max", or v1's "no limit" of nearly 2**63
            limits.append(int(limit) - usage)
    return min(limits) if limits else None


def _cgroup_memory(membership: Path, root: Path) -> list[tuple[Path, str, str]]:
    """This process's memory cgroup and each one above it, as (folder, limit file, usage file): cgroup v2's
    ``0::PATH`` line of /proc/self/cgroup (``membership``), or v1's ``N:memory:PATH`` (a container's or a job
    scheduler's limit is set on one of them)."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            base, files = root, ("memory.max", "memory.current")
        elif "memory" in parts[1].split(","):
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        path = Path(parts[2].strip() or "/")
        for level in (path, *path.parents):
            found.append((base / str(level).lstrip("/"), *files))
    return found


def too_big_warning(
    needed: Callable[[int], int],
    now: int,
    unit: str,
    divides: int | None = None,
    free: int | None = None,
    processes: int | None = None,
) -> str | None:
    """The warning a CPU run gives before its first update when ``needed(now)`` bytes (its largest forward/backward
    at a micro-batch of ``now`` ``unit``) in each of this machine's ``processes`` (default: the launcher's
    ``LOCAL_WORLD_SIZE``, else 1) are more than 90 % of what is free, with the largest micro-batch that fits
    (dividing ``divides``, where the split requires it); None when it fits or nothing is known."""
    free = free_bytes() if free is None else free
    processes = processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if free is None or processes * needed(now) <= 0.9 * free:
        return None
    sizes = (k for k in range(now - 1, 0, -1) if divides is None or divides % k == 0)
    fit = next((k for k in sizes if processes * needed(k) <= 0.9 * free), None)
    advice = (
        f"pass --micro-batch-size {fit}: the same update, in smaller parts"
        if fit is not None
        else "not even a micro-batch of 1 would fit: use a smaller model or a machine with more memory"
    )
    each = f" in each of {processes} processes" if processes > 1 else ""
    return (
        f"a forward/backward of {now} {unit}{each} needs about {_size(processes * needed(now))} here and "
        f"{_size(free)} are free, so the system would likely stop the run without a word ({advice})"
    )


__all__ = [
    "OutOfMemory",
    "free_bytes",
    "half",
    "in_use",
    "is_out_of_memory",
    "model_out_of_memory",
    "out_of_memory",
    "too_big_warning",
    "update_bytes",
]
