"""Self-describing checkpoint directories, written atomically.

Layout of a checkpoint directory::

    config.json          {"format": 1, "kind": "lm" | "finetuned", "model": ModelConfig fields, "meta": {...}}
    model.safetensors    the GPT weights (plus task-head tensors under ``head.``)
    tokenizer/           the tokenizer the weights were trained with
    (training state files, for resumable pretraining runs — see ``trainer``/``pretrain``)

Nothing here unpickles: weights are safetensors, everything else JSON, so opening an untrusted checkpoint never
runs code. A checkpoint is written under a temporary name in the same parent and renamed into place, so a crash
never leaves a directory that looks complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from gptcli.errors import GPT1Error
from gptcli.model import GPT, ModelConfig

FORMAT = 1
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer"
HEAD_PREFIX = "head."


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    path: Path
    model: GPT
    config: ModelConfig
    tokenizer: Any | None
    kind: str = "lm"
    meta: dict[str, Any] = field(default_factory=dict)
    head_state: dict[str, torch.Tensor] = field(default_factory=dict)


def atomic_directory(target: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` into a temporary sibling directory, then rename it to ``target``.

    An existing ``target`` is replaced only after the new one is complete.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        write(tmp)
        _fsync_dir(tmp)
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint_files(
    directory: Path,
    model: GPT,
    tokenizer: Any | None = None,
    *,
    kind: str = "lm",
    meta: dict[str, Any] | None = None,
    head_state: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write config, weights and tokenizer into an existing (temporary) directory."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    for k, v in (head_state or {}).items():
        tensors[HEAD_PREFIX + k] = v.detach().to("cpu").contiguous()
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": str(FORMAT)})
    config = {"format": FORMAT, "kind": kind, "model": dataclasses.asdict(model.config), "meta": meta or {}}
    (directory / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER)


def save_checkpoint(
    directory: str | Path,
    model: GPT,
    tokenizer: Any | None = None,
    *,
    kind: str = "lm",
    meta: dict[str, Any] | None = None,
    head_state: dict[str, torch.Tensor] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Atomically write a checkpoint directory; ``extra(tmpdir)`` may add more files (training state)."""

    def write(tmp: Path) -> None:
        write_checkpoint_files(tmp, model, tokenizer, kind=kind, meta=meta, head_state=head_state)
        if extra is not None:
            extra(tmp)

    return atomic_directory(Path(directory), write)


def is_checkpoint(path: Path) -> bool:
    return (path / CONFIG).is_file() and (path / WEIGHTS).is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory itself, or the newest complete checkpoint inside a run directory."""
    p = Path(path)
    if not p.exists():
        raise GPT1Error(f"{p}: checkpoint not found")
    if is_checkpoint(p):
        return p
    candidates = [c for c in (p / "checkpoints").glob("*") if c.is_dir() and not c.name.startswith(".") and is_checkpoint(c)]
    if not candidates:
        raise GPT1Error(f"{p}: neither a checkpoint ({CONFIG} + {WEIGHTS}) nor a run directory with checkpoints/")
    return max(candidates, key=lambda c: (json.loads((c / CONFIG).read_text()).get("meta", {}).get("step", -1), c.name))


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu", load_tokenizer: bool = True) -> Checkpoint:
    """Open a checkpoint (or the newest one in a run directory) as a model in eval mode on ``map_location``."""
    p = resolve_checkpoint(path)
    try:
        config = json.loads((p / CONFIG).read_text(encoding="utf-8"))
        mcfg = ModelConfig(**config["model"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise GPT1Error(f"{p / CONFIG}: unreadable checkpoint config ({e})") from None
    try:
        tensors = load_file(str(p / WEIGHTS), device=str(map_location))
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise GPT1Error(f"{p / WEIGHTS}: unreadable weights ({e})") from None
    head = {k[len(HEAD_PREFIX) :]: v for k, v in tensors.items() if k.startswith(HEAD_PREFIX)}
    body = {k: v for k, v in tensors.items() if not k.startswith(HEAD_PREFIX)}
    with torch.device("meta"):
        model = GPT(mcfg)
    try:
        model.load_state_dict(body, strict=True, assign=True)
    except RuntimeError as e:
        raise GPT1Error(f"{p / WEIGHTS}: weights do not match the config ({str(e).splitlines()[0]})") from None
    model.eval()
    tok = None
    if load_tokenizer and (p / TOKENIZER).is_dir():
        from gptcli.tokenizers import load_tokenizer as _load_tok

        tok = _load_tok(p / TOKENIZER)
    return Checkpoint(p, model, mcfg, tok, config.get("kind", "lm"), config.get("meta", {}), head)
