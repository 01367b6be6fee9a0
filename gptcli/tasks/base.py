"""What a task is: how to read its official files, which input transformation it uses, its labels and metric.

Tasks are data. Each dataset family is one small module in ``gptcli/tasks/`` that builds :class:`Task` objects
and registers them; the training loop never branches on a task's name, only on its ``kind``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from gptcli import guide
from gptcli.errors import GPT1Error
from gptcli.files.fsutil import regular_file_problem
from gptcli.tasks.sources import MANUAL, SOURCES

DATA_ENV = "GPT1_DATA"
T = TypeVar("T")


def data_root() -> Path:
    """Where task folders are looked for (and ``gpt1 fetch`` writes them): ``$GPT1_DATA``, else
    ``~/.cache/gpt1/data`` (beside the converted models and the encoded-example cache)."""
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt1" / "data"


Kind = Literal["classification", "entailment", "similarity", "multiple_choice", "regression", "pronoun_resolution"]

TRANSFORMATIONS: dict[str, str] = {
    "classification": "<s> text <e>",
    "entailment": "<s> premise $ hypothesis <e>",
    "similarity": "<s> a $ b <e> + <s> b $ a <e> (final states summed)",
    "regression": "<s> a $ b <e> + <s> b $ a <e> (final states summed), linear output",
    "multiple_choice": "<s> context question $ answer <e> per answer, softmax over answers",
}
"""The paper's input transformations (reference §4) by task kind, as shown by ``--list-tasks``. A kind without one
(``pronoun_resolution``: DPRD, WSC273) is scored zero-shot only (paper §5); the paper never fine-tunes on it."""
ZERO_SHOT_ONLY = "none: zero-shot only (each candidate substituted for the pronoun, paper §5)"


@dataclass
class Example:
    """One task example, as read from an official file.

    ``texts`` holds the input fields in the order the transformation uses them: ``(sentence,)`` for
    classification, ``(premise, hypothesis)`` for entailment, ``(a, b)`` for similarity/regression and
    ``(context,)`` or ``(context, question)`` for multiple choice, whose answers are in ``choices``, and
    ``(before, pronoun, after)`` for pronoun resolution, whose candidate referents are in ``choices``.
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
    skippable: bool = False
    """The reading command has ``--skip-bad-rows``: a bad row's error suggests it (else, the task's own file)."""
    skipped: list[str] = field(default_factory=list)
    """Filled by readers: one ``path:line: reason`` per skipped row."""
    excluded: list[str] = field(default_factory=list)
    """Filled by readers: one ``path:line: reason`` per row the dataset's own rule leaves out (not an error),
    e.g. SNLI/MNLI ``gold_label == "-"`` (no annotator consensus)."""


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
    """The official folder name looked up under the data root (``$GPT1_DATA``, else ``~/.cache/gpt1/data``)."""
    splits: dict[str, Split]
    source_url: str = ""
    """Where the official distribution comes from (shown when data is missing)."""
    paper_score: float | None = None
    """GPT-1's published number for the headline metric (reference §6), in percent."""
    n_choices: int = 0
    """Answers per example for multiple-choice tasks."""
    notes: str = ""
    """Truncation rule and other task-specific documentation."""
    parent_folders: tuple[str, ...] = ()
    """Extra parents under ``$GPT1_DATA`` tried after the root, e.g. ``glue_data`` (as GLUE's download script
    lays it out): ``$GPT1_DATA/<folder>`` first, then ``$GPT1_DATA/<parent>/<folder>``."""
    glue_name: str = ""
    """GLUE submission file stem (``SST-2``, ``MNLI-m``, ...); empty for tasks outside GLUE."""
    extra_metrics: tuple[str, ...] = ()
    """Metrics reported besides the headline one (e.g. ``spearman`` for STS-B, ``accuracy`` for MRPC/QQP)."""

    shape: str = ""
    """The transformation in this task's own words when its kind's reads wrong for it (Story Cloze has a story
    and an ending, no question); empty: the kind's (:data:`TRANSFORMATIONS`)."""

    @property
    def transformation(self) -> str:
        """The input transformation of the paper (reference §4) this task's kind uses, in words."""
        return self.shape or TRANSFORMATIONS.get(self.kind, ZERO_SHOT_ONLY)

    @property
    def finetunable(self) -> bool:
        """Whether the task can be fine-tuned: its kind has an input transformation (reference §4). DPRD and
        WSC273 are read by the same registry but scored zero-shot only (paper §5)."""
        return self.kind in TRANSFORMATIONS

    @property
    def files(self) -> tuple[str, ...]:
        """Every file (or folder, for RACE) any split expects, relative to the task folder, without repeats."""
        return tuple(dict.fromkeys(f for s in self.splits.values() for f in s.files))

    def candidate_dirs(self, root: str | Path | None = None) -> list[Path]:
        """Where the task folder is looked for under ``root`` (default :func:`data_root`: ``$GPT1_DATA``, else
        ``~/.cache/gpt1/data``): ``<root>/<folder>``, then ``<root>/<parent>/<folder>`` for each of
        :attr:`parent_folders`."""
        base = Path(root) if root is not None and str(root) else data_root()
        return [base / self.folder] + [base / p / self.folder for p in self.parent_folders]

    def how_to_get(self) -> str:
        """What to do when the data is missing: the command that downloads it, or where a person gets it."""
        if self.folder in SOURCES:
            return (
                f"fetch it with `gpt1 fetch {self.name}`, or get the official distribution: "
                f"{self.source_url or 'see ' + guide.page('datasets.md')}"
            )
        if self.folder in MANUAL:
            return MANUAL[self.folder]
        return self._where()

    def _where(self) -> str:
        """Where a person gets the data by hand: the official distribution, else the guide's datasets page."""
        return f"official distribution: {self.source_url}" if self.source_url else f"see {guide.page('datasets.md')}"

    def data_dir(self, data_dir: str | os.PathLike[str] | None = None, *, root: str | Path | None = None) -> Path:
        """``data_dir`` if given, else ``<root>/<folder>`` (or under a :attr:`parent_folders` entry) with ``root``
        defaulting to :func:`data_root`; raises :class:`GPT1Error` naming the expected files and how to get them
        when missing. ``root`` serves callers that read several tasks from one folder (``gpt1 zeroshot --task all``)."""
        expected = ", ".join(self.files)
        if data_dir is not None:
            d = Path(data_dir)
            if not d.is_dir():
                where = self._where()
                raise GPT1Error(
                    f"{d}: data directory for task {self.name!r} not found (expected a folder "
                    f"{self.folder}/ holding {expected}; {where})"
                )
            return d
        candidates = self.candidate_dirs(root)
        for d in candidates:
            if d.is_dir():
                return d
        unset = "" if root is not None or os.environ.get(DATA_ENV) else ", the default data root: GPT1_DATA is not set"
        raise GPT1Error(
            f"{candidates[0]}: data directory for task {self.name!r} not found (looked in "
            f"{', '.join(str(c) for c in candidates)}{unset}; expected {expected}; {self.how_to_get()})"
        )

    def read(self, split: str, data_dir: str | Path | None = None, options: ReadOptions | None = None) -> list[Example]:
        """Read one split from ``data_dir`` (the task's official folder) or ``$GPT1_DATA/<folder>``.

        Every row is validated; a bad row raises :class:`~gptcli.errors.DataError` (``path:line: reason``)
        unless ``options.skip_bad_rows``, in which case it is skipped and recorded in ``options.skipped``.
        Unlabeled test files give examples with ``label=None``.
        """
        if split not in self.splits:
            raise GPT1Error(f"task {self.name!r} has no split {split!r} (splits: {', '.join(self.splits)})")
        d = self.data_dir(data_dir)
        sp = self.splits[split]
        opts = options or ReadOptions()
        out: list[Example] = []
        skipped_before = len(opts.skipped)
        for f in sp.files:
            path = d / f
            if not path.exists():  # a file, or a folder of files for RACE
                raise GPT1Error(
                    f"{path}: missing {split} file for task {self.name!r} (expected {', '.join(sp.files)} in {d}; "
                    f"{self.how_to_get()})"
                )
            problem = None if path.is_dir() else regular_file_problem(path)
            if problem is not None:  # a FIFO would block forever, /dev/zero never ends
                raise GPT1Error(
                    f"{path}: {problem}; task files are read only when they are regular files "
                    f"(put the official file there)"
                )
            out.extend(sp.reader(path, opts))
        if not out:  # header-only, blank or CR-only: every command refuses it alike, none scores nothing
            bad = len(opts.skipped) - skipped_before
            why = f"all {bad} rows were bad and skipped" if bad else "only a header, blank lines or no line breaks"
            raise GPT1Error(
                f"{d / sp.files[0]}: split {split!r} of task {self.name!r} has no examples ({why}; "
                f"put the official file there)"
            )
        return out


EVAL_SUBSET_SEED = 0
"""The seed of every evaluation subset (``finetune --max-eval-examples``, ``eval --max-examples``): a fine-tuning
run's dev score and ``gpt1 eval``'s are on the same examples, whatever the run's training seed."""


def subsample(items: list[T], n: int | None, seed: int) -> list[T]:
    """A random subset of ``n`` items in their original order (all of them when ``n`` is None or larger)."""
    if n is None or n >= len(items):
        return items
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]
