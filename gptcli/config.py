"""Typed configuration plumbing shared by every subcommand.

Each stage defines its own dataclass next to the code that uses it (``ModelConfig`` in ``model.py``,
``PrepareConfig`` in ``prepare.py``, ...). This module only moves those dataclasses to and from TOML/JSON and
applies overrides, with errors that name the offending key instead of a Python traceback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import write_text_atomic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

T = TypeVar("T")


def to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass as plain JSON/TOML-able values (Paths become strings, tuples lists)."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        return v

    return conv(cfg)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Coerce a TOML/JSON value to the annotated field type, or raise a GPT1Error naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except GPT1Error as e:
                errors.append(str(e))
        raise GPT1Error(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise GPT1Error(f"{key}: expected one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise GPT1Error(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        out = [_coerce(v, inner, key) for v in value]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise GPT1Error(f"{key}: expected a table, got {value!r}")
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise GPT1Error(f"{key}: expected a table, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if tp is bool:
        if not isinstance(value, bool):
            raise GPT1Error(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise GPT1Error(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GPT1Error(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, Path):  # a path setting typed str (e.g. ``init``, which also takes Hub ids)
            return str(value)
        if not isinstance(value, str):
            raise GPT1Error(f"{key}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise GPT1Error(f"{key}: expected a path, got {value!r}")
        return Path(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", *, context: Mapping[str, Any] | None = None) -> T:
    """Build ``cls`` from a mapping, rejecting unknown keys and wrongly typed values (``context``: see
    :func:`coerce_fields`)."""
    return cls(**coerce_fields(cls, data, prefix, context=context))


def coerce_fields(
    cls: type, data: dict[str, Any], prefix: str = "", *, context: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``data`` as keyword arguments of dataclass ``cls``, typed and checked as :func:`from_dict` does (unknown keys,
    wrong types, impossible numbers refused naming ``prefix + key``), without building ``cls``: a partial set of
    fields, such as the ``[model]`` overrides of a preset, gets the same checks as a whole config. ``context``:
    settings that will override ``data`` (the options typed over a config file), which decide, with it, what is
    unused (:func:`inactive_settings`: a file's ``temperature = 0`` under a typed ``--greedy``)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise GPT1Error(
            f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(prefix + u for u in unknown)} "
            f"for {cls.__name__} (known: {', '.join(sorted(names))})"
        )
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    unused = inactive_settings(cls, {**kwargs, **(context or {})})
    for k, v in kwargs.items():
        if k in unused:
            continue
        if isinstance(v, dict):
            check_settings(v, f"{prefix}{k}.")
        else:
            check_setting(prefix + k, v)
    check_together(kwargs)
    return kwargs


def inactive_settings(cls: type, settings: dict[str, Any]) -> frozenset[str]:
    """The settings of ``cls`` that the others make unused (greedy decoding reads no temperature): their values are
    typed but not held to their :data:`RULES`, as the help says they are ignored. A config class declares them with
    a static method ``inactive_settings(settings) -> names``; ``settings`` may hold only some of its fields."""
    hook = getattr(cls, "inactive_settings", None)
    return frozenset(hook(settings)) if hook is not None else frozenset()


CONFIG_FILE_LIMIT = 16 << 20  # far above any real config; /dev/zero or a runaway pipe is refused, not read forever


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice (the TOML reader refuses the same file)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise GPT1Error(f"setting {k!r} is given twice (keep one)")
        out[k] = v
    return out


def _read_config_text(p: Path) -> str:
    """The text of config file ``p``: a regular file, or a pipe such as ``/dev/stdin`` (read once, bounded)."""
    try:
        with open(p, "rb") as f:
            data = f.read(CONFIG_FILE_LIMIT + 1)
    except OSError as e:
        raise GPT1Error(f"{p}: cannot read the config file ({e.strerror or e})") from None
    if len(data) > CONFIG_FILE_LIMIT:
        raise GPT1Error(f"{p}: more than {CONFIG_FILE_LIMIT:,} bytes, not a config file (give a .toml or .json file)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GPT1Error(f"{p}: not a valid config file: {e}") from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a ``.toml`` or ``.json`` config file into a dict, with a one-line error on failure. A file without
    either suffix (``/dev/stdin``) is JSON when it starts with ``{``, TOML otherwise."""
    p = Path(path)
    if p.is_dir():
        raise GPT1Error(f"{p}: a directory, not a config file (give a .toml or .json file, e.g. RUN/config.toml)")
    if not p.exists():
        raise GPT1Error(f"{p}: config file not found (check the path)")
    text = _read_config_text(p)
    is_json = p.suffix == ".json" or (p.suffix != ".toml" and text.lstrip().startswith("{"))
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicates) if is_json else tomllib.loads(text)
    except GPT1Error as e:
        raise GPT1Error(f"{p}: not a valid config file: {e}") from None
    except RecursionError:
        raise GPT1Error(f"{p}: not a valid config file: nested too deeply") from None
    except ValueError as e:  # decode errors, and integers longer than Python converts (thousands of digits)
        why = "a number thousands of digits long (no setting takes one)" if "digits" in str(e) else str(e)
        raise GPT1Error(f"{p}: not a valid config file: {why}") from None
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string", bool: "true or false"}.get(type(data), "a number")
        raise GPT1Error(
            f"{p}: not a valid config file: it holds {kind}, not a table of settings "
            '(write {"setting": value, ...} in JSON or setting = value lines in TOML)'
        )
    return data


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are valid TOML basic strings
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps_toml(data: dict[str, Any]) -> str:
    """Serialize a dict of scalars, lists and nested tables as TOML (``None`` values are omitted)."""
    lines: list[str] = []
    tables: list[tuple[str, dict]] = []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")

    def emit(name: str, table: dict) -> None:
        lines.append("")
        lines.append(f"[{name}]")
        sub = []
        for k, v in table.items():
            if v is None:
                continue
            if isinstance(v, dict):
                sub.append((f"{name}.{k}", v))
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        for n, t in sub:
            emit(n, t)

    for name, table in tables:
        emit(name, table)
    return "\n".join(lines).lstrip("\n") + "\n"


def save_config(cfg: Any, path: str | Path) -> None:
    """Write a (resolved) dataclass config as TOML so a run can be repeated with ``--config``."""
    write_text_atomic(Path(path), dumps_toml(to_dict(cfg)))  # a run's config.toml is never seen half-written


# --- one rule per setting ------------------------------------------------------------------------------------------
# A setting has the same rule wherever it appears (pretraining's --lr and fine-tuning's, the quickstart's seed and
# prepare's): one table, by field name, checked for every config gpt1 builds (:func:`from_dict`, so the command line
# and --config files alike, before any work) and by the library entry points (:func:`check_settings`). NaN and the
# infinities are refused for every number.


def _between(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Any:
    return lambda v: (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)


_AT_LEAST_1 = (lambda v: v >= 1, "at least 1")
_AT_LEAST_0 = (lambda v: v >= 0, "0 or more")
_POSITIVE = (lambda v: v > 0, "a positive number")
_PROBABILITY = (_between(0, 1, hi_open=True), "a probability in [0, 1)")
_UNSET_ALL = (lambda v: v >= 1, "at least 1 (leave it unset for all)")
SEED_LIMIT = 2**32
RULES: dict[str, tuple[Any, str]] = {
    **dict.fromkeys(
        "batch_size eval_batch_size finetune_batch_size seq_len n_ctx n_embd n_head n_inner n_layer "
        "n_hidden n_labels vocab_size chunk_bytes shard_tokens sample_lines finetune_epochs nodes "
        "zeroshot_fit_examples pretrain_steps max_modules log_every".split(),
        _AT_LEAST_1,
    ),
    **dict.fromkeys(
        "n_special warmup_steps eval_every save_every keep_last workers top_k node_rank extract_id "
        "transfer_layers max_new_tokens weight_decay lm_weight init_std".split(),
        _AT_LEAST_0,
    ),
    **dict.fromkeys("lr finetune_lr epochs eps minutes max_minutes max_epochs layer_norm_eps".split(), _POSITIVE),
    **dict.fromkeys("embd_pdrop attn_pdrop resid_pdrop out_pdrop clf_pdrop pdrop dropout".split(), _PROBABILITY),
    **dict.fromkeys("max_examples max_train_examples max_eval_examples max_batches limit".split(), _UNSET_ALL),
    "micro_batch_size": (lambda v: v >= 1, "at least 1 (leave it unset for the whole batch at once)"),
    "max_steps": (lambda v: v >= 1, "at least 1 (leave it unset for no cap)"),
    "max_tokens": (lambda v: v >= 1, "at least 1 (leave it unset for no cap)"),
    "eval_batches": (lambda v: v >= 1, "at least 1 (unset: all)"),
    "peak_flops": (lambda v: v > 0, "a positive number (unset: measured)"),
    "grad_clip": (lambda v: v >= 0, "0 (off) or more"),
    "beta1": (_between(0, 1, hi_open=True), "in [0, 1)"),
    "beta2": (_between(0, 1, hi_open=True), "in [0, 1)"),
    "warmup": (_between(0, 1, hi_open=True), "a fraction of the updates in [0, 1)"),
    "seed": (_between(0, SEED_LIMIT, hi_open=True), f"an integer from 0 to {SEED_LIMIT - 1}"),
    "samples": (_between(1, 1024), "from 1 to 1024 (generated as one batch, or several when one would not fit)"),
    "temperature": (_POSITIVE[0], "a positive number (use --greedy for argmax decoding)"),
    "top_p": (_between(0, 1, lo_open=True), "in (0, 1]"),
    "task_fraction": (_between(0, 1, lo_open=True, hi_open=True), "in (0, 1)"),
    "val_fraction": (_between(0, 0.5, lo_open=True), "in (0, 0.5]"),
    "character_coverage": (_between(0, 1, lo_open=True), "in (0, 1]"),
    "master_port": (_between(1, 65535), "a port from 1 to 65535"),
}


def check_types(cfg: Any, prefix: str = "") -> None:
    """Hold a config dataclass built in Python to its annotations, as :func:`from_dict` holds a file: a misspelt
    choice (``schedule="Linear"``), a number given as text (``lr="5e-4"``) or a string where a list belongs is a
    one-line GPT1Error naming the setting, not another run or a traceback from deep inside. Values of an equivalent
    type are normalised in place (a ``Path`` given for a ``str`` setting, an ``int`` for a ``float``)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, tp = getattr(cfg, f.name), hints.get(f.name, Any)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            continue  # a nested config: check_settings goes through it
        checked = _coerce(value, tp, prefix + f.name)
        if type(checked) is not type(value) and not isinstance(value, (list, tuple, dict)):
            object.__setattr__(cfg, f.name, checked)


def check_setting(key: str, value: Any) -> None:
    """Refuse ``value`` for setting ``key`` (``model.n_ctx`` is ``n_ctx``) with the one line every command gives:
    ``--KEY VALUE is impossible (it must be …)``. None (unset), strings, paths and booleans are not numbers."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, (list, tuple)):
            for v in value:
                check_setting(key, v)
        return
    name = key.rsplit(".", 1)[-1]
    ok, want = RULES.get(name, (lambda v: True, "a finite number"))
    finite = not isinstance(value, float) or math.isfinite(value)
    if not finite or not ok(value):
        raise GPT1Error(f"--{name.replace('_', '-')} {value} is impossible (it must be {want})")


def check_together(settings: Mapping[str, Any]) -> None:
    """The rules between settings. Decoupled weight decay multiplies every weight by ``1 - lr × weight_decay`` per
    update: from 1 on, each update zeroes or flips the sign of every decayed weight, and training ends "done" on
    garbage."""
    lr, wd = settings.get("lr"), settings.get("weight_decay")
    if (
        isinstance(lr, bool)
        or isinstance(wd, bool)
        or not isinstance(lr, (int, float))
        or not isinstance(wd, (int, float))
    ):
        return
    if math.isfinite(lr * wd) and lr * wd >= 1:
        raise GPT1Error(
            f"--weight-decay {wd} with --lr {lr} is impossible (their product must be below 1: each update would "
            "zero or flip the sign of every weight; the paper uses 0.01)"
        )


def check_settings(cfg: Any, prefix: str = "") -> None:
    """:func:`check_setting` on every field of a config dataclass (or mapping), nested ones included. A dataclass
    built in Python is first held to its field types as a config file is (:func:`check_types`)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        check_types(cfg, prefix)
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        unused = inactive_settings(type(cfg), fields)
        items = [(k, v) for k, v in fields.items() if k not in unused]
    elif isinstance(cfg, dict):
        items = list(cfg.items())
    else:
        return
    for k, v in items:
        if dataclasses.is_dataclass(v) or isinstance(v, dict):
            check_settings(v, f"{prefix}{k}.")
        else:
            check_setting(f"{prefix}{k}", v)
    check_together(dict(items))
