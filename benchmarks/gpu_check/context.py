"""What every check runs at: the sizes (real or dry run), the check's view of the run (``Ctx``), its outcomes.

A check records its figures through ``Ctx.record``, which writes them out at once: a check killed later still
reports what it saw.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .processes import forked_cli, fresh_cli, tail

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
            from gptcli.system.runtime import configure_backends

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
