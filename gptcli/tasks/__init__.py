"""The task registry: every benchmark of the paper (plus WNLI) by name.

``get_task("rte")`` returns a :class:`Task`; ``all_tasks()`` lists them. Each family module registers its tasks
when imported; the registry imports them on first use.
"""

from __future__ import annotations

import importlib

from gptcli.errors import GPT1Error
from gptcli.tasks.base import Example, ReadOptions, Split, Task

_REGISTRY: dict[str, Task] = {}
# Family modules in gptcli/tasks/, imported lazily on first lookup.
FAMILIES: tuple[str, ...] = ()
_loaded = False


def register(task: Task) -> Task:
    if task.name in _REGISTRY:
        raise ValueError(f"task {task.name!r} registered twice")
    _REGISTRY[task.name] = task
    return task


def _load_families() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for fam in FAMILIES:
            importlib.import_module(f"gptcli.tasks.{fam}")


def all_tasks() -> list[Task]:
    _load_families()
    return list(_REGISTRY.values())


def get_task(name: str) -> Task:
    _load_families()
    key = name.lower()
    if key not in _REGISTRY:
        raise GPT1Error(f"unknown task {name!r} (known: {', '.join(sorted(_REGISTRY))}; see `gpt1 finetune --list-tasks`)")
    return _REGISTRY[key]


__all__ = ["Example", "ReadOptions", "Split", "Task", "all_tasks", "get_task", "register"]
