"""What a check is, and the decorator that registers one (``suite`` orders them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .context import Ctx


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[Ctx], str]
    """Runs the check, records figures through ``ctx.record``; returns a one-line note (raises Skipped/Failed)."""
    timeout_s: int
    """Per-check limit on the GPU (the dry run's own limit is the same)."""
    what: str


REGISTERED: list[Check] = []


def check(name: str, timeout_s: int, what: str) -> Callable:
    def register(fn: Callable[[Ctx], str]) -> Callable[[Ctx], str]:
        REGISTERED.append(Check(name, fn, timeout_s, what))
        return fn

    return register
