"""The defaults that make the short command lines work, decided in one place and always said out loud.

- **The model.** A checkpoint option (``finetune --init``, ``zeroshot``/``generate --checkpoint``) that is not given
  means ``openai-gpt``, OpenAI's released GPT-1 (the paper's model); a Hub id given anywhere a checkpoint is taken
  is downloaded and converted once (:mod:`gptcli.interop.hub`). Each prints one line naming the model and commit.
- **The run directory.** A run without ``--out`` gets ``runs/<command>-<task>`` (``runs/pretrain`` for
  pretraining), or the next free ``-2``, ``-3``, … when that exists: a default never lands in an earlier run. The
  choice is printed. Under torchrun or SLURM every process must name the same directory, so ``--out`` is required.
- **The data.** Task folders are looked for under ``$GPT1_DATA``, else ``~/.cache/gpt1/data``
  (:func:`gptcli.tasks.base.data_root`), where ``gpt1 fetch`` puts them. A fetchable task missing from that default
  root is fetched on first use (:func:`task_data`), like the model; a folder the user chose is never written to.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import printable
from gptcli.files.outputs import next_free
from gptcli.tasks.base import Task


def model(spec: str | os.PathLike[str] | None, console: Console, flag: str = "--checkpoint") -> str:
    """``spec`` as a local checkpoint path: a path as given, a Hub id converted once, or — when ``spec`` is empty —
    the paper's model. Prints which model was used when it came from the Hub; a failure names ``flag``."""
    from gptcli.commands.render import RichProgress
    from gptcli.interop.hub import DEFAULT_MODEL, describe, resolve_checkpoint

    chosen = os.fspath(spec) if spec else DEFAULT_MODEL
    try:
        path, hub_model = resolve_checkpoint(chosen, progress=RichProgress(console))
    except GPT1Error as e:
        raise GPT1Error(f"{e}; a local checkpoint directory is given with {flag} DIR") from None
    if hub_model is not None:
        why = f" (no {flag} given: OpenAI's released GPT-1, the paper's model)" if not spec else ""
        console.print(
            printable(f"model: {chosen}{why} → {describe(hub_model)}"), highlight=False, soft_wrap=True, markup=False
        )
    return path


def task_data(
    task: Task,
    data_dir: str | os.PathLike[str] | None,
    console: Console,
    *,
    check: bool = True,
    hub_model: tuple[str, str] | None = None,
) -> None:
    """``task``'s data, before anything else happens. Missing from the default data root (``GPT1_DATA`` unset, no
    ``--data-dir``) and fetchable: fetched now, said, into ``~/.cache/gpt1/data`` (:mod:`gptcli.interop.datasets`:
    the official layout, counts checked) — the same as ``gpt1 fetch TASK``. A folder the user chose is never
    written to: with ``check`` (a model is about to be downloaded) its absence is the usual one-line error now,
    naming ``gpt1 fetch``, rather than after the download; without, the library reports it when it reads.

    ``hub_model`` (the model's spec and its option, when it too comes from the Hub): a failure here also says how to
    supply the model, so that a user without the Hub learns both in one round, not the model's after the data's."""
    from gptcli.interop.hub import hf_offline
    from gptcli.tasks.base import DATA_ENV
    from gptcli.tasks.sources import SOURCES
    from gptcli.train.distributed import env_world

    user_chosen = data_dir is not None or bool(os.environ.get(DATA_ENV))
    # One process of a torchrun/SLURM job does not download for the others: `gpt1 fetch` first.
    fetching = not (
        user_chosen
        or env_world() is not None
        or task.folder not in SOURCES
        or any(d.is_dir() for d in task.candidate_dirs())
    )
    try:
        if fetching:
            _fetch(task, console)
        elif check:
            task.data_dir(data_dir)  # there, or the line saying what is missing and how to get it
    except GPT1Error as e:
        if not (fetching or (hf_offline() and hub_model is not None)):
            raise
        data = "the task data with --data-dir DIR (or GPT1_DATA, the folder holding the task folders)"
        both = (
            f" and the model with {hub_model[1]} CHECKPOINT (a local checkpoint directory; {hub_model[0]} comes "
            "from the Hub too)"
            if hub_model is not None
            else ""
        )
        raise GPT1Error(f"{e}; without the Hugging Face Hub, give {data}{both}") from None


def _fetch(task: Task, console: Console) -> None:
    """Fetch ``task``'s folder into the default data root, saying so first."""
    from gptcli.commands.render import RichProgress
    from gptcli.interop.datasets import fetch_folder
    from gptcli.tasks.base import data_root
    from gptcli.tasks.sources import SOURCES

    source = SOURCES[task.folder]
    console.print(
        printable(
            f"data: {task.folder} is not in {data_root()} (the default data root; GPT1_DATA is not set): "
            f"fetching it from the Hugging Face Hub ({source.repo}), once"
        ),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    fetch_folder(source, data_root(), progress=RichProgress(console))


def hub_model(specs: list[str], flag: str) -> tuple[str, str] | None:
    """The first of ``specs`` that comes from the Hub, with ``flag`` (for :func:`task_data`); None when none does."""
    from gptcli.interop.hub import DEFAULT_MODEL

    return next(((s or DEFAULT_MODEL, flag) for s in specs if from_hub(s)), None)


def from_hub(spec: str | os.PathLike[str] | None) -> bool:
    """Whether :func:`model` would look ``spec`` up on the Hub (an empty one means the paper's model)."""
    from gptcli.interop.hub import DEFAULT_MODEL, hub_id_of

    return hub_id_of(os.fspath(spec) if spec else DEFAULT_MODEL) is not None


def run_dir(base: str | Path, console: Console, flag: str = "--out") -> Path:
    """A fresh run directory for a run started without ``flag`` (see the module docstring); printed."""
    from gptcli.train.distributed import env_world

    if env_world() is not None:
        raise GPT1Error(
            f"{flag} is required when the command is started by torchrun or SLURM (every process must "
            "name the same run directory)"
        )
    base = Path(base)
    out = next_free(base)
    taken = f" ({base} exists; a default never reuses a run)" if out != base else ""
    console.print(printable(f"run directory: {out}{taken}"), highlight=False, soft_wrap=True, markup=False)
    return out


__all__ = ["from_hub", "hub_model", "model", "run_dir", "task_data"]
