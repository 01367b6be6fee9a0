"""The paper's benchmarks as data (paper §3.3, Tables 2-4): one module per dataset family, one registry.

``get_task("rte")`` returns a :class:`Task` (how to read its official files, its input transformation, labels and
metric); ``all_tasks()`` lists them. The registry lives in ``registry.py``; families register on first lookup.
"""

from __future__ import annotations

from gptcli.tasks.base import Example, ReadOptions, Split, Task
from gptcli.tasks.registry import FAMILIES, PAPER_ORDER, all_tasks, get_task, register, task_rows, unregister

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
