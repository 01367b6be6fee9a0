"""What gpt1 wrote, and may therefore replace: ``--overwrite`` never deletes anything else.

Every output directory gpt1 makes (a corpus, a run, a checkpoint, an export, a quickstart) carries a marker file,
``.gpt1-output``, naming its kind. ``--overwrite`` replaces a directory only when it is gpt1's own output of a kind
the command writes (a run's step checkpoints, which have no marker, by their gpt1 ``config.json``); when everything
in it is what that kind writes (:data:`OWNED`: a file the user added is named and refused, not deleted with the
rest); and when it neither contains nor lies inside an input of the command, nor lies in a run's ``checkpoints/``
(where ``--resume`` would pick it). Anything else is refused with a one-line reason before any work starts, and
the replacement stays atomic (``fsutil.move_into_place``).

Why a marker: guessing from file names (``results.json``, a ``config.json`` with a ``model_type``) once took a
user's folder, or a model downloaded from the Hub, for gpt1's and deleted it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import regular_file_problem, write_text_atomic

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


_RUN = ("config.toml", "metrics.jsonl", "checkpoints", "wandb", "tensorboard", "eval", "zeroshot", "workers.log")
OWNED: dict[str, tuple[str, ...]] = {
    "corpus": ("manifest.json", "tokenizer", "*.arrow"),
    "pretrain-run": _RUN,
    "finetune-run": _RUN + ("results.json",),
    "checkpoint": (
        "config.json",
        "model.safetensors",
        "tokenizer",
        "optimizer.safetensors",
        "training_state.json",
        "best.safetensors",
    ),
    "hf-export": (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
    ),
    "openai-export": ("params_*.npy", "params_shapes.json", "encoder_bpe_40000.json", "vocab_40000.bpe"),
    "quickstart": ("text", "task", "corpus", "pretrain", "finetune", "eval", "zeroshot", "summary.json", "config.toml"),
    "zeroshot": ("results.json", "predictions-*.jsonl", "curve.json", "curve.png"),
    "eval": ("results.json", "predictions.jsonl", "*.tsv"),
    "task-data": (".gpt1-fetch.json",),  # and the task's official files, which the fetch names (``owned``)
}
"""The top-level entries each kind of output writes (glob patterns). Besides these, a kind owns its marker, the
hidden leftovers of an interrupted write beside an entry (``.NAME.tmp-…``, ``.NAME.partial-…``, ``.NAME.lock``)
and subfolders that are marked outputs of its own kind (a zero-shot curve's per-checkpoint results)."""

_LEFTOVER = re.compile(r"^\..+\.(lock|(partial|old|new|tmp|fetch)[-.].*)$|^\.quickstart-old-")
_RUNS = ("pretrain-run", "finetune-run")


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
    """A run's step or final checkpoint, which training writes without a marker: its ``config.json`` is gpt1's own
    format (``model`` and ``format`` keys) beside ``model.safetensors``."""
    config = _json(d / "config.json")
    if config is not None and "model" in config and "format" in config and (d / "model.safetensors").is_file():
        return "checkpoint"
    return None


def foreign_entries(out: Path, kind: str, owned: Iterable[str] = ()) -> list[str]:
    """The names in ``out`` that a ``kind`` output does not write (``owned``: more patterns it does), sorted."""
    patterns = OWNED.get(kind, ()) + tuple(owned)

    def ours(entry: Path) -> bool:
        name = entry.name
        if name == MARKER or _LEFTOVER.match(name) or any(fnmatch(name, p) for p in patterns):
            return True
        return (
            entry.is_dir()
            and not entry.is_symlink()
            and (entry / MARKER).is_file()
            and kind_of(entry) == kind
            and not foreign_entries(entry, kind)
        )  # a curve's per-checkpoint results, the user's files in it too

    return sorted(e.name for e in Path(out).iterdir() if not ours(e))


def check_replaceable(out: Path, kind: str, *, flag: str = "--out", owned: Iterable[str] = ()) -> None:
    """Refuse to replace ``out`` (gpt1's ``kind`` output) when it holds anything that kind does not write: the
    replacement would delete it with the rest."""
    foreign = foreign_entries(out, kind, owned)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise GPT1Error(
            f"{flag} {out} holds {KINDS[kind]} and files gpt1 did not write ({shown}); replacing it "
            f"would delete them (move them out of {out}, or choose another {flag})"
        )


def _in_run_checkpoints(out: Path) -> Path | None:
    """The run whose ``checkpoints/`` folder ``out`` is in (its step checkpoints are what --resume reads), or None."""
    parent = out.resolve().parent if out.exists() else out.absolute().parent
    if parent.name == "checkpoints" and kind_of(parent.parent) in _RUNS:
        return parent.parent
    return None


def _json(path: Path) -> dict | None:
    if regular_file_problem(path, limit=64 << 20) is not None:  # never read a FIFO or /dev/zero behind a link
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _within(a: Path, b: Path) -> bool:
    """Whether ``a`` is ``b`` or lies inside it (both resolved, symlinks followed)."""
    try:
        a.resolve().relative_to(b.resolve())
        return True
    except ValueError:
        return False


def check_output(
    out: Path,
    kinds: str | Iterable[str],
    *,
    overwrite: bool,
    inputs: Iterable[Path] = (),
    flag: str = "--out",
    replacing: bool | None = None,
    owned: Iterable[str] = (),
) -> None:
    """Refuse an output path the command must not write to, with a one-line reason; return if it may proceed.

    ``kinds``: the output kinds this command writes (it may replace only those). ``inputs``: every path the command
    reads, which the output must neither contain nor lie inside. ``replacing`` (default: ``overwrite``): whether an
    existing output will be replaced whole, so that anything in it gpt1 did not write must be refused (a run directory
    passes False and checks when it decides to replace). ``owned``: more entries the output's kind writes.
    """
    out = Path(out)
    wanted = {kinds} if isinstance(kinds, str) else set(kinds)
    for src in inputs:
        src = Path(src)
        if src.exists() and (_within(src, out) or _within(out, src)):
            where = (
                "is" if _within(out, src) and _within(src, out) else ("contains" if _within(src, out) else "is inside")
            )
            raise GPT1Error(
                f"{flag} {out} {where} the input {src}; writing there would destroy it "
                f"(choose an {flag} outside the inputs)"
            )
    run = _in_run_checkpoints(out)
    if run is not None:
        raise GPT1Error(
            f"{flag} {out} is in the checkpoints folder of {KINDS[kind_of(run) or 'pretrain-run']} "
            f"{run}, where it would become the checkpoint that run resumes from (choose an {flag} "
            f"outside {run / 'checkpoints'})"
        )
    if not out.exists():
        return
    if not out.is_dir():
        raise GPT1Error(f"{flag} {out} is a file, not a directory (choose another {flag})")
    if not any(out.iterdir()):
        return  # an empty directory: nothing to lose
    kind = kind_of(out)
    label = " or ".join(KINDS[k] for k in sorted(wanted))
    if kind is None:
        raise GPT1Error(
            f"{flag} {out} exists and is not something gpt1 wrote; refusing to touch it "
            f"(choose another {flag}, or move it away yourself)"
        )
    if kind not in wanted:
        raise GPT1Error(
            f"{flag} {out} holds {KINDS[kind]}, not {label}; refusing to replace it (choose another {flag})"
        )
    if not overwrite:
        raise GPT1Error(
            f"{flag} {out} already holds {KINDS[kind]} (pass --overwrite to replace it, or choose another {flag})"
        )
    if overwrite if replacing is None else replacing:
        check_replaceable(out, kind, flag=flag, owned=owned)
