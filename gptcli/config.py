"""Typed configuration plumbing shared by every subcommand.

Each stage defines its own dataclass next to the code that uses it (``ModelConfig`` in ``model.py``,
``PrepareConfig`` in ``prepare.py``, ...). This module only moves those dataclasses to and from TOML/JSON and
applies overrides, with errors that name the offending key instead of a Python traceback.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from gptcli.errors import GPT1Error
from gptcli.fsutil import write_text_atomic

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
    if dataclasses.is_dataclass(tp):
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
        if not isinstance(value, str):
            raise GPT1Error(f"{key}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise GPT1Error(f"{key}: expected a path, got {value!r}")
        return Path(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build ``cls`` from a mapping, rejecting unknown keys and wrongly typed values."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise GPT1Error(
            f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(prefix + u for u in unknown)} "
            f"for {cls.__name__} (known: {', '.join(sorted(names))})"
        )
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    return cls(**kwargs)


def replace(cfg: T, **overrides: Any) -> T:
    """``dataclasses.replace`` that ignores ``None`` (an option the user did not give)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(cfg, **given) if given else cfg


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a ``.toml`` or ``.json`` config file into a dict, with a one-line error on failure."""
    p = Path(path)
    if not p.is_file():
        raise GPT1Error(f"{p}: config file not found")
    try:
        if p.suffix == ".json":
            return json.loads(p.read_text(encoding="utf-8"))
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GPT1Error(f"{p}: not a valid config file: {e}") from None


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
