"""The defaults that make the short command lines work, decided in one place and always said out loud.

- **The model.** A checkpoint option (``finetune --init``, ``zeroshot``/``generate --checkpoint``) that is not given
  means ``openai-gpt``, OpenAI's released GPT-1 (the paper's model); a Hub id given anywhere a checkpoint is taken
  is downloaded and converted once (:mod:`gptcli.interop.hub`). Each prints one line naming the model and commit.
- **The run directory.** A run without ``--out`` gets ``runs/<command>-<task>`` (``runs/pretrain`` for
  pretraining), or the next free ``-2``, ``-3``, … when that exists: a default never lands in an earlier run. The
  choice is printed. Under torchrun or SLURM every process must name the same directory, so ``--out`` is required.
- **The data.** Task folders are looked for under ``$GPT1_DATA``, else ``~/.cache/gpt1/data``
  (:func:`gptcli.tasks.base.data_root`), where ``gpt1 fetch`` puts them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.outputs import next_free


def model(spec: str | os.PathLike[str] | None, console: Any, flag: str = "--checkpoint") -> str:
    """``spec`` as a local checkpoint path: a path as given, a Hub id converted once, or — when ``spec`` is empty —
    the paper's model. Prints which model was used when it came from the Hub."""
    from gptcli.commands.render import RichProgress
    from gptcli.interop.hub import DEFAULT_MODEL, describe, resolve_checkpoint

    chosen = os.fspath(spec) if spec else DEFAULT_MODEL
    path, hub_model = resolve_checkpoint(chosen, progress=RichProgress(console))
    if hub_model is not None:
        why = f" (no {flag} given: OpenAI's released GPT-1, the paper's model)" if not spec else ""
        console.print(f"model: {chosen}{why} → {describe(hub_model)}", highlight=False, soft_wrap=True, markup=False)
    return path


def from_hub(spec: str | os.PathLike[str] | None) -> bool:
    """Whether :func:`model` would look ``spec`` up on the Hub (an empty one means the paper's model): commands
    check their data first then, so that missing data is one line before a 480 MB download, not after it."""
    from gptcli.interop.hub import DEFAULT_MODEL, hub_id_of

    return hub_id_of(os.fspath(spec) if spec else DEFAULT_MODEL) is not None


def run_dir(base: str | Path, console: Any, flag: str = "--out") -> Path:
    """A fresh run directory for a run started without ``flag`` (see the module docstring); printed."""
    from gptcli.train.distributed import env_world

    if env_world() is not None:
        raise GPT1Error(f"{flag} is required when the command is started by torchrun or SLURM (every process must "
                        "name the same run directory)")
    base = Path(base)
    out = next_free(base)
    taken = f" ({base} exists; a default never reuses a run)" if out != base else ""
    console.print(f"run directory: {out}{taken}", highlight=False, soft_wrap=True, markup=False)
    return out


__all__ = ["from_hub", "model", "run_dir"]
