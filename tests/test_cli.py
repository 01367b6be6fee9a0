"""cli.py: the one place where errors become `error: <what> (<what to do>)` lines and exit codes."""

from __future__ import annotations

import errno

import pytest

from gptcli import cli


def test_os_errors_become_one_line_with_advice() -> None:
    line = cli.os_error_line(OSError(errno.ENOSPC, "No space left on device", "/runs/x/model.safetensors"))
    assert line == (
        "/runs/x/model.safetensors: No space left on device "
        "(free some space or write elsewhere; outputs already in place were kept)"
    )
    assert "read-only" in cli.os_error_line(OSError(errno.EROFS, "Read-only file system", "/ro"))


def test_main_turns_an_os_error_into_exit_1_without_traceback(monkeypatch, capsys) -> None:
    import gptcli.commands.inspect as inspect_cmd

    def boom(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/corpus")

    monkeypatch.setattr(inspect_cmd, "render_inspect", boom)
    with pytest.raises(SystemExit) as e:
        cli.main(["inspect", "somewhere"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "error: /data/corpus: Permission denied (check the permissions" in " ".join(err.split())
    assert "Traceback" not in err


def test_debug_shows_the_traceback(monkeypatch) -> None:
    import gptcli.commands.inspect as inspect_cmd

    monkeypatch.setattr(inspect_cmd, "render_inspect", lambda *a, **k: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError):
        cli.main(["--debug", "inspect", "somewhere"])


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["pretrain", "--no-such-option"])
    assert e.value.code == 2


def test_the_overview_lists_every_command_without_importing_them(capsys) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from gptcli import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, [m for m in sys.modules if m.startswith('gptcli.commands.')])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout
    for name, _, _ in cli.COMMANDS:
        assert name in out
    assert out.strip().splitlines()[-1] == "False []"


def test_each_listed_command_loads_and_shows_its_help(capsys) -> None:
    for name, _, _ in cli.COMMANDS:
        with pytest.raises(SystemExit) as e:
            cli.main([name, "--help"])
        assert e.value.code == 0, name
        assert f"gpt1 {name}" in capsys.readouterr().out


def test_no_help_shows_a_bool_type_and_typer_is_not_patched(capsys) -> None:
    """Flags (--help, --version, --debug and every derived on/off option) show no ``<bool>`` type column, through
    the empty metavar Typer and Click take publicly: Typer's classes are left as they are."""
    import typer.core

    shown = typer.core.TyperOption.display_type_rich
    for argv in (["--help"], *([name, "--help"] for name, _, _ in cli.COMMANDS)):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0, argv
        out = capsys.readouterr().out
        assert "--help" in out and "<bool>" not in out, argv
    assert typer.core.TyperOption.display_type_rich is shown
    assert typer.core.TyperOption.display_type_rich.__module__ == "typer.core"
