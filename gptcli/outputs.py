"""What gpt1 wrote, and may therefore replace: ``--overwrite`` never deletes anything else.

Every output directory gpt1 makes (a corpus, a pretraining run, a fine-tuning run, a checkpoint, an export, a
quickstart) carries a marker file, ``.gpt1-output``, naming its kind. ``--overwrite`` replaces a directory only
when

1. it is gpt1's own output of a kind the command writes (the marker, or for outputs written before markers
   existed, the files that kind always has), and
2. it neither contains nor lies inside an input of the same command (``prepare books --out books`` would
   otherwise delete the books).

Anything else — a folder of notes, a pretraining run given to ``finetune --out``, the input itself — is refused with
a one-line reason, before any work starts. The replacement itself stays atomic (``fsutil.move_into_place``): the
old output survives a failed or interrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from gptcli.errors import GPT1Error
from gptcli.fsutil import regular_file_problem, write_text_atomic

MARKER = ".gpt1-output"

KINDS = {
    "corpus": "a prepared corpus",
    "pretrain-run": "a pretraining run",
    "finetune-run": "a fine-tuning run",
    "checkpoint": "a checkpoint",
    "hf-export": "a Hugging Face export",
    "openai-export": "an export in OpenAI's released format",
    "quickstart": "a quickstart output",
    "zeroshot": "zero-shot results",
    "eval": "evaluation results",
    "task-data": "a task's data fetched by `gpt1 fetch`",
}


def next_free(base: Path) -> Path:
    """``base`` when nothing is there, else the first of ``base-2``, ``base-3``, … that does not exist: where a
    run goes when no ``--out`` was given (a default never lands in an earlier run)."""
    base = Path(base)
    if not base.exists():
        return base
    n = 2
    while base.with_name(f"{base.name}-{n}").exists():
        n += 1
    return base.with_name(f"{base.name}-{n}")


def mark(directory: Path, kind: str) -> None:
    """Label ``directory`` (usually the temporary one, before it is moved into place) as gpt1's ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    # Atomic: a run directory is marked while other ranks may already be checking it.
    write_text_atomic(Path(directory) / MARKER, json.dumps({"kind": kind}) + "\n")


def kind_of(directory: Path) -> str | None:
    """The kind of gpt1 output ``directory`` is, or None when gpt1 did not write it."""
    d = Path(directory)
    marker = d / MARKER
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text(encoding="utf-8")).get("kind")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            return None
        return kind if kind in KINDS else None
    return _legacy_kind(d)


def _legacy_kind(d: Path) -> str | None:
    """Outputs written before markers existed, recognised by the files each kind always has."""
    config = _json(d / "config.json")
    if (d / "manifest.json").is_file() and (d / "tokenizer").is_dir():
        return "corpus"
    if config is not None and "model" in config and "format" in config and (d / "model.safetensors").is_file():
        return "checkpoint"
    if config is not None and config.get("model_type") == "openai-gpt":
        return "hf-export"
    if (d / "config.toml").is_file() and ((d / "checkpoints").is_dir() or (d / "metrics.jsonl").is_file()):
        return "finetune-run" if "task" in _toml_keys(d / "config.toml") else "pretrain-run"
    if (d / "summary.json").is_file() and (d / "corpus").is_dir():
        return "quickstart"
    if (d / "results.json").is_file() and (d / "predictions.jsonl").is_file():
        return "eval"
    if (d / "curve.json").is_file() or ((d / "results.json").is_file() and any(d.glob("predictions-*.jsonl"))):
        return "zeroshot"
    return None


def _json(path: Path) -> dict | None:
    if regular_file_problem(path, limit=64 << 20) is not None:  # never read a FIFO or /dev/zero behind a link
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _toml_keys(path: Path) -> set[str]:
    from gptcli.config import load_file

    try:
        return set(load_file(path))
    except GPT1Error:
        return set()


def _within(a: Path, b: Path) -> bool:
    """Whether ``a`` is ``b`` or lies inside it (both resolved, symlinks followed)."""
    try:
        a.resolve().relative_to(b.resolve())
        return True
    except ValueError:
        return False


def check_output(out: Path, kinds: str | Iterable[str], *, overwrite: bool, inputs: Iterable[Path] = (),
                 flag: str = "--out") -> None:
    """Refuse an output path the command must not write to, with a one-line reason; return if it may proceed.

    ``kinds``: the output kinds this command writes (it may replace only those). ``inputs``: every path the
    command reads (files or directories), which the output must neither contain nor lie inside.
    """
    out = Path(out)
    wanted = {kinds} if isinstance(kinds, str) else set(kinds)
    for src in inputs:
        src = Path(src)
        if src.exists() and (_within(src, out) or _within(out, src)):
            where = "is" if _within(out, src) and _within(src, out) else (
                "contains" if _within(src, out) else "is inside")
            raise GPT1Error(f"{flag} {out} {where} the input {src}; writing there would destroy it "
                            f"(choose an {flag} outside the inputs)")
    if not out.exists():
        return
    if not out.is_dir():
        raise GPT1Error(f"{flag} {out} is a file, not a directory (choose another {flag})")
    if not any(out.iterdir()):
        return  # an empty directory: nothing to lose
    kind = kind_of(out)
    label = " or ".join(KINDS[k] for k in sorted(wanted))
    if kind is None:
        raise GPT1Error(f"{flag} {out} exists and is not something gpt1 wrote; refusing to touch it "
                        f"(choose another {flag}, or move it away yourself)")
    if kind not in wanted:
        raise GPT1Error(f"{flag} {out} holds {KINDS[kind]}, not {label}; refusing to replace it "
                        f"(choose another {flag})")
    if not overwrite:
        raise GPT1Error(f"{flag} {out} already holds {KINDS[kind]} (pass --overwrite to replace it, "
                        f"or choose another {flag})")
