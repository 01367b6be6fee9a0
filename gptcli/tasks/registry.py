"""The task registry: every benchmark of the paper (plus WNLI) by name.

``get_task("rte")`` returns a :class:`Task`; ``all_tasks()`` lists them. Each family module registers its tasks
when imported; the registry imports them on first use.

DPRD and WSC273 (paper §5, Figure 2) are registered for zero-shot scoring only: their kind, ``pronoun_resolution``,
has no input transformation. Lookups serve fine-tuning unless asked with ``zero_shot=True`` (as ``gpt1 zeroshot``
does), so ``gpt1 finetune``, ``--list-tasks`` and ``gpt1 eval`` never offer a task they cannot train or score.
"""

from __future__ import annotations

import importlib

from gptcli.errors import GPT1Error
from gptcli.tasks.base import Example, ReadOptions, Split, Task

_REGISTRY: dict[str, Task] = {}
# Family modules in gptcli/tasks/, imported lazily on first lookup.
FAMILIES: tuple[str, ...] = ("glue", "snli", "scitail", "race", "storycloze", "winograd")
_loaded = False


def register(task: Task) -> Task:
    if task.name in _REGISTRY:
        raise ValueError(f"task {task.name!r} registered twice")
    _REGISTRY[task.name] = task
    return task


def unregister(name: str) -> None:
    """Remove a task registered at run time (e.g. one a program builds for itself, like the quickstart's)."""
    _REGISTRY.pop(name, None)


def _load_families() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for fam in FAMILIES:
            importlib.import_module(f"gptcli.tasks.{fam}")


def all_tasks(*, zero_shot: bool = False) -> list[Task]:
    """Every task that can be fine-tuned, in the paper's table order (then any others by name); with
    ``zero_shot=True`` also the tasks scored zero-shot only (DPRD, WSC273), after them."""
    _load_families()
    return sorted((t for t in _REGISTRY.values() if zero_shot or t.finetunable), key=_order)


# The paper's table order (Tables 2-4), used by ``all_tasks`` and ``--list-tasks``.
PAPER_ORDER: tuple[str, ...] = (
    "mnli",
    "mnli-mm",
    "snli",
    "scitail",
    "qnli",
    "rte",
    "wnli",
    "storycloze",
    "race-m",
    "race-h",
    "race",
    "cola",
    "sst2",
    "mrpc",
    "stsb",
    "qqp",
    "dprd",
    "wsc",
)


def _order(t: Task) -> tuple[int, str]:
    return (PAPER_ORDER.index(t.name), "") if t.name in PAPER_ORDER else (len(PAPER_ORDER), t.name)


def task_rows() -> list[dict]:
    """The registry as plain rows for ``gpt1 finetune --list-tasks`` (the command renders them).

    Keys: ``name``, ``title``, ``kind``, ``transformation``, ``labels`` (official strings, joined; "score in
    [0, 5]" for regression), ``metric`` (headline, then extra metrics), ``paper`` (GPT-1's score or None),
    ``location`` (``$GPT1_DATA/<folder>``), ``files`` (what the folder must hold), ``splits``, ``source``.
    """
    rows = []
    for t in all_tasks():
        rows.append(
            {
                "name": t.name,
                "title": t.title,
                "kind": t.kind,
                "transformation": t.transformation,
                "labels": ", ".join(t.labels) if t.labels else "score in [0, 5]",
                "metric": " / ".join((t.metric, *t.extra_metrics)),
                "paper": t.paper_score,
                "location": f"$GPT1_DATA/{t.folder}",
                "files": ", ".join(t.files),
                "splits": ", ".join(t.splits),
                "source": t.source_url,
            }
        )
    return rows


def get_task(name: str, *, zero_shot: bool = False) -> Task:
    """The task called ``name`` (any case). A task scored zero-shot only (DPRD, WSC273) is found only with
    ``zero_shot=True``; otherwise its name is an error that points to ``gpt1 zeroshot``."""
    _load_families()
    key = name.lower()
    task = _REGISTRY.get(key)
    if task is not None and (zero_shot or task.finetunable):
        return task
    if task is not None:
        raise GPT1Error(
            f"task {name!r} is scored zero-shot only: the paper gives {task.title} no fine-tuning "
            f"transformation (use `gpt1 zeroshot --task {key}`)"
        )
    known = sorted(n for n, t in _REGISTRY.items() if zero_shot or t.finetunable)
    raise GPT1Error(f"unknown task {name!r} (known: {', '.join(known)}; see `gpt1 finetune --list-tasks`)")


__all__ = [
    "FAMILIES",
    "PAPER_ORDER",
    "Example",
    "ReadOptions",
    "Split",
    "Task",
    "all_tasks",
    "get_task",
    "register",
    "task_rows",
    "unregister",
]
