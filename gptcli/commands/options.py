"""Command-line options derived from the config dataclasses, so that every setting is written once.

A setting lives in one place: a field of a config dataclass (``PretrainConfig.lr``) with its type, its default and
the attribute docstring under it. :class:`Options` turns those fields into Typer options (``--lr``: its type, its
default and its help text, in a ``--help`` panel). The command function receives a :class:`Parsed` and builds its
config with :meth:`Parsed.resolve`, which applies the precedence every command shares:

    dataclass default  <  --config FILE (or a resumed run's config.toml)  <  options given on the command line

"Given" means typed by the user (Click's parameter source), not "different from the default". A few options belong
to the command line alone (``--quiet``, launcher settings): :class:`CliOnly`, each with its reason. Like litgpt's
and tyro's CLIs, the derivation gives the command function an ``inspect.Signature`` that Typer reads; this module
is the only place that builds options.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gptcli.config import from_dict, read_config_file, to_dict
from gptcli.errors import GPT1Error

# Fields that, in whichever config has them, take their default from an environment variable (--help names it).
# It sits under --config and a resumed run's config.toml, not beside the command line: the workers of a --procs
# launch read the launcher's resolved settings from a file, and a variable they inherit must not override it.
# GPT1_KERNELS is gptcli.model.kernels.ENV (tests/commands/test_kernels_option.py).
FIELD_ENVVARS: dict[str, str] = {"kernels": "GPT1_KERNELS"}

# --help panels, in the order they are shown; a command uses those it needs.
PANELS = (
    "Input",
    "Model",
    "Sampling",
    "Data",
    "Optimisation",
    "Schedule",
    "Evaluation",
    "Checkpointing",
    "Distributed",
    "Runtime",
    "Output",
)


_NONE: Mapping[Any, Any] = types.MappingProxyType({})  # an immutable empty default for the mapping arguments


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # pragma: no cover - classes without source (built at run time)
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@dataclass(frozen=True)
class CliOnly:
    """An option that is not a config field. ``why`` is required: it says why the setting is not in the config
    (a display choice, an action instead of a setting, a launcher detail) and is shown nowhere but here."""

    name: str
    annotation: Any
    default: Any
    flags: tuple[str, ...]
    help: str
    why: str
    panel: str = "Output"
    argument: bool = False


@dataclass(frozen=True)
class Nested:
    """Options for some fields of another dataclass, stored as a dict field of the config: ``--n-layer`` for
    ``PretrainConfig.model["n_layer"]`` (help text from ``ModelConfig``). ``cls`` may be several dataclasses (the
    configs of several model architectures): each field's type and help come from the first that has it."""

    cls: type | tuple[type, ...]
    fields: tuple[str, ...]
    panel: str = "Model"
    default_note: str = "from the preset"


@dataclass
class Parsed:
    """What the user typed, split into config settings and command-line-only values."""

    given: dict[str, Any]
    """Config fields given on the command line (a Nested field as ``{"model": {"n_layer": 2}}``)."""
    cli: dict[str, Any]
    """Values of the :class:`CliOnly` options (defaults included)."""
    config_file: Path | None = None
    """``--config FILE``, when given."""
    sections: dict[str, Any] = field(default_factory=dict)
    """Instances of the section dataclasses (settings of how to run, not of the run: see ``Options``)."""
    environment: dict[str, Any] = field(default_factory=dict)
    """Config fields set by their :data:`FIELD_ENVVARS` variable: defaults, under ``base`` (see ``resolve``)."""
    base_source: Path | None = None
    """The file :meth:`base` read the settings under the command line from (named in errors about them)."""

    def base(self, fallback: Path | None = None) -> dict[str, Any]:
        """The settings under the command line: ``--config FILE``, else ``fallback`` (a resumed run's config) if it
        exists, else nothing."""
        if self.config_file is not None:
            self.base_source = Path(self.config_file)
            return read_config_file(self.config_file)
        if fallback is not None and fallback.is_file():
            self.base_source = Path(fallback)
            return read_config_file(fallback)
        return {}

    def resolve(self, cls: type, base: Mapping[str, Any] | None = None) -> Any:
        """``cls`` from defaults < the environment's (:data:`FIELD_ENVVARS`) < ``base`` < the options given; unknown
        or mistyped keys are one-line errors."""
        try:
            merged = to_dict(from_dict(cls, {**self.environment, **(base or {})}, context=self.given))
        except GPT1Error as e:  # say where the setting came from: a --config file, or the resumed run's config.toml
            if self.base_source is None:
                raise
            raise GPT1Error(f"{self.base_source}: {e}") from None
        for key, value in self.given.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return from_dict(cls, {k: v for k, v in merged.items() if v is not None})

    def has(self, name: str, base: Mapping[str, Any] | None = None) -> bool:
        """Whether a setting was given at all (command line or ``base``), for settings a command requires."""
        return name in self.given or name in (base or {})


def _option_type(tp: Any) -> tuple[Any, bool]:
    """The annotation Typer should see for a field type, and whether the field can be an option at all."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            t, ok = _option_type(inner[0])
            return t | None, ok
        return str, False
    if origin in (list, tuple):
        return types.GenericAlias(list, (args[0] if args else str,)) | None, True
    if origin is dict or dataclasses.is_dataclass(tp) or tp is Any:
        return tp, False
    return tp, True


def _field_default(f: dataclasses.Field[Any]) -> Any:
    """A field's default: its value, or its factory's product (every field shown as an option has one of the two)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return typing.cast(Callable[[], Any], f.default_factory)()


def _default_text(value: Any) -> str | bool:
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return False
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return True


class Options:
    """The options of one config dataclass, for one command.

    ``panels`` maps a panel title to the fields shown in it (fields in no panel go to "Options"); ``flags`` gives
    a field other or extra spellings (the first is the main one; old spellings stay working this way);
    ``arguments`` are positional; ``hidden`` fields stay config-file-only (say why in a comment where used).
    ``sections`` adds the fields of other dataclasses under a panel (``{"launch": (LaunchConfig, "Distributed")}``):
    settings of how a run is executed rather than of the run, so they are neither read from ``--config`` nor saved
    with the run; ``Parsed.sections["launch"]`` holds the instance.
    """

    def __init__(
        self,
        cls: type,
        *,
        panels: Mapping[str, Sequence[str]] = _NONE,
        flags: Mapping[str, Sequence[str]] = _NONE,
        arguments: Sequence[str] = (),
        hidden: Sequence[str] = (),
        nested: Mapping[str, Nested] = _NONE,
        cli_only: Sequence[CliOnly] = (),
        sections: Mapping[str, tuple[type, str]] = _NONE,
        config_option: bool = True,
    ) -> None:
        self.cls = cls
        self.panel_of = {name: title for title, names in dict(panels).items() for name in names}
        self.flags = dict(flags)
        self.arguments = tuple(arguments)
        self.hidden = set(hidden)
        self.nested = dict(nested)
        self.cli_only = tuple(cli_only)
        self.sections = dict(sections)
        self.config_option = config_option
        self._dest: dict[str, tuple[str, str | None]] = {}  # parameter name -> (field, nested key)
        self.parameters = self._build()

    # -- building the signature
    def _build(self) -> list[inspect.Parameter]:
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
        hints = typing.get_type_hints(self.cls)
        docs = field_docs(self.cls)
        for f in dataclasses.fields(self.cls):
            if not f.init or f.name in self.hidden:
                continue
            if f.name in self.nested:
                params += self._nested_params(f.name, self.nested[f.name])
                continue
            tp, ok = _option_type(hints[f.name])
            if not ok:
                continue  # dicts and tables: config files only
            default = _field_default(f)
            params.append(self._param(f.name, tp, default, docs.get(f.name, ""), self.panel_of.get(f.name)))
            self._dest[f.name] = (f.name, None)
        for section, (scls, panel) in self.sections.items():
            shints, sdocs = typing.get_type_hints(scls), field_docs(scls)
            for f in dataclasses.fields(scls):
                tp, _ = _option_type(shints[f.name])
                params.append(
                    self._raw(f.name, tp, f.default, self._spellings(f.name, tp is bool), sdocs.get(f.name, ""), panel)
                )
                self._dest[f.name] = ("@" + section, f.name)
        if self.config_option:
            params.append(
                self._raw(
                    "config",
                    Path | None,
                    None,
                    ("--config",),
                    f"TOML/JSON file of {self.cls.__name__} settings; options given here override it.",
                    "Input",
                )
            )
        for extra in self.cli_only:
            params.append(
                self._raw(
                    extra.name,
                    extra.annotation,
                    extra.default,
                    extra.flags,
                    extra.help,
                    extra.panel,
                    argument=extra.argument,
                )
            )
        return [params[0], *sorted(params[1:], key=_panel_rank)]  # --help shows panels in PANELS order

    def _nested_params(self, name: str, spec: Nested) -> list[inspect.Parameter]:
        classes = spec.cls if isinstance(spec.cls, tuple) else (spec.cls,)
        out = []
        for sub in spec.fields:
            cls = next(c for c in classes if sub in {f.name for f in dataclasses.fields(c)})
            tp, _ = _option_type(typing.get_type_hints(cls)[sub])
            help_ = f"{field_docs(cls).get(sub, '')} [default: {spec.default_note}]"
            out.append(
                self._raw(
                    sub,
                    tp if typing.get_origin(tp) in (typing.Union, types.UnionType) else tp | None,
                    None,
                    self._spellings(sub),
                    help_,
                    spec.panel,
                )
            )
            self._dest[sub] = (name, sub)
        return out

    def _spellings(self, name: str, is_bool: bool = False) -> tuple[str, ...]:
        dash = name.replace("_", "-")
        main = f"--{dash}/--no-{dash}" if is_bool else f"--{dash}"
        return tuple(self.flags.get(name, (main,)))

    def _param(self, name: str, tp: Any, default: Any, doc: str, panel: str | None) -> inspect.Parameter:
        is_bool = tp is bool or tp == bool | None
        if name in self.arguments:
            return self._raw(name, tp, default, (), doc, None, argument=True)
        return self._raw(
            name,
            tp,
            list(default) if isinstance(default, tuple) else default,
            self._spellings(name, is_bool),
            doc,
            panel,
            envvar=FIELD_ENVVARS.get(name),
        )

    @staticmethod
    def _raw(
        name: str,
        tp: Any,
        default: Any,
        flags: Sequence[str],
        help_: str,
        panel: str | None,
        argument: bool = False,
        envvar: str | None = None,
    ) -> inspect.Parameter:
        is_bool = tp is bool or tp == bool | None
        kw: dict[str, Any] = {"help": escape(help_.replace("``", "`")), "show_default": _default_text(default)}
        if envvar is not None:
            kw["envvar"] = envvar
        if argument:
            info = typer.Argument(default, **kw)
        else:
            if is_bool:
                kw["metavar"] = ""
            info = typer.Option(default, *flags, rich_help_panel=panel, **kw)
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=tp, default=info)

    # -- the command
    def command(self, body: Callable[[Parsed], None], doc: str | None = None) -> Callable[..., None]:
        """A Typer command function with the generated signature that calls ``body(Parsed)``."""
        cli_names = {c.name for c in self.cli_only}

        def run(ctx: typer.Context, **values: Any) -> None:
            given: dict[str, Any] = {}
            environment: dict[str, Any] = {}
            sections: dict[str, dict[str, Any]] = {name: {} for name in self.sections}
            for pname, value in values.items():
                if pname in cli_names or pname == "config" or pname not in self._dest:
                    continue
                if self._dest[pname][0].startswith("@"):
                    sections[self._dest[pname][0][1:]][pname] = value
                    continue
                if _source(ctx, pname) == "ENVIRONMENT" and pname in FIELD_ENVVARS:
                    environment[pname] = value
                    continue
                if not _typed(ctx, pname):
                    continue
                fname, sub = self._dest[pname]
                if sub is None:
                    given[fname] = value
                else:
                    given.setdefault(fname, {})[sub] = value
            cli = {name: values[name] for name in cli_names}
            built = {name: self.sections[name][0](**vals) for name, vals in sections.items()}
            body(Parsed(given, cli, values.get("config"), built, environment))

        run.__signature__ = inspect.Signature(self.parameters)  # type: ignore[attr-defined]
        run.__doc__ = doc if doc is not None else body.__doc__
        run.__name__ = getattr(body, "__name__", "command")
        return run


def _panel_rank(param: inspect.Parameter) -> int:
    panel = getattr(param.default, "rich_help_panel", None)
    return PANELS.index(panel) if panel in PANELS else len(PANELS)


def _source(ctx: typer.Context, name: str) -> str | None:
    """Where option ``name``'s value came from: Click's parameter source (``COMMANDLINE``, ``ENVIRONMENT``,
    ``DEFAULT``, …)."""
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave option ``name`` (command line or environment), as opposed to its default."""
    return _source(ctx, name) in ("COMMANDLINE", "ENVIRONMENT")


__all__ = ["FIELD_ENVVARS", "PANELS", "CliOnly", "Nested", "Options", "Parsed", "field_docs"]
