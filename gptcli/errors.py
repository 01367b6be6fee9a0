"""User-facing errors.

Anything a user can fix (a bad file, a missing dataset, a wrong option) raises :class:`GPT1Error`.
The CLI prints it as one line and exits non-zero; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class GPT1Error(Exception):
    """An error the user can act on. ``str(err)`` is the one-line message shown by the CLI."""

    exit_code: int = 1


class DataError(GPT1Error):
    """A problem in an input file, located as ``path:line: what is wrong``."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = message
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")
