"""The checkpoint format: self-describing checkpoint directories, written atomically, read and verified::

    config.json          {"format": 1, "kind": "lm" | "finetuned", "arch": "transformer" | "lstm",
                          "model": the arch's config fields, "meta": {...},
                          "files": {relative path: sha256} of every other file}
    model.safetensors    the model's weights (plus task-head tensors under ``head.``)
    tokenizer/           the tokenizer the weights were trained with
    (training state files of a step checkpoint: :mod:`gptcli.train.run.training_state`)

``config.json`` is written last, with the sha256 of every other file and one of its own content
(``config_sha256``); loading verifies them (``verify=False`` skips it), so a flipped byte is a one-line error naming
the file, never a silently different model. Checkpoints from before checksums (no ``files``) or before ``arch``
(Transformers) still load. Why no pickle: weights are safetensors and the rest JSON, so opening an untrusted
checkpoint never runs code; a checkpoint is renamed into place, so a crash never leaves one that looks complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gptcli.config import from_dict
from gptcli.errors import GPT1Error
from gptcli.files.fsutil import (
    fsync_dir,
    inside,
    move_into_place,
    read_bytes_inside,
    regular_file_problem,
    sha256_file,
    temp_sibling,
)
from gptcli.files.outputs import foreign_entries
from gptcli.model.build import TRANSFORMER, AnyConfig, LanguageModel, arch_of, build_model, config_class
from gptcli.system.out_of_memory import OutOfMemory, weights_fit

FORMAT = 1
CONFIG = "config.json"
CONFIG_DIGEST = "config_sha256"
# Every top-level key config.json has; another one can only be a damaged key (e.g. a flipped CONFIG_DIGEST).
CONFIG_KEYS = frozenset({"format", "kind", "arch", "model", "meta", "files", CONFIG_DIGEST})
WEIGHTS = "model.safetensors"
CONFIG_LIMIT = 64 << 20
"""The largest config.json read (a real one is a few kB)."""
TOKENIZER = "tokenizer"
HEAD_PREFIX = "head."


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    path: Path
    model: LanguageModel
    config: AnyConfig
    tokenizer: Any | None
    kind: str = "lm"
    meta: dict[str, Any] = field(default_factory=dict)
    head_state: dict[str, torch.Tensor] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """sha256 of every other file, as its config records them (empty for checkpoints written before checksums)."""

    def weights_sha256(self) -> str:
        """The weights file's sha256: the recorded one, else (a checkpoint written before checksums) computed."""
        return self.files.get(WEIGHTS) or sha256_file(self.path / WEIGHTS)


def atomic_directory(target: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` into a temporary sibling directory, then rename it to ``target``.

    An existing ``target`` is replaced only after the new one is complete.
    """
    target = Path(target)
    tmp = temp_sibling(target, "tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.mkdir()
        write(tmp)
        fsync_dir(tmp)
        move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def write_checkpoint_files(
    directory: Path,
    model: LanguageModel,
    tokenizer: Any | None = None,
    *,
    kind: str = "lm",
    meta: dict[str, Any] | None = None,
    head_state: dict[str, torch.Tensor] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> None:
    """Write weights, tokenizer and ``extra(directory)``'s files, then ``config.json`` with their checksums."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    for k, v in (head_state or {}).items():
        tensors[HEAD_PREFIX + k] = v.detach().to("cpu").contiguous()
    save_tensors(tensors, directory / WEIGHTS, metadata={"format": str(FORMAT)})
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER)
    if extra is not None:
        extra(directory)
    config = {
        "format": FORMAT,
        "kind": kind,
        "arch": arch_of(model.config),
        "model": dataclasses.asdict(model.config),
        "meta": meta or {},
        "files": _checksums(directory),
    }
    config[CONFIG_DIGEST] = _config_digest(config)
    (directory / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' ``save_file``, with a failed write raised as the OSError it is (safetensors reports a full
    disk as ``SafetensorError(... (os error 28))``, which the CLI would show as a traceback)."""
    try:
        save_file(tensors, str(path), metadata=metadata)
    except Exception as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        n = int(code.group(1))
        raise OSError(n, os.strerror(n), str(path)) from None


SAFETENSORS_HEADER_LIMIT = 100 << 20
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a safetensors file, from its header alone (nothing is allocated): a one-line
    error when the header is not one, or when the tensors it lists do not fill the file exactly."""
    problem = regular_file_problem(path)
    if problem is not None:
        raise GPT1Error(f"{path}: {problem} (restore the weights)")
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or not 0 < n <= min(SAFETENSORS_HEADER_LIMIT, size - 8):
                raise ValueError(f"a header of {n:,} bytes in a file of {size:,}")
            header = json.loads(f.read(n))
        shapes, end = {}, 0
        for name, t in header.items():
            if name == "__metadata__":
                continue
            shape = tuple(int(d) for d in t["shape"])
            begin, stop = (int(x) for x in t["data_offsets"])
            elems = 1
            for d in shape:
                elems *= d
            if min(shape, default=1) < 0 or stop - begin != elems * _DTYPE_BYTES[t["dtype"]]:
                raise ValueError(f"tensor {name}: shape {list(shape)} does not fit its bytes")
            shapes[name], end = shape, max(end, stop)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, OSError) as e:
        raise GPT1Error(f"{path}: unreadable weights ({e}) (restore the file)") from None
    if 8 + n + end != size:
        raise GPT1Error(
            f"{path}: unreadable weights (its header describes {8 + n + end:,} bytes, the file has "
            f"{size:,}: truncated or padded) (restore the file)"
        )
    return shapes


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (on the CPU), with a one-line error when it does not parse."""
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise GPT1Error(f"{path}: unreadable tensors ({e})") from None


def _config_digest(config: dict[str, Any]) -> str:
    """sha256 of config.json's content without its own digest (canonical JSON, so it survives reformatting)."""
    body = {k: v for k, v in config.items() if k != CONFIG_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _config_damage(p: Path) -> str | None:
    """Why config.json cannot be trusted (its digest does not match, or a key is not one it ever has), or None."""
    config = _read_config(p)  # parses: _read_header just read it
    digest = config.get(CONFIG_DIGEST)
    if set(config) - CONFIG_KEYS or (digest is not None and digest != _config_digest(config)):
        return f"{p / CONFIG}: checksum mismatch (the file is damaged)"
    return None


def _checksums(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` except config.json, by POSIX relative path."""
    return {
        p.relative_to(directory).as_posix(): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.relative_to(directory).as_posix() != CONFIG
    }


def save_checkpoint(
    directory: str | Path,
    model: LanguageModel,
    tokenizer: Any | None = None,
    *,
    kind: str = "lm",
    meta: dict[str, Any] | None = None,
    head_state: dict[str, torch.Tensor] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Atomically write a checkpoint directory; ``extra(tmpdir)`` may add more files (training state).

    An existing ``directory`` is replaced only when everything in it is what a checkpoint holds (an earlier or
    damaged checkpoint): a folder of the user's, a corpus or a run is refused, not swapped away."""
    target = Path(directory)
    if target.is_dir() and not target.is_symlink():
        foreign = foreign_entries(target, "checkpoint")
        if foreign:
            raise GPT1Error(
                f"{target}: holds {', '.join(foreign[:5])}, which no checkpoint holds; refusing to "
                "replace it with one (save the checkpoint to a new or empty directory)"
            )

    def write(tmp: Path) -> None:
        write_checkpoint_files(tmp, model, tokenizer, kind=kind, meta=meta, head_state=head_state, extra=extra)

    return atomic_directory(target, write)


def is_checkpoint(path: Path) -> bool:
    """A gpt1 checkpoint directory (a Hugging Face export has the same two file names but another config)."""
    return (path / CONFIG).is_file() and (path / WEIGHTS).is_file() and not _is_hf_export(path)


@dataclass
class Header:
    """What ``config.json`` says about a checkpoint, without loading its weights."""

    path: Path
    kind: str
    """"lm" (pretrained or converted) or "finetuned" (a task model: meta["task"] names the task)."""
    model: dict[str, Any]
    """The config fields of the architecture ``arch`` (ModelConfig's for a Transformer)."""
    meta: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    """sha256 of every other file of the checkpoint (empty for checkpoints written before checksums)."""
    arch: str = TRANSFORMER
    """"transformer" (GPT-1; also every checkpoint written before the field existed) or "lstm"."""

    @property
    def step(self) -> int:
        return int(self.meta.get("step", -1))


def read_header(path: str | Path) -> Header:
    """The header of a checkpoint (or of the newest one in a run directory), with a one-line error if unreadable."""
    p = resolve_checkpoint(path)
    return _read_header(p)


def _read_config(p: Path) -> Any:
    """config.json parsed: a regular file of bounded size (never a FIFO or /dev/zero behind a link)."""
    return json.loads(read_bytes_inside(p, CONFIG, CONFIG_LIMIT, "checkpoint config"))


def _read_header(p: Path) -> Header:
    try:
        config = _read_config(p)
        header = Header(
            p,
            config.get("kind", "lm"),
            dict(config["model"]),
            dict(config.get("meta", {})),
            dict(config.get("files", {})),
            config.get("arch", TRANSFORMER),
        )
        for name, value in (("kind", header.kind), ("arch", header.arch)):
            if not isinstance(value, str):
                raise TypeError(f"{name} is {value!r}, not a string")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in header.files.items()):
            raise TypeError("the files table maps something other than paths to checksums")
        return header
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise GPT1Error(
            f"{p / CONFIG}: unreadable checkpoint config ({e}) (restore the file or use another checkpoint)"
        ) from None


def list_checkpoints(path: str | Path) -> list[Path]:
    """Every complete checkpoint of a run directory, oldest step first (a checkpoint directory: just itself)."""
    p = Path(path)
    if not p.exists():
        raise GPT1Error(
            f"{p}: checkpoint not found (check the path: give a checkpoint directory, or a run directory "
            "with checkpoints/)"
        )
    if is_checkpoint(p):
        return [p]
    candidates = [
        c for c in (p / "checkpoints").glob("*") if c.is_dir() and not c.name.startswith(".") and is_checkpoint(c)
    ]
    if not candidates:
        if _is_hf_export(p):
            raise GPT1Error(
                f"{p}: this is a Hugging Face export, not a gpt1 checkpoint "
                f"(convert it first: gpt1 convert {p} --from hf --out DIR)"
            )
        raise GPT1Error(
            f"{p}: neither a checkpoint ({CONFIG} + {WEIGHTS}) nor a run directory with checkpoints/ "
            "(give a checkpoint directory, or the directory of a run that has saved one)"
        )
    return sorted(candidates, key=_age)


def _is_hf_export(p: Path) -> bool:
    """A Hugging Face model directory (its config.json has a model_type and no gpt1 "format")."""
    try:
        config = _read_config(p)
    except (GPT1Error, OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and "model_type" in config and "format" not in config


def _age(c: Path) -> tuple[int, str]:
    """Sort key: the step in the header, or in the directory name when the header is damaged (so a damaged
    checkpoint still sorts where it belongs and ``newest_intact`` can skip it by name)."""
    try:
        return _read_header(c).step, c.name
    except GPT1Error:
        digits = c.name.rsplit("-", 1)[-1]
        return (int(digits) if digits.isdigit() else -1), c.name


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory itself, or the newest complete checkpoint inside a run directory."""
    return list_checkpoints(path)[-1]


def tokenizer_home(path: str | Path) -> Path | None:
    """The tokenizer directory a ``--tokenizer PATH`` names: PATH itself (it holds ``tokenizer.json``), the
    ``tokenizer/`` of a prepared corpus or of a checkpoint, or that of a run directory's newest checkpoint; None
    when PATH holds none of these. The one reading of the option for every command that takes it."""
    p = Path(path)
    for d in (p, p / TOKENIZER):
        if (d / "tokenizer.json").is_file():
            return d
    if (p / "checkpoints").is_dir():
        d = resolve_checkpoint(p) / TOKENIZER
        if (d / "tokenizer.json").is_file():
            return d
    return None


def verify_checkpoint(path: str | Path) -> list[str]:
    """What is wrong with a checkpoint's files: unreadable config, missing files, checksum mismatches (empty: intact,
    or written before checksums existed)."""
    p = Path(path)
    try:
        header = _read_header(p)
    except GPT1Error as e:
        return [str(e)]
    damaged = _config_damage(p)
    if damaged:
        return [damaged]  # the checksums it records cannot be trusted either
    # Every path first: the table may only name files inside the checkpoint (never ../../etc/…, /a/64GB/file, a
    # link out of it, a FIFO or a device), and nothing is hashed until all of them are known to be such files.
    outside = [rel for rel in header.files if inside(p, rel) is None]
    if outside:
        return [
            f"{p / CONFIG}: its checksum table names {outside[0]!r}, which is not a file inside the checkpoint "
            f"(the config is damaged or was tampered with)"
        ]
    problems = []
    for rel, expected in header.files.items():
        f = p / rel
        why = regular_file_problem(f)
        if why is not None:
            problems.append(f"{f}: {why}")
        elif sha256_file(f) != expected:
            problems.append(f"{f}: checksum mismatch (the file is damaged)")
    return problems


def newest_intact(path: str | Path, candidates: Sequence[Path] | None = None) -> tuple[Path, list[tuple[Path, str]]]:
    """The newest checkpoint of a run whose files verify, and the newer ones skipped with the reason for each.
    ``candidates`` (oldest first) narrows the search, e.g. to the step checkpoints that hold training state."""
    skipped: list[tuple[Path, str]] = []
    for c in reversed(list(candidates) if candidates is not None else list_checkpoints(path)):
        problems = verify_checkpoint(c)
        if not problems:
            return c, skipped
        skipped.append((c, problems[0]))
    detail = "; ".join(f"{c.name}: {why}" for c, why in skipped)
    raise GPT1Error(f"{path}: no intact checkpoint ({detail})")


def check_intact(p: Path) -> None:
    """Refuse a damaged checkpoint with one line naming its first problem (:func:`verify_checkpoint`)."""
    problems = verify_checkpoint(p)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise GPT1Error(f"{problems[0]}{more} (use another checkpoint, or pass --no-verify to load it anyway)")


def load_checkpoint(
    path: str | Path, *, map_location: str | torch.device = "cpu", load_tokenizer: bool = True, verify: bool = True
) -> Checkpoint:
    """Open a checkpoint (or the newest one in a run directory) as the reference model in eval mode on
    ``map_location`` (whoever computes with it applies the fast paths: :func:`gptcli.model.kernels.apply`);
    ``verify`` checks every file against the checksums in its config first. A checkpoint that a running job prunes
    while it is read is said to be gone, not "unreadable"."""
    p = resolve_checkpoint(path)
    try:
        return _load_checkpoint(p, map_location, load_tokenizer, verify)
    except (GPT1Error, OSError):
        if (p / CONFIG).is_file():
            raise
        raise GPT1Error(
            f"{p}: the checkpoint was removed while it was read (a running job replaced it with a newer one: try "
            "again, or keep more checkpoints in that run with --keep-last)"
        ) from None


def _load_checkpoint(p: Path, map_location: str | torch.device, load_tokenizer: bool, verify: bool) -> Checkpoint:
    header = _read_header(p)
    if verify:
        check_intact(p)
    mcfg = model_config(p, header)
    shapes = safetensors_shapes(p / WEIGHTS)  # the weights file's header, read once: nothing is allocated yet
    check_weights_fit(p / WEIGHTS, shapes, mcfg)
    params = sum(math.prod(shape) for shape in shapes.values())  # every tensor, the task head's too
    try:
        with weights_fit(map_location, lambda: params):
            tensors = load_file(str(p / WEIGHTS), device=str(map_location))
    except OutOfMemory:
        raise
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise GPT1Error(f"{p / WEIGHTS}: unreadable weights ({e})") from None
    head = {k[len(HEAD_PREFIX) :]: v for k, v in tensors.items() if k.startswith(HEAD_PREFIX)}
    body = {k: v for k, v in tensors.items() if not k.startswith(HEAD_PREFIX)}
    with torch.device("meta"):
        model = build_model(mcfg)
    try:
        model.load_state_dict(body, strict=True, assign=True)
    except RuntimeError as e:
        raise GPT1Error(f"{p / WEIGHTS}: weights do not match the config ({str(e).splitlines()[0]})") from None
    model.eval()
    _check_finite(p / WEIGHTS, tensors)
    tok = None
    if load_tokenizer and (p / TOKENIZER).is_dir():
        from gptcli.tokenizers import load_tokenizer as _load_tok

        tok = _load_tok(p / TOKENIZER)
    return Checkpoint(p, model, mcfg, tok, header.kind, header.meta, head, header.files)


def model_config(p: Path, header: Header) -> AnyConfig:
    """The architecture's config from ``header.model``, every field type-checked (a dim that is a string or a float
    is refused, not turned into a TypeError deep inside the model) and every size positive."""
    try:
        mcfg: AnyConfig = from_dict(config_class(header.arch), header.model, prefix="model.")
    except GPT1Error as e:
        raise GPT1Error(
            f"{p / CONFIG}: unreadable checkpoint config ({e}) (restore the file or use another checkpoint)"
        ) from None
    except (TypeError, ValueError, KeyError) as e:
        raise GPT1Error(f"{p / CONFIG}: unreadable checkpoint config ({e})") from None
    bad = [
        f"{f.name} = {getattr(mcfg, f.name)!r}"
        for f in dataclasses.fields(mcfg)
        if _out_of_range(f.name, getattr(mcfg, f.name))
    ]
    if bad:
        raise GPT1Error(f"{p / CONFIG}: impossible model settings: {', '.join(bad)} (the checkpoint config is damaged)")
    return mcfg


def _out_of_range(name: str, v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if isinstance(v, float):
        return not math.isfinite(v) or v < 0
    return v < (0 if name == "n_special" else 1)


def _check_finite(weights: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse weights holding NaN or ±inf: every score or perplexity computed from them would be a number without a
    meaning (a zero-shot accuracy, a ``nan`` perplexity), reported as if it were one."""
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise GPT1Error(
            f"{weights}: {len(bad)} tensor(s) hold NaN or infinite values (first: {bad[0]}); nothing "
            "computed from them would mean anything (the run diverged: use an earlier checkpoint)"
        )


def check_weights_fit(weights: Path, shapes: dict[str, tuple[int, ...]], mcfg: AnyConfig) -> None:
    """Refuse a config that does not describe the weights file (``shapes``: every tensor's, from the file's header),
    building the model on the meta device with one and two layers: a config claiming 100,000 layers (or 10^9 rows)
    costs nothing, where building it first would take minutes and gigabytes before "weights do not match"."""
    shapes = {k: v for k, v in shapes.items() if not k.startswith(HEAD_PREFIX)}
    per = []
    for n in (1, 2):
        with torch.device("meta"):
            sd = build_model(dataclasses.replace(mcfg, n_layer=n)).state_dict()
        per.append((len(sd), sum(t.numel() for t in sd.values())))
    layers = getattr(mcfg, "n_layer", 1)
    keys = per[0][0] + (layers - 1) * (per[1][0] - per[0][0])
    elems = per[0][1] + (layers - 1) * (per[1][1] - per[0][1])
    have = sum(math.prod(s) for s in shapes.values())
    if (keys, elems) != (len(shapes), have):
        raise GPT1Error(
            f"{weights}: weights do not match the config (it describes {keys:,} tensors of {elems:,} "
            f"values, the file holds {len(shapes):,} of {have:,}) (the checkpoint is damaged or "
            f"mixed from two; use another)"
        )
