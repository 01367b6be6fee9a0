"""Launching and joining a torch.distributed job — PyTorch's own stack, no home-made protocol.

Three ways in, one code path:

* ``gpt1 pretrain --gpus N`` (or ``--procs N`` on CPU) starts N local workers through the elastic launch API
  (the machinery behind ``torchrun``); with ``--nodes``/``--node-rank``/``--master-addr`` or ``--rdzv-endpoint``
  the same call joins a multi-node job.
* ``torchrun --nproc-per-node N -m gptcli pretrain ...`` starts the workers itself.
* Under SLURM (``srun``), every task is a worker; rank and world size come from the SLURM environment.

Each worker then calls :func:`init_process_group`, which reads the environment the launcher left
(RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT), picks NCCL on CUDA and gloo on CPU, and applies a timeout
so a dead peer turns into an error instead of a hang.
"""

from __future__ import annotations

import datetime
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Sequence

from gptcli.errors import GPT1Error

# Set in the environment of workers that *we* launched, so they do not try to launch again.
WORKER_ENV = "GPT1_DIST_WORKER"


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. A single process is rank 0 of world size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


@dataclass
class LaunchSpec:
    """How many workers to start here and how to meet the other nodes."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    use_cuda: bool = False
    timeout_s: int = 600


def env_world() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) from torchrun or SLURM variables, or None for a plain process."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), int(os.environ.get("SLURM_LOCALID", 0))
    return None


def init_process_group(device_type: str, timeout_s: int = 600) -> DistInfo:
    """Join the job described by the environment (no-op for a single process)."""
    world = env_world()
    if world is None or world[1] == 1:
        return DistInfo()
    rank, world_size, local_rank = world
    import torch
    import torch.distributed as dist

    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise GPT1Error(
            "distributed run without MASTER_ADDR/MASTER_PORT: launch with `gpt1 pretrain --gpus N`, torchrun, "
            "or export them in your SLURM script (see docs/distributed.md)"
        )
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return DistInfo(rank, world_size, local_rank, backend)


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def launch(spec: LaunchSpec, argv: Sequence[str]) -> None:
    """Start ``python -m gptcli <argv>`` as ``spec.nproc_per_node`` workers here and wait for the job.

    Raises GPT1Error naming the first failed rank and its error when any worker fails; the launcher tears the
    others down (max_restarts=0), so a failure never hangs the job.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if spec.nnodes > 1:
        if spec.rdzv_endpoint:
            backend, endpoint, configs = "c10d", spec.rdzv_endpoint, {}
        elif spec.master_addr:
            # torchrun's static rendezvous: node ranks are given, the master hosts the store.
            backend, endpoint = "static", f"{spec.master_addr}:{spec.master_port}"
            configs = {"rank": spec.node_rank}
        else:
            raise GPT1Error("--nodes > 1 needs --master-addr (with --node-rank) or --rdzv-endpoint")
        run_id = spec.rdzv_id or "gpt1"
    else:
        # Single node: a private c10d store on a free local port, like `torchrun --standalone`.
        backend, endpoint, configs = "c10d", "localhost:0", {}
        run_id = spec.rdzv_id or uuid.uuid4().hex[:12]
    config = LaunchConfig(
        min_nodes=spec.nnodes,
        max_nodes=spec.nnodes,
        nproc_per_node=spec.nproc_per_node,
        run_id=run_id,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=configs,
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    os.environ[WORKER_ENV] = "1"
    try:
        elastic_launch(config, sys.executable)("-m", "gptcli", *argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = _failure_message(failure)
        raise GPT1Error(f"worker rank {rank} failed: {message}") from None
    finally:
        os.environ.pop(WORKER_ENV, None)


def _failure_message(failure) -> str:
    """The failed worker's one-line error, from the error file ``@record`` wrote, else its exit code."""
    import json

    path = getattr(failure, "error_file", None)
    if path and os.path.isfile(path):
        try:
            data = json.loads(open(path, encoding="utf-8").read())
            msg = data.get("message", {})
            if isinstance(msg, dict):
                text = msg.get("message", "") or ""
            else:
                text = str(msg)
            # ErrorHandler writes "<Type>: <message>" followed by the traceback; keep the first part.
            text = text.split("Traceback (most recent call last)")[0].strip()
            if text:
                return text.split(": ", 1)[1] if text.split(": ", 1)[0].endswith(("GPT1Error", "DataError")) else text
        except (OSError, ValueError):
            pass
    return f"exit code {failure.exitcode}" + (f" (signal {failure.signal_name()})" if failure.exitcode < 0 else "")


def is_launched_worker() -> bool:
    """True inside a worker started by :func:`launch` (or torchrun/SLURM): do not launch again."""
    return os.environ.get(WORKER_ENV) == "1" or env_world() is not None
