"""``python benchmarks/gpu_check …`` (or ``python -m gpu_check`` from benchmarks/): the suite's command line."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)  # the package's own folder: its modules are imported as gpu_check.*, never bare
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from gpu_check.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
