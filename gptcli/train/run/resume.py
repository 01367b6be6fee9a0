"""What ``--resume`` refuses to change.

A resumed run must be the run it continues, or its checkpoints, metrics and results would describe a run that never
happened. Every kind of run states, for each of its settings, whether it *defines* the run (a resume that changes
it is refused, naming it), is *adjustable* (taken, with a note: how the same run is computed or how long it goes),
or is taken *silently* (where things are, how the run is watched). :func:`check_resume` is the one check: the
settings by those rules, the model's shape, and whatever inputs the job compares by content (pretraining's corpus,
fine-tuning's init weights, data files and encoded examples).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcli.checkpoint import Header
from gptcli.errors import GPT1Error
from gptcli.model.build import AnyConfig, arch_of

# Model config fields a resume may change: dropout is regularisation, not shape (out_pdrop: the LSTM's).
ADJUSTABLE_MODEL = ("embd_pdrop", "attn_pdrop", "resid_pdrop", "out_pdrop")


@dataclass(frozen=True)
class SettingRules:
    """How a kind of run treats each field of its config on ``--resume`` (every field is in exactly one group:
    tests/train/test_resume_rules.py)."""

    defining: tuple[str, ...]
    """Settings that define what the run's updates are: a resume that changes one is refused."""
    adjustable: tuple[str, ...]
    """Settings a resume may change, each noted when it does."""
    silent: tuple[str, ...]
    """Settings taken silently: where things are (compared by content instead), how the run is watched and kept,
    and the switches that say what to do with ``--out`` this time."""
    older_runs: Mapping[str, Any] = field(default_factory=dict)
    """What a run recorded before a setting existed did (compared instead of the setting's default)."""
    defining_values: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Values of an adjustable setting that change what the run computes, not only how: a resume that changes the
    setting to or from one of them is refused like a defining change (its other changes are noted)."""

    def setting_changes(self, config: Any, saved: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """(changed defining settings, changed adjustable ones) of ``config`` against the ``saved`` settings, each
        as ``"key old → new"``. A key missing from ``saved`` was None (TOML has no null) or did not exist yet."""
        defaults = {f.name: _default(f) for f in dataclasses.fields(config)} | dict(self.older_runs)
        changed: list[str] = []
        adjusted: list[str] = []
        for key in self.defining + self.adjustable:
            was, now = saved.get(key, defaults[key]), getattr(config, key)
            if was != now:
                values = self.defining_values.get(key, ())
                noted = key in self.adjustable and was not in values and now not in values
                (adjusted if noted else changed).append(f"{key} {was} → {now}")
        return changed, adjusted


def _default(f: dataclasses.Field) -> Any:
    """A field's default, made by its factory where it has one (``kernels``: the process's mode)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    factory = f.default_factory
    return None if factory is dataclasses.MISSING else factory()


def model_changes(header: Header, mcfg: AnyConfig) -> tuple[list[str], list[str]]:
    """(changes of the model's architecture or shape, changes of its dropouts) against a checkpoint's header."""
    changed: list[str] = []
    adjusted: list[str] = []
    if header.arch != arch_of(mcfg):  # the shared shape fields alone cannot tell an LSTM apart
        changed.append(f"architecture {header.arch} → {arch_of(mcfg)}")
    for key, was in header.model.items():
        now = getattr(mcfg, key, was)
        if now != was:
            (adjusted if key in ADJUSTABLE_MODEL else changed).append(f"model {key} {was} → {now}")
    return changed, adjusted


def check_resume(
    out: str | Path,
    rules: SettingRules,
    config: Any,
    saved: Mapping[str, Any],
    header: Header,
    mcfg: AnyConfig,
    inputs: Sequence[str] = (),
    unexplained: str | None = None,
) -> list[str]:
    """Refuse a resume from the checkpoint with ``header`` that would change what the run is — a changed input
    (``inputs``, named by the job), architecture or shape, or defining setting — naming every change with its old
    and new value; returns a note for the adjustable ones that changed. ``unexplained`` is a difference the job saw
    but cannot attribute (fine-tuning's encoded examples): named only when nothing else explains it."""
    settings, adjusted = rules.setting_changes(config, saved)
    shape, dropouts = model_changes(header, mcfg)
    changed = [*inputs, *shape, *settings]
    if not changed and unexplained is not None:
        changed.append(unexplained)
    if changed:
        raise GPT1Error(
            f"{out}: cannot resume with changed settings: {', '.join(changed)} (these define the run: "
            "resume without changing them, or start a new run with another --out)"
        )
    notes = [*dropouts, *adjusted]
    return [f"resuming with changed settings: {', '.join(notes)}"] if notes else []
