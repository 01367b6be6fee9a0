"""The one-shot GPU check: a suite of checks run once on a CUDA machine, each in its own process, into one JSON record.

    python benchmarks/gpu_check --json gpu_check.json            # the real run (9-14 minutes on an H200)
    python benchmarks/gpu_check --dry-run --json dry.json        # every check on CPU, tiny sizes (about a minute)
    python benchmarks/gpu_check --only attention_kernel,fused_adamw --json part.json
    python benchmarks/gpu_check --list                           # the checks, their timeouts and what each shows

A GPU may be there for minutes only, so nothing is lost: every check runs in its own process under its own timeout
and a global ``--deadline``; a check that fails, crashes or hangs is recorded and the next one runs; the record is
rewritten after every check, and a run the deadline cut short ends with the ``--only`` command that finishes it.
``--dry-run`` runs every check on CPU at toy sizes (tests/benchmarks/test_gpu_check.py); a check that only means
something on CUDA reports ``skipped`` there, never ``ok``. How to read the record: docs/distributed.md.

Modules: ``context`` (sizes, the check's view of the run), ``processes`` (gpt1 commands, process trees), ``models``
and ``timing`` (building and timing updates), ``profiling``, ``registry`` and ``suite`` (the checks and their order),
``check_*`` (the checks, by concern), ``runner`` (one process per check), ``cli`` (the command line).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # this checkout's gptcli, not whichever one is installed
    sys.path.insert(0, str(ROOT))
