"""commands/options.py: options derived from a config dataclass, with the precedence every command shares."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from typer.testing import CliRunner

from gptcli.commands.options import CliOnly, Nested, Options, Parsed, field_docs
from gptcli.errors import GPT1Error


@dataclass
class Inner:
    width: int = 8
    """How wide the thing is."""
    depth: int = 2
    """How deep the thing is."""


@dataclass
class ToyConfig:
    data: Path = Path("corpus")
    """Where the data is."""
    lr: float = 2.5e-4
    """Peak learning rate [per update]."""
    steps: int | None = None
    """Cap on updates."""
    schedule: Literal["cosine", "linear"] = "cosine"
    """Decay after warm-up."""
    verify_data: bool = True
    """Check checksums first."""
    files: list[str] = field(default_factory=list)
    """Extra files."""
    inner: dict[str, Any] = field(default_factory=dict)
    """Inner overrides."""


@dataclass
class Launch:
    procs: int | None = None
    """Worker processes."""


def _app(seen: list[Parsed], **kw: Any) -> typer.Typer:
    opts = Options(
        ToyConfig,
        panels={"Input": ("data", "verify_data"), "Optimisation": ("lr", "schedule")},
        flags={"verify_data": ("--verify/--no-verify",)},
        nested={"inner": Nested(Inner, ("width",))},
        sections={"launch": (Launch, "Distributed")},
        cli_only=[CliOnly("quiet", bool, False, ("--quiet", "-q"), "Say less.", why="display only")],
        **kw,
    )
    app = typer.Typer()
    app.command("toy")(opts.command(lambda p: seen.append(p), doc="A toy command."))
    app.command("other")(lambda: None)  # two commands, so "toy" is a subcommand as in gpt1
    return app


def _run(args: list[str]) -> tuple[Any, list[Parsed]]:
    seen: list[Parsed] = []
    res = CliRunner().invoke(_app(seen), ["toy", *args], env={"COLUMNS": "200"})
    return res, seen


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_field_docs_reads_attribute_docstrings() -> None:
    docs = field_docs(ToyConfig)
    assert docs["lr"] == "Peak learning rate [per update]."
    assert docs["steps"] == "Cap on updates."


def test_only_typed_options_count_as_given() -> None:
    res, seen = _run(["--lr", "0.001", "--no-verify", "--width", "16", "-q", "--procs", "2"])
    assert res.exit_code == 0, res.output
    p = seen[0]
    assert p.given == {"lr": 0.001, "verify_data": False, "inner": {"width": 16}}
    assert p.cli == {"quiet": True}
    assert p.sections["launch"] == Launch(procs=2)


def test_typing_the_default_still_overrides_a_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('lr = 0.001\nschedule = "linear"\n[inner]\ndepth = 5\n')
    res, seen = _run(["--config", str(cfg), "--lr", "0.00025"])
    assert res.exit_code == 0, res.output
    p = seen[0]
    resolved = p.resolve(ToyConfig, p.base())
    assert resolved.lr == 0.00025  # typed on the command line, although it equals the default
    assert resolved.schedule == "linear"  # from the file
    assert resolved.inner == {"depth": 5}


def test_nested_options_merge_into_the_file_table(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[inner]\ndepth = 5\n")
    _, seen = _run(["--config", str(cfg), "--width", "3"])
    p = seen[0]
    assert p.resolve(ToyConfig, p.base()).inner == {"depth": 5, "width": 3}


def test_base_falls_back_to_a_run_config_only_without_config_file(tmp_path: Path) -> None:
    run_cfg = tmp_path / "config.toml"
    run_cfg.write_text("lr = 0.5\n")
    _, seen = _run([])
    assert seen[0].base(run_cfg) == {"lr": 0.5}
    assert seen[0].base(tmp_path / "missing.toml") == {}


def test_unknown_keys_in_a_config_file_are_one_line_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("learning_rate = 0.1\n")
    _, seen = _run(["--config", str(cfg)])
    with pytest.raises(GPT1Error, match="unknown setting learning_rate"):
        seen[0].resolve(ToyConfig, seen[0].base())


def test_help_shows_panels_defaults_and_no_bool_metavar() -> None:
    res, _ = _run(["--help"])
    out = _plain(res.output)
    assert res.exit_code == 0
    for panel in ("Input", "Optimisation", "Model", "Distributed", "Output"):
        assert f"─ {panel} " in out
    assert out.index("─ Input ") < out.index("─ Optimisation ") < out.index("─ Distributed ") < out.index("─ Output ")
    assert "[default: 0.00025]" in out and "[default: cosine]" in out
    assert "Peak learning rate [per update]." in out  # docstring text, brackets not eaten as markup
    # The derived flags carry an empty metavar; --help is Typer's own here (gpt1's commands: tests/test_cli.py).
    assert not [row for row in out.splitlines() if "<bool>" in row and "--help" not in row]
    assert "--no-verify" in out


def test_literal_fields_reject_other_values() -> None:
    res, _ = _run(["--schedule", "exponential"])
    assert res.exit_code != 0
    assert "exponential" in _plain(res.output)


def test_list_fields_take_repeated_options() -> None:
    _, seen = _run(["--files", "a", "--files", "b"])
    assert seen[0].given["files"] == ["a", "b"]


def test_has_sees_command_line_and_base() -> None:
    _, seen = _run(["--lr", "1"])
    assert seen[0].has("lr") and not seen[0].has("data") and seen[0].has("data", {"data": "x"})


def test_every_option_of_every_command_sits_in_a_named_panel():
    """An option left out of ``panels`` lands in the generic "Options" box beside --help (`--layout` did, in
    finetune and eval), where nobody looks for a setting."""
    import importlib
    import pkgutil

    import gptcli.commands as commands

    for info in pkgutil.iter_modules(commands.__path__):
        options = getattr(importlib.import_module(f"gptcli.commands.{info.name}"), "OPTIONS", None)
        if options is None:
            continue
        loose = [
            p.name
            for p in options.parameters[1:]
            if getattr(p.default, "rich_help_panel", None) is None and "Argument" not in type(p.default).__name__
        ]
        assert not loose, f"gpt1 {info.name}: {loose} in no panel"
