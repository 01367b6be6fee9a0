"""What a task is: how to read its official files, which input transformation it uses, its labels and metric.

Tasks are data. Each dataset family is one small module in ``gptcli/tasks/`` that builds :class:`Task` objects
and registers them; the training loop never branches on a task's name, only on its ``kind``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from gptcli.errors import GPT1Error

Kind = Literal["classification", "entailment", "similarity", "multiple_choice", "regression"]


@dataclass
class Example:
    """One task example, as read from an official file.

    ``texts`` holds the input fields in the order the transformation uses them: ``(sentence,)`` for
    classification, ``(premise, hypothesis)`` for entailment, ``(a, b)`` for similarity/regression and
    ``(context,)`` or ``(context, question)`` for multiple choice, whose answers are in ``choices``.
    ``label`` is a class index, a choice index or a float target; ``None`` for unlabeled test rows.
    """

    texts: tuple[str, ...]
    label: int | float | None = None
    choices: tuple[str, ...] = ()
    uid: str = ""
    """The row's id in its file (GLUE ``index``/``id``, RACE question id), used in submission files."""
    source: str = ""
    """``path:line`` of the row, for error messages."""
    extra: dict = field(default_factory=dict)
    """Anything a task wants to keep (e.g. RACE's middle/high level, MNLI's genre)."""


Reader = Callable[[Path, "ReadOptions"], list[Example]]


@dataclass
class ReadOptions:
    skip_bad_rows: bool = False
    """Skip (and count) malformed rows instead of stopping at the first one."""
    skipped: list[str] = field(default_factory=list)
    """Filled by readers: one ``path:line: reason`` per skipped row."""


@dataclass
class Split:
    """One split of a task: its file(s) relative to the task folder and how to read them."""

    files: tuple[str, ...]
    reader: Reader
    labeled: bool = True


@dataclass
class Task:
    name: str
    """Registry name, e.g. ``rte``, ``mnli-m``, ``race-h``."""
    title: str
    kind: Kind
    labels: tuple[str, ...]
    """Label strings as the official files (and GLUE submissions) write them; empty for regression."""
    metric: str
    """Headline metric: ``accuracy``, ``f1``, ``mcc`` or ``pearson``."""
    folder: str
    """The official folder name looked up under ``$GPT1_DATA``."""
    splits: dict[str, Split]
    source_url: str = ""
    """Where the official distribution comes from (shown when data is missing)."""
    paper_score: float | None = None
    """GPT-1's published number for the headline metric (reference §6), in percent."""
    n_choices: int = 0
    """Answers per example for multiple-choice tasks."""
    notes: str = ""
    """Truncation rule and other task-specific documentation."""

    def data_dir(self, data_dir: str | Path | None = None) -> Path:
        """``data_dir`` if given, else ``$GPT1_DATA/<folder>``; raises with the expected files when missing."""
        if data_dir is not None:
            d = Path(data_dir)
        elif os.environ.get("GPT1_DATA"):
            d = Path(os.environ["GPT1_DATA"]) / self.folder
        else:
            raise GPT1Error(
                f"no data location for task {self.name!r}: pass --data-dir or set GPT1_DATA so that "
                f"$GPT1_DATA/{self.folder}/ holds {', '.join(sorted({f for s in self.splits.values() for f in s.files}))}"
                + (f" (official distribution: {self.source_url})" if self.source_url else "")
            )
        if not d.is_dir():
            raise GPT1Error(f"{d}: data directory for task {self.name!r} not found" + (f" (get it from {self.source_url})" if self.source_url else ""))
        return d

    def read(self, split: str, data_dir: str | Path | None = None, options: ReadOptions | None = None) -> list[Example]:
        if split not in self.splits:
            raise GPT1Error(f"task {self.name!r} has no split {split!r} (splits: {', '.join(self.splits)})")
        d = self.data_dir(data_dir)
        sp = self.splits[split]
        opts = options or ReadOptions()
        out: list[Example] = []
        for f in sp.files:
            path = d / f
            if not path.is_file():
                raise GPT1Error(
                    f"{path}: missing {split} file for task {self.name!r} (expected {', '.join(sp.files)} in {d})"
                    + (f"; official distribution: {self.source_url}" if self.source_url else "")
                )
            out.extend(sp.reader(path, opts))
        return out
