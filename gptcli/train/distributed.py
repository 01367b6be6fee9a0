"""Launching and joining a torch.distributed job — PyTorch's own stack, no home-made protocol.

Three ways in, one code path: ``gpt1 pretrain --gpus N`` (or ``--procs N`` on CPU) starts N local workers through
the elastic launch API (the machinery behind ``torchrun``; ``--nodes``/``--node-rank``/``--master-addr`` or
``--rdzv-endpoint`` join a multi-node job); ``torchrun --nproc-per-node N -m gptcli pretrain ...`` starts the
workers itself; under SLURM (``srun``) every task is a worker.

A command decides with :func:`plan_launch` whether it is the launcher (then :func:`launch`) or a process that
trains. That process calls :func:`join`, which reads the environment the launcher left, initialises the process
group (NCCL on CUDA, gloo on CPU, with a timeout so a dead peer turns into an error instead of a hang) and returns
a :class:`DDPParallel` for the training loop — or the single-process :class:`~gptcli.train.trainer.Parallel`
outside any job. A worker that finished calls :func:`leave`. The workers :func:`launch` starts keep a heartbeat,
so a worker that stops responding without dying is named by the launcher instead of hanging every other rank
(:func:`launch` says how).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import visible_path
from gptcli.files.outputs import kind_of
from gptcli.train.heartbeat import Watchdog, heartbeat, stop_beating
from gptcli.train.launch_files import (
    KEEP_ENV,
    debugging,
    held_launcher_log,
    keep_uncaught,
    launch_folder,
    save_output,
)
from gptcli.train.trainer import Parallel

if TYPE_CHECKING:
    import torch
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig

# Set in the environment of workers that *we* launched, so they do not try to launch again.
WORKER_ENV = "GPT1_DIST_WORKER"
# Seconds a collective may wait for a peer before it fails (passed from the launcher to its workers; also settable
# by hand under torchrun/SLURM). Generous because a rank may be writing a checkpoint while the others wait.
TIMEOUT_ENV = "GPT1_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600
# A directory where each worker started by :func:`launch` keeps a heartbeat file, ``rank-<R>`` (its pid inside).
HEARTBEAT_ENV = "GPT1_DIST_HEARTBEAT"
# The launcher's own decisions for the workers it starts: the device type of ``--gpus``/``--procs``, and that it
# verified the input checksums once so each worker need not read them all again. Environment, not settings: the
# workers' config is the user's, and it is what the run records (a resume reads it back as the user's settings).
DEVICE_ENV = "GPT1_DIST_DEVICE"
VERIFIED_ENV = "GPT1_DIST_INPUTS_VERIFIED"


def inputs_verified_by_launcher() -> bool:
    """True in a worker whose launcher already checked the inputs' checksums (:func:`launch_command`)."""
    return os.environ.get(VERIFIED_ENV) == "1"


def timeout_from_env() -> int:
    """``GPT1_DIST_TIMEOUT`` in seconds (default 600), with a one-line error for anything but a positive integer."""
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise GPT1Error(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds (default {DEFAULT_TIMEOUT_S})")
    return value


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. A single process is rank 0 of world size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    cuda_index: int | None = None
    """The CUDA device this process computes on, as this process numbers its visible devices
    (:func:`pick_cuda_device`)."""

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
    timeout_s: int = DEFAULT_TIMEOUT_S
    """Collective timeout inside the workers (a dead or stuck peer becomes an error after this long); a worker whose
    heartbeat stands still for half of it is killed by the launcher's watchdog and named."""
    shutdown_timeout_s: int = 60
    """After a signal or a failed rank, how long workers get to checkpoint/exit before they are killed."""


def env_world() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) from torchrun or SLURM variables, or None for a plain process."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), int(os.environ.get("SLURM_LOCALID", 0))
    return None


def init_process_group(device_type: str, timeout_s: int = 600) -> DistInfo:
    """Join the job described by the environment (no-op for a plain process).

    A launched job of one process (``--gpus 1``, ``torchrun --nproc-per-node 1``) still gets a process group, so it
    runs the same DDP/NCCL code as a larger job; that costs nothing measurable and keeps one path tested."""
    world = env_world()
    if world is None:
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
    index = None
    if device_type == "cuda":
        index = pick_cuda_device(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(index)
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return DistInfo(rank, world_size, local_rank, backend, index)


def pick_cuda_device(local_rank: int, visible: int) -> int:
    """The CUDA device of the worker with ``local_rank`` that sees ``visible`` devices, as torchrun users expect.

    Every worker seeing all of the node's GPUs (torchrun, ``gpt1 pretrain --gpus N``) takes device ``LOCAL_RANK``.
    A worker that sees exactly one — SLURM's ``--gpus-per-task=1``/``--gpu-bind``, or a cluster setting
    ``CUDA_VISIBLE_DEVICES`` per rank — takes that one (device 0), whatever its local rank. Anything else is
    ambiguous (two ranks would share a GPU, or the rank's GPU is hidden) and refused."""
    if local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    if visible == 0:
        raise GPT1Error(
            f"local rank {local_rank} sees no CUDA device (check CUDA_VISIBLE_DEVICES and the job's GPU "
            "allocation, or train on CPU with --procs)"
        )
    raise GPT1Error(
        f"local rank {local_rank} sees {visible} CUDA devices and none is its own (LOCAL_RANK must be below the "
        f"number of visible devices, or each process must see exactly one: start at most {visible} processes per "
        f"node, or give each rank one GPU through CUDA_VISIBLE_DEVICES / --gpus-per-task=1)"
    )


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rendezvous(spec: LaunchSpec) -> tuple[str, str, dict, str]:
    """(backend, endpoint, configs, run id) of the rendezvous for ``spec``; GPT1Error for inconsistent options."""
    if spec.nproc_per_node < 1 or spec.nnodes < 1:
        raise GPT1Error("the number of processes and of nodes must be at least 1")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise GPT1Error(f"--node-rank {spec.node_rank} is outside 0..{spec.nnodes - 1} for --nodes {spec.nnodes}")
    if spec.nnodes > 1:
        if spec.rdzv_endpoint:
            # c10d: the first node to arrive hosts the store at the endpoint; node ranks are assigned.
            return "c10d", spec.rdzv_endpoint, {}, _run_id(spec)
        if spec.master_addr:
            # torchrun's static rendezvous: node ranks are given, node 0 (the master) hosts the store.
            return "static", f"{spec.master_addr}:{spec.master_port}", {"rank": spec.node_rank}, _run_id(spec)
        raise GPT1Error("--nodes > 1 needs --master-addr (with --node-rank) or --rdzv-endpoint")
    # Single node: a private c10d store on a free local port, like `torchrun --standalone`.
    return "c10d", "localhost:0", {}, spec.rdzv_id or uuid.uuid4().hex[:12]


def _run_id(spec: LaunchSpec) -> str:
    # All nodes must agree on the run id; a SLURM job id is unique and the same on every node.
    return spec.rdzv_id or os.environ.get("SLURM_JOB_ID") or "gpt1"


def elastic_config(spec: LaunchSpec, log_dir: str | None = None, hold_output: bool = False) -> ElasticConfig:
    """torch.distributed.elastic's configuration of the job: one attempt (no restarts), spawned workers, and
    ``spec.shutdown_timeout_s`` where this PyTorch's ``LaunchConfig`` has the field (older ones have not, and give
    workers a fixed grace period: passing it there fails the launch). ``log_dir``:
    where its per-run files go (the workers' error files), a folder the launcher removes; without it elastic makes
    a ``/tmp/torchelastic_*`` of its own that nobody removes. ``hold_output``: the output of every local rank but
    0 goes to files there (rank 0 keeps the terminal: its progress is the run's)."""
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig

    backend, endpoint, configs, run_id = rendezvous(spec)
    options: dict[str, Any] = dict(
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
    names = {f.name for f in dataclasses.fields(ElasticConfig)}
    if "shutdown_timeout" in names:
        options["shutdown_timeout"] = spec.shutdown_timeout_s
    if log_dir is not None and "logs_specs" in names:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

        redirects = {r: Std.ALL if r else Std.NONE for r in range(spec.nproc_per_node)} if hold_output else Std.NONE
        options["logs_specs"] = DefaultLogsSpecs(log_dir=log_dir, redirects=redirects)
    return ElasticConfig(**options)


def launch(
    spec: LaunchSpec,
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    *,
    folder: Path | None = None,
    run: Path | None = None,
) -> str | None:
    """Start ``python -m gptcli <argv>`` as ``spec.nproc_per_node`` workers here and wait for the job.

    Returns None when every worker finished, or the name of the signal (``"SIGTERM"``, ``"SIGINT"``) that stopped
    the launcher: the launcher forwards it to its workers, which checkpoint once and exit (they get
    ``spec.shutdown_timeout_s`` seconds before they are killed).

    Raises :class:`WorkerFailed` naming the rank that failed first (or was killed) and its error when any worker
    fails; the launcher tears the others down (max_restarts=0), so a failure never hangs the job. ``env``: more
    variables for the workers; ``folder``: the launch's folder (:func:`launch_folder`, made here when not given).

    The workers' errors and tracebacks, the output of every local rank but 0 and elastic's own log lines are held
    in the folder rather than printed — when one rank dies the others' tracebacks would bury the line that says
    what happened — and appended to ``run``'s ``workers.log`` (:mod:`gptcli.train.launch_files`). With ``--debug``
    (``GPT1_DEBUG``) everything prints, as torchrun shows it.

    A worker that stops responding without dying (SIGSTOP, a frozen machine, a debugger) would make every other rank
    wait out the collective timeout and then fail naming *itself*. So each worker started here keeps a heartbeat file
    fresh from a background thread, and a watchdog here kills a worker whose heartbeat stood still for half the
    timeout (``GPT1_DIST_TIMEOUT``): the others see the connection close at once, and the job ends within the timeout
    with an error naming the rank that stopped responding (:mod:`gptcli.train.heartbeat`, which also ends the workers
    of a launcher that died). Under torchrun or SLURM there is no such launcher; there the collective timeout alone
    applies.
    """
    with ExitStack() as stack:
        if folder is None:
            folder = stack.enter_context(launch_folder())
        return _run_job(spec, argv, env or {}, folder, run)


def _run_job(spec: LaunchSpec, argv: Sequence[str], env: dict[str, str], folder: Path, run: Path | None) -> str | None:
    """:func:`launch` in ``folder``: the workers' output held there unless debugging, and saved to ``run``."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    debug = debugging()
    config = elastic_config(spec, str(folder / "elastic"), hold_output=not debug)
    beats = folder / "heartbeat"
    kept = folder / "kept"
    beats.mkdir()
    kept.mkdir()
    env = {**env, WORKER_ENV: "1", TIMEOUT_ENV: str(spec.timeout_s), HEARTBEAT_ENV: str(beats)}
    if not debug:
        env[KEEP_ENV] = str(kept)
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(worker_threads(spec.nproc_per_node))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # spawned workers inherit the launcher's environment
    watchdog = Watchdog(str(beats), spec.timeout_s / 2)
    watchdog.start()
    failure = None
    try:
        with ExitStack() as held:
            if not debug:
                held.enter_context(held_launcher_log(folder / "launcher.log"))
            elastic_launch(config, sys.executable)("-m", "gptcli", *argv)
    except ChildFailedError as e:
        failure = e
    except SignalException as e:
        return e.sigval.name
    finally:
        watchdog.stop()
        log = _save_output(folder, run, spec, argv)  # on success and stops too: what ranks 1+ printed
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if failure is not None:
        raise _job_failure(failure, watchdog, spec, argv, run, log)
    return None


def _save_output(folder: Path, run: Path | None, spec: LaunchSpec, argv: Sequence[str]) -> Path | None:
    """The workers' held output appended to the run's workers.log (only to a run directory the workers made)."""
    if run is None or kind_of(run) not in ("pretrain-run", "finetune-run"):
        return None
    where = f"node {spec.node_rank} of {spec.nnodes}, " if spec.nnodes > 1 else ""
    return save_output(folder, run, f"gpt1 {argv[0]}: {where}{spec.nproc_per_node} worker(s)")


class WorkerFailed(GPT1Error):
    """A worker of a launched job failed or was killed; the launcher stopped the others. One line for the user."""


def _job_failure(
    e: Any, watchdog: Watchdog, spec: LaunchSpec, argv: Sequence[str], run: Path | None, log: Path | None
) -> WorkerFailed:
    """The one line for a job that ended in a failed worker: which rank, what happened, what to do, where the
    workers' output went."""
    output = f"; the workers' output is in {visible_path(str(log))}" if log else ""
    resume = f"gpt1 {argv[0]} --out {visible_path(str(run))} --resume" if run else "the same command and --resume"
    if watchdog.stalled:
        rank, silent = watchdog.stalled[0]
        return WorkerFailed(
            f"worker rank {rank} stopped responding (no heartbeat for {silent:.0f} s: stopped, frozen or "
            f"swapping); the launcher killed it and ended the job (resume with --resume; the limit is half of "
            f"{TIMEOUT_ENV}={spec.timeout_s} s{output})"
        )
    rank, failure = failure_that_ended(e.failures)
    if failure.exitcode < 0:  # a signal: out of memory (SIGKILL), a crash (SIGSEGV, SIGBUS), a user or a scheduler
        return WorkerFailed(
            f"worker rank {rank} was killed ({failure.signal_name()}); the launcher stopped the other workers "
            f"(continue with: {resume}{output})"
        )
    message = _failure_message(failure)
    if _is_user_error(failure) or log is None:
        return WorkerFailed(f"worker rank {rank} failed: {message}")
    return WorkerFailed(
        f"worker rank {rank} failed: {message} (the workers' tracebacks are in {visible_path(str(log))}; "
        "--debug shows them)"
    )


def failure_that_ended(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure that ended the job: a worker killed by a signal (the others then fail on its closed connection,
    sometimes within the same second, which elastic's own first-failure choice cannot tell apart); else the first
    worker that failed on its own. A SIGTERM is the launcher stopping the others, so it is named only when alone."""
    stopped = {r for r, f in failures.items() if f.exitcode < 0 and f.signal_name() == "SIGTERM"}
    killed = [r for r, f in failures.items() if f.exitcode < 0 and r not in stopped]
    failed = [r for r in failures if r not in stopped]
    rank = min(killed or failed or failures, key=lambda r: (failures[r].timestamp, r))
    return rank, failures[rank]


def worker_threads(nproc_per_node: int, cores: int | None = None) -> int:
    """Intra-op threads per local worker: an equal share of the node's cores. Without it every worker starts one
    thread per core — CPU workers then oversubscribe the cores N times over, and GPU workers (whose host side
    reads batches, tokenizes and launches kernels) fight over them; torchrun sets 1 for the same reason."""
    return max(1, (cores or os.cpu_count() or 1) // max(1, nproc_per_node))


def launch_command(
    spec: LaunchSpec, command: str, config: Any, *, resume: bool, quiet: bool, inputs_verified: bool = False
) -> str | None:
    """Start the workers of a ``--gpus``/``--procs`` run of ``gpt1 <command>``: ``config`` (the resolved settings of
    the run, a config dataclass with a ``resume`` field) goes to a temporary TOML that every worker reads with
    ``--config``; ``resume`` and ``quiet`` travel as flags (a worker's ``--resume`` is checked against the run's
    saved settings, not read from them). What :func:`launch` returns.

    The workers' device type and ``inputs_verified`` (the launcher checked the input checksums) travel in the
    environment, never in the config: what a worker records is what the user set. The one launcher path of every
    command that trains data-parallel (``pretrain``, ``finetune``); each decides beforehand what it checks once
    here instead of in every worker."""
    from gptcli.config import save_config

    worker = dataclasses.replace(config, resume=False)
    flags = [*(["--resume"] if resume else []), *(["--quiet"] if quiet else [])]
    env = {DEVICE_ENV: "cuda" if spec.use_cuda else "cpu", VERIFIED_ENV: "1" if inputs_verified else "0"}
    with launch_folder() as folder:
        path = str(folder / f"{command}.toml")
        save_config(worker, path)
        run = Path(config.out) if getattr(config, "out", None) else None
        return launch(spec, [command, "--config", path, *flags], env, folder=folder, run=run)


def describe_launch(spec: LaunchSpec, batch_size: int) -> str:
    """``launching 2 CPU worker(s): global batch 32 = 2 × 16``: the line a launcher prints before it starts. A
    global batch that the processes cannot split evenly shows the two share sizes (``33 = 2 × 16-17``)."""
    world = spec.nproc_per_node * spec.nnodes
    where = f"{spec.nproc_per_node} {'GPU' if spec.use_cuda else 'CPU'} worker(s)"
    if spec.nnodes > 1:
        where += (
            f" on one of {spec.nnodes} nodes" if spec.rdzv_endpoint else f" on node {spec.node_rank} of {spec.nnodes}"
        )
    low, high = batch_size // world, -(-batch_size // world)
    share = str(low) if low == high else f"{low}-{high}"
    return f"launching {where}: global batch {batch_size} = {world} × {share}"


def _failure_message(failure) -> str:
    """The failed worker's one-line error, from the error file ``@record`` wrote, else its exit code."""
    text = _error_file_text(failure)
    if text:
        return text.split(": ", 1)[1] if _is_user_error(failure) else text
    return f"exit code {failure.exitcode}" + (f" (signal {failure.signal_name()})" if failure.exitcode < 0 else "")


def _is_user_error(failure) -> bool:
    """Whether the worker failed with an error the user can act on (a GPT1Error), not an unexpected exception."""
    return (_error_file_text(failure) or "").split(": ", 1)[0].endswith(("GPT1Error", "DataError"))


def _error_file_text(failure) -> str | None:
    """``<Type>: <message>`` from the worker's error file, or None without one."""
    import json

    path = getattr(failure, "error_file", None)
    if path and os.path.isfile(path):
        try:
            data = json.loads(open(path, encoding="utf-8").read())
            msg = data.get("message", {})
            text = (msg.get("message", "") or "") if isinstance(msg, dict) else str(msg)
            # ErrorHandler writes "<Type>: <message>" followed by the traceback; keep the first part.
            return text.split("Traceback (most recent call last)")[0].strip() or None
        except (OSError, ValueError):
            pass
    return None


def is_launched_worker() -> bool:
    """True inside a worker started by :func:`launch` or torchrun: do not launch again.

    A bare SLURM task is not one: under ``srun`` a per-node ``gpt1 pretrain --gpus 8`` still launches its workers
    (without launch options it joins the SLURM job directly, see :func:`join`)."""
    return os.environ.get(WORKER_ENV) == "1" or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


# --- inside a worker -----------------------------------------------------------------------------------------------


class DDPParallel(Parallel):
    """Data parallelism over the default process group: DistributedDataParallel, all-reduced metrics, barriers.

    Collectives run on ``device`` (NCCL needs CUDA tensors; gloo takes CPU tensors), and each fails after the
    process group's timeout instead of waiting forever for a dead peer.
    """

    device: torch.device  # always known in a job, unlike the single process's

    def __init__(self, info: DistInfo, device: torch.device) -> None:
        self.info = info
        self.rank = info.rank
        self.world_size = info.world_size
        self.device = device

    def wrap(self, model):
        from torch.nn.parallel import DistributedDataParallel

        # DDP broadcasts rank 0's parameters and buffers here, so all ranks start from the same weights even if
        # their initialisation differed; afterwards it averages gradients in the backward of a synced micro-batch.
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _all_reduce(self, values: list[float], op: str) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.tolist()

    def mean(self, value: float) -> float:
        return self._all_reduce([float(value)], "sum")[0] / self.world_size

    def any(self, flag: bool) -> bool:
        return self._all_reduce([1.0 if flag else 0.0], "max")[0] > 0

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._all_reduce([float(v) for v in values], "sum")

    def max(self, values: Sequence[float]) -> list[float]:
        return self._all_reduce([float(v) for v in values], "max")

    def gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)  # pickled: small, trusted objects of this job's own ranks only
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()


def worker_device_type(device: str) -> str:
    """``cuda`` or ``cpu`` for a ``--device`` value (``auto`` → CUDA when available), before the group exists."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def join(device: str = "auto") -> Parallel:
    """Join the job this process belongs to (torchrun, SLURM or :func:`launch`) and return how to train in it.

    A plain process gets the single-process :class:`Parallel`. Under a launcher this initialises the process
    group (NCCL on CUDA, gloo on CPU, timeout from ``GPT1_DIST_TIMEOUT``) and returns a :class:`DDPParallel`.
    """
    if env_world() is None:
        return Parallel()
    import torch

    device_type = os.environ.get(DEVICE_ENV) or worker_device_type(device)  # our launcher's --gpus/--procs
    timeout = timeout_from_env()
    info = init_process_group(device_type, timeout)
    keep_uncaught()  # after the group's own hook (which prefixes "[rankN]:"): ours sees everything first
    if os.environ.get(HEARTBEAT_ENV):
        # Several beats per watchdog limit (half the timeout), so one late beat is never taken for silence.
        heartbeat(os.environ[HEARTBEAT_ENV], info.rank, min(1.0, timeout / 20))
    if device_type != "cuda":
        dev = torch.device("cpu")
    else:  # no index: the current CUDA device
        dev = torch.device("cuda") if info.cuda_index is None else torch.device("cuda", info.cuda_index)
    return DDPParallel(info, dev)


def leave(parallel: Parallel, exit_code: int = 0) -> None:
    """Finish a worker that completed: destroy the process group, flush output, and exit at once.

    The immediate ``os._exit`` is deliberate. About 1 in 5 short gloo runs here aborted during interpreter
    shutdown (``terminate called without an active exception``, from gloo's background threads) after all work
    was done; exiting right after ``destroy_process_group()`` removed it in 40 of 40 runs
    (docs: measurements.md). Nothing after this call runs, so results must be written and printed before it.
    A single process (no group) just returns.
    """
    if not isinstance(parallel, DDPParallel):
        return
    stop_beating()  # finished, not silent: the watchdog must not take the quiet file for a stopped worker
    destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(exit_code)


@dataclass
class LaunchConfig:
    """How many processes run a job and where: settings of the launch, not of the run (a run resumes with any)."""

    gpus: int | None = None
    """Train with DDP on N GPUs of this node (N worker processes, NCCL); the global batch is split across them."""
    procs: int | None = None
    """Train with DDP in N CPU worker processes (gloo): the same code path as --gpus, without GPUs."""
    nodes: int = 1
    """Number of nodes; run the same command on each with its --node-rank (docs/distributed.md)."""
    node_rank: int = 0
    """This node's rank, 0 … nodes-1 (with --master-addr)."""
    master_addr: str | None = None
    """Address of node 0, which hosts the rendezvous (static, like torchrun --master-addr)."""
    master_port: int = 29500
    """Port of the rendezvous on --master-addr."""
    rdzv_endpoint: str | None = None
    """host:port of a c10d rendezvous; replaces --master-addr/--node-rank (node ranks are assigned)."""


def plan_launch(launch: LaunchConfig | None = None) -> LaunchSpec | None:
    """The LaunchSpec for the launch options of a command, or None to run in this process.

    ``--gpus N`` means N CUDA workers and refuses without N visible devices; ``--procs N`` means N CPU workers
    with gloo (how CI exercises the distributed path). Inside a launched worker this always returns None.
    """
    c = launch or LaunchConfig()
    gpus, procs, nodes, node_rank = c.gpus, c.procs, c.nodes, c.node_rank
    master_addr, master_port, rdzv_endpoint = c.master_addr, c.master_port, c.rdzv_endpoint
    if is_launched_worker():
        return None
    if gpus is not None and procs is not None:
        raise GPT1Error("--gpus and --procs are exclusive: --gpus N for CUDA workers, --procs N for CPU workers")
    multi_node = nodes > 1 or node_rank != 0 or master_addr is not None or rdzv_endpoint is not None
    if gpus is None and procs is None:
        if multi_node:
            raise GPT1Error("--nodes/--node-rank/--master-addr/--rdzv-endpoint need --gpus N (or --procs N) per node")
        return None
    n = gpus if gpus is not None else procs
    if n is None or n < 1:
        raise GPT1Error(f"--{'gpus' if gpus is not None else 'procs'} must be at least 1, got {n}")
    if nodes < 1:
        raise GPT1Error(f"--nodes must be at least 1, got {nodes}")
    if gpus is not None:
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0:
            raise GPT1Error(
                f"--gpus {gpus}: no CUDA device is available on this machine; "
                f"use --procs {gpus} to run {gpus} CPU processes (gloo) instead"
            )
        if available < gpus:
            raise GPT1Error(f"--gpus {gpus}: only {available} CUDA device(s) are visible on this node")
    spec = LaunchSpec(
        nproc_per_node=n,
        nnodes=nodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_endpoint=rdzv_endpoint,
        use_cuda=gpus is not None,
        timeout_s=timeout_from_env(),
    )
    rendezvous(spec)  # inconsistent node options fail here, before any process starts
    return spec
