"""How a long-running library function tells its caller what it is doing: one callback protocol for all of them.

``prepare``, ``pretrain``, ``finetune``, ``zeroshot``, the zero-shot curve and ``quickstart`` each take a
``progress: Progress`` argument and report through these four calls, nothing else. The library never draws
anything; the command layer passes a renderer (``gptcli.commands.render.RichProgress``) and a Python caller passes
nothing (silence) or its own subclass.

Stages nest: a pipeline's stage contains the stages of the functions it calls (the quickstart's "pretrain" stage
holds ``pretrain``'s own), so a renderer keeps a stack. Every ``stage`` is closed by exactly one ``end``, also when
the work inside fails (use :func:`staged`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["info", "warn"]


class Progress:
    """The protocol, and its silent implementation: subclass and override what you want to see."""

    def stage(self, name: str, total: float | None = None, *, unit: str = "", done: float = 0) -> None:
        """A unit of work begins. ``total``: its size in ``unit`` ("B" for bytes, "" for items such as updates)
        when known; ``done``: how much of it was already done (a resumed run starts part-way)."""

    def advance(self, n: float = 0, **status: Any) -> None:
        """``n`` more units of the current stage are done. ``status``: the live figures worth showing now
        (loss=..., lr=..., docs=...); numbers are formatted by the renderer, strings shown as given."""

    def note(self, message: str, *, level: Level = "info") -> None:
        """A line worth keeping: a decision, a result, or (``level="warn"``) a problem that was worked around."""

    def end(self, summary: str = "") -> None:
        """The current stage is finished; ``summary`` says what it produced (may be empty)."""


SILENT = Progress()
"""The default everywhere: report nothing."""


@contextlib.contextmanager
def staged(
    progress: Progress, name: str, total: float | None = None, *, unit: str = "", done: float = 0
) -> Iterator[None]:
    """``with staged(p, "encode", total): ...``: a stage that is ended however the block exits."""
    progress.stage(name, total, unit=unit, done=done)
    try:
        yield
    finally:
        progress.end()


@dataclass
class RecordingProgress(Progress):
    """Keeps every call as ``(kind, payload)``: for tests, and for callers that want the events afterwards."""

    events: list[tuple[str, Any]] = field(default_factory=list)

    def stage(self, name: str, total: float | None = None, *, unit: str = "", done: float = 0) -> None:
        self.events.append(("stage", {"name": name, "total": total, "unit": unit, "done": done}))

    def advance(self, n: float = 0, **status: Any) -> None:
        self.events.append(("advance", {"n": n, **status}))

    def note(self, message: str, *, level: Level = "info") -> None:
        self.events.append(("note", {"message": message, "level": level}))

    def end(self, summary: str = "") -> None:
        self.events.append(("end", {"summary": summary}))

    def of(self, kind: str) -> list[Any]:
        """The payloads of one kind of call, in order."""
        return [payload for k, payload in self.events if k == kind]
