"""The `gpt1` command line: parse options, call the library, render with Rich.

Each subcommand is one function in ``gptcli/commands/<name>.py`` (named ``command``) registered here, so this
file stays a table of contents. Heavy imports (torch, spaCy) happen inside the command bodies, which keeps
``gpt1 --help`` instant.

User errors (:class:`gptcli.errors.GPT1Error`) print as one red line and exit 1; ``--debug`` or
``GPT1_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import sys
from typing import Optional

import typer

try:  # typer >= 0.16 vendors click as typer._click; older versions use click itself
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as click_exc
from rich.console import Console

from gptcli import __version__
from gptcli.errors import GPT1Error

app = typer.Typer(
    name="gpt1",
    help="GPT-1 end to end: prepare text, pretrain, fine-tune on the paper's 12 tasks, evaluate, zero-shot.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# (subcommand name, module in gptcli.commands) in the order of the paper's pipeline.
COMMANDS: list[tuple[str, str]] = [
    ("quickstart", "quickstart"),
    ("prepare", "prepare"),
    ("inspect", "inspect"),
    ("pretrain", "pretrain"),
    ("finetune", "finetune"),
    ("eval", "evaluate"),
    ("zeroshot", "zeroshot"),
    ("convert", "convert"),
    ("generate", "generate"),
]

_state = {"debug": False}


def _hide_flag_types() -> None:
    """Recent Typer prints ``<bool>`` beside every flag in --help (``--help <bool>``, ``--resume <bool>``), which
    reads as if the flag took a value; a flag's type says nothing its name does not."""
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None:  # pragma: no cover - older Typer has no type column
        return

    def display_type_rich(self, ctx):  # type: ignore[no-untyped-def]
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    option.display_type_rich = display_type_rich


_hide_flag_types()
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpt1 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks for errors (also: GPT1_DEBUG=1)."
    ),
) -> None:
    _state["debug"] = debug or _state["debug"]


def _register() -> None:
    for name, module in COMMANDS:
        qualified = f"gptcli.commands.{module}"
        if importlib.util.find_spec(qualified) is None:
            continue
        mod = importlib.import_module(qualified)
        app.command(name, **getattr(mod, "COMMAND_SETTINGS", {}))(mod.command)


_register()


def _record_for_launcher(e: BaseException) -> None:
    """Inside a torch.distributed worker, leave the error where the launcher reads it (per-rank error file),
    so `gpt1 pretrain --gpus N` can report which rank failed and why."""
    if os.environ.get("TORCHELASTIC_ERROR_FILE") and not isinstance(e, SystemExit):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(e)


def os_error_line(e: OSError) -> str:
    """``<path>: <what the OS said> (<what to do>)`` for an error from the operating system."""
    what = e.strerror or str(e)
    where = f"{e.filename}: " if e.filename else ""
    hint = {
        errno.ENOSPC: "free some space or write elsewhere; outputs already in place were kept",
        errno.EACCES: "check the permissions, or write elsewhere",
        errno.EROFS: "the file system is read-only: write elsewhere",
        errno.ENOTDIR: "a path component is a file, not a directory: choose another path",
        errno.EEXIST: "it already exists: choose another path",
        errno.EISDIR: "that is a directory: give a file",
    }.get(e.errno or -1, "check the path and try again; --debug shows the traceback")
    return f"{where}{what} ({hint})"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with one-line user errors and meaningful exit codes."""
    _state["debug"] = os.environ.get("GPT1_DEBUG", "") not in ("", "0")
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="gpt1", standalone_mode=False)
    except GPT1Error as e:
        _record_for_launcher(e)
        if _state["debug"]:
            raise
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.Abort:
        err_console.print("[bold red]aborted[/]")
        sys.exit(130)
    except click_exc.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)
    except OSError as e:  # read-only or full disks, an --out that is a file: the user can act on these
        _record_for_launcher(e)
        if _state["debug"]:
            raise
        err_console.print(f"[bold red]error:[/] {os_error_line(e)}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except BaseException as e:
        _record_for_launcher(e)
        raise
    sys.exit(rv if isinstance(rv, int) else 0)
