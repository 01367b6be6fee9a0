"""The `gpt1` command line: parse options, call the library, render with Rich.

Each subcommand is one function in ``gptcli/commands/<name>.py`` (named ``command``), listed in ``COMMANDS`` here,
so this file stays a table of contents. A command's module is imported only when that command runs or shows its
own ``--help``, which keeps ``gpt1 --help`` instant although the commands' config dataclasses pull in torch.

User errors (:class:`gptcli.errors.GPT1Error`) print as one red line and exit 1; ``--debug`` or
``GPT1_DEBUG=1`` shows the traceback instead. Usage errors exit 2, Ctrl-C 130 and SIGTERM 143 (128 + the signal),
after the ``finally`` blocks of the interrupted command removed its temporaries.
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import signal
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Protocol, cast

import typer

if TYPE_CHECKING:  # the public base class (see _show for what is raised)
    from typer import TyperException as ClickError
else:
    try:  # Typer >= 0.16 vendors Click; the base class of its Click's exceptions is Typer's public TyperException
        from typer import TyperException as ClickError
    except ImportError:  # pragma: no cover - older Typer raises the errors of Click itself
        from click import ClickException as ClickError
from rich.console import Console
from rich.markup import escape

from gptcli import __version__
from gptcli.errors import GPT1Error
from gptcli.files.fsutil import printable, visible_path
from gptcli.system.torch_floor import check_torch
from gptcli.train.launch_files import debugging, keep_for_launcher

# (subcommand, module in gptcli.commands, one-line summary for `gpt1 --help`), in the order of the paper's pipeline.
# A module is imported only when its subcommand runs or shows its own --help: torch and spaCy load in seconds,
# and `gpt1 --help` should not wait for them.
COMMANDS: list[tuple[str, str, str]] = [
    (
        "quickstart",
        "quickstart",
        "Run the whole pipeline at toy scale in minutes, offline: prepare → pretrain → fine-tune → eval → zero-shot.",
    ),
    ("prepare", "prepare", "Clean text, learn a BPE vocabulary and encode it into token shards (GPT-1's pipeline)."),
    ("inspect", "inspect", "Summarise a prepared corpus and verify every shard's checksum."),
    ("pretrain", "pretrain", "Pretrain a GPT-1 language model on a prepared corpus (paper §4.1 defaults)."),
    (
        "fetch",
        "fetch",
        "Download task data (GLUE, SNLI, SciTail, RACE) from the Hugging Face Hub into its official "
        "layout under the data root.",
    ),
    (
        "finetune",
        "finetune",
        "Fine-tune a pretrained checkpoint on one of the paper's tasks (paper §3.2, §4.1 defaults).",
    ),
    (
        "eval",
        "evaluate",
        "Evaluate checkpoints: perplexity on a prepared corpus (--data) or the paper's metric on a task (--task).",
    ),
    (
        "zeroshot",
        "zeroshot",
        "Zero-shot heuristics of the paper (SST-2, CoLA, RACE, DPRD, WSC, Story Cloze) and their "
        "curve over pretraining.",
    ),
    ("convert", "convert", "Convert weights: OpenAI's released GPT-1 and Hugging Face checkpoints in and out."),
    ("generate", "generate", "Generate text from a checkpoint (KV cache; greedy, temperature, top-k, top-p)."),
    (
        "lmeval",
        "lmeval",
        "Score a checkpoint with EleutherAI's lm-evaluation-harness (lm_eval's arguments, the gpt1 "
        "model registered; needs gpt1[eval]).",
    ),
]


# Options that may also be typed without a value, and the value that means (Typer has no optional-value options):
# `--wandb` alone is `--wandb=gpt1` (gptcli/train/runlog.py, DEFAULT_WANDB_PROJECT).
OPTIONAL_VALUES: dict[str, str] = {"--wandb": "gpt1"}


def _optional_values(argv: list[str]) -> list[str]:
    """``argv`` with each option of OPTIONAL_VALUES that has no value (last, or followed by another option) given
    its implied one; ``--wandb=NAME`` and ``--wandb NAME`` pass unchanged."""
    out = []
    for i, a in enumerate(argv):
        if a in OPTIONAL_VALUES and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            a = f"{a}={OPTIONAL_VALUES[a]}"
        out.append(a)
    return out


# Options naming a model, whose default (no value) is the paper's model: typed empty (a shell variable never set), they
# must not silently become a download of another model.
MODEL_OPTIONS = ("--init", "--checkpoint", "-c", "--tokenizer")


def _refuse_empty_models(argv: list[str]) -> None:
    if argv[:1] == ["lmeval"]:  # lm-eval's own arguments, passed on unchanged
        return
    for i, a in enumerate(argv):
        if a == "--":
            return
        name, eq, value = a.partition("=")
        if a in MODEL_OPTIONS and i + 1 < len(argv):
            name, value = a, argv[i + 1]
        elif not (eq and name in MODEL_OPTIONS):
            continue
        if not value.strip():
            raise GPT1Error(
                f"{name} was given an empty value (name a checkpoint directory or a Hub id, or leave {name} out "
                "for the default)"
            )


class _Showable(Protocol):
    def show(self) -> None: ...


def _show(error: ClickError) -> None:
    """Click's own rendering of a usage error: Typer raises its vendored Click's exceptions, which have ``show()``
    (the public base class it exports does not say so)."""
    cast(_Showable, error).show()


def _stray_hint(error: ClickError) -> str | None:
    """For a stray positional argument (``gpt1 finetune rte``), the option it probably belongs to: a task name to
    ``--task``, other words to ``--prompt``, a prepared corpus to ``--data``, a checkpoint or run directory to
    ``--checkpoint`` or ``--init``."""
    from pathlib import Path

    message = str(getattr(error, "message", ""))
    ctx = getattr(error, "ctx", None)
    if "unexpected extra argument" not in message or ctx is None:
        return None
    stray = (message[message.rfind("(") + 1 : message.rfind(")")].split() or [""])[0]
    options = {o for p in ctx.command.params for o in getattr(p, "opts", ())}
    path = Path(stray)
    candidates = []
    if not path.exists():
        from gptcli.tasks.registry import all_tasks

        known = stray.lower() in {t.name for t in all_tasks()} | {"all"}
        candidates.append("--task" if known else "--prompt")
    elif (path / "manifest.json").is_file():
        candidates.append("--data")
    elif path.is_dir():
        candidates += ["--checkpoint", "--init"]
    for option in candidates:
        if option in options:
            return f"did you mean {option} {stray}?"
    return f"options are named: see gpt1 {ctx.info_name} --help"


def _untyped_help(option: Any) -> Any:
    """The ``--help`` option with an empty metavar, so that --help shows no ``<bool>`` type beside it: recent Typer
    prints a flag's type (reading as if the flag took a value) unless the option has a metavar. The options of
    commands/options.py and the root's get the same empty metavar where they are declared."""
    if option is not None:
        option.metavar = ""
    return option


class _Command(typer.core.TyperCommand):
    """A subcommand: Typer's, with the ``--help`` of :func:`_untyped_help`."""

    def get_help_option(self, ctx: Any) -> Any:
        return _untyped_help(super().get_help_option(ctx))


class _LazyCommands(typer.core.TyperGroup):
    """The subcommands of COMMANDS, each imported on first use; the overview lists them from the table."""

    _overview = False

    def get_help_option(self, ctx: Any) -> Any:
        return _untyped_help(super().get_help_option(ctx))

    def list_commands(self, ctx: Any) -> list[str]:
        return [name for name, _, _ in COMMANDS]

    def get_command(self, ctx: Any, name: str) -> Any:
        entry = next((e for e in COMMANDS if e[0] == name), None)
        if entry is None:
            return None
        if self._overview:  # `gpt1 --help` needs the name and summary only
            return typer.core.TyperCommand(name, short_help=entry[2])
        return _load(*entry)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._overview = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._overview = False


@functools.cache
def _load(name: str, module: str, summary: str) -> Any:
    mod = importlib.import_module(f"gptcli.commands.{module}")
    single = typer.Typer(rich_markup_mode="rich", pretty_exceptions_enable=False, add_completion=False)
    single.command(name, cls=_Command, short_help=summary, **getattr(mod, "COMMAND_SETTINGS", {}))(mod.command)
    command = typer.main.get_command(single)
    command.name = name
    return command


app = typer.Typer(
    name="gpt1",
    cls=_LazyCommands,
    help="GPT-1 end to end: prepare text, pretrain, fine-tune on the paper's 12 tasks, evaluate, zero-shot.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

_state = {"debug": False}


# No emoji codes (``dev.tsv:100:`` must not print as ``dev.tsv💯``) and, when piped, no line cut inside a path.
err_console = Console(stderr=True, emoji=False)
if not err_console.is_terminal:
    err_console.soft_wrap = True


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpt1 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool | None = typer.Option(
        None, "--version", callback=_version, is_eager=True, metavar="", help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", metavar="", help="Show full tracebacks for errors (also: GPT1_DEBUG=1)."
    ),
) -> None:
    _state["debug"] = debug or _state["debug"]
    if debug:  # the workers a --gpus/--procs launch starts read it too (restored when main returns)
        os.environ["GPT1_DEBUG"] = "1"
    # Before any subcommand (`gpt1 --help` and `--version` are eager and still answer): an older torch than gpt1's
    # floor would fail minutes into a run.
    check_torch()


def _record_for_launcher(e: BaseException) -> None:
    """Inside a torch.distributed worker, leave the error where the launcher reads it (per-rank error file),
    so `gpt1 pretrain --gpus N` can report which rank failed and why."""
    if os.environ.get("TORCHELASTIC_ERROR_FILE") and not isinstance(e, SystemExit):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        if isinstance(e, GPT1Error) and type(e) is not GPT1Error:
            # The file holds "<class name>: <message>", and the launcher shows a GPT1Error's message alone; a
            # subclass (out of memory, a diverged run) would otherwise read "OutOfMemory: cuda:3 ran out of …".
            e = GPT1Error(str(e))

        ErrorHandler().record_exception(e)


def os_error_line(e: OSError) -> str:
    """``<path>: <what the OS said> (<what to do>)`` for an error from the operating system."""
    what = e.strerror or str(e)
    where = f"{visible_path(e.filename)}: " if e.filename else ""  # the user's path, never a hidden temporary
    hint = {
        errno.ENOSPC: "free some space or write elsewhere; outputs already in place were kept",
        errno.EACCES: "check the permissions, or write elsewhere",
        errno.EROFS: "the file system is read-only: write elsewhere",
        errno.ENOTDIR: "a path component is a file, not a directory: choose another path",
        errno.EEXIST: "it already exists: choose another path",
        errno.EISDIR: "that is a directory: give a file",
    }.get(e.errno or -1, "check the path and try again; --debug shows the traceback")
    return f"{where}{what} ({hint})"


def _out_of_memory_line(e: BaseException) -> str | None:
    """One line for a failed allocation outside a training run's update loop (which words its own, naming the run's
    flags: gptcli/train/run/memory.py): in scoring, zero-shot, generation or conversion. None for anything else."""
    if "torch" not in sys.modules:  # nothing allocated tensors: not an allocation of ours
        return None
    from gptcli.train.run.memory import is_out_of_memory

    if not is_out_of_memory(e):
        return None
    what = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return (
        f"out of memory: {what} (score in smaller batches: --batch-size of eval and zeroshot; a smaller "
        f"--micro-batch-size in training; --debug shows where)"
    )


class Terminated(BaseException):
    """SIGTERM or SIGHUP (a closed terminal or ssh session), raised in the main thread like Ctrl-C's
    KeyboardInterrupt: Python's default would end the process on the spot and leave the command's hidden temporaries
    (a half-written corpus) behind."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_sigterm(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise Terminated(signum)


# The signals that end a command as SIGTERM does (a training run checkpoints first: GracefulStop hears them too).
STOP_SIGNALS = (signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


def _catch_sigterm() -> dict[int, Any] | None:
    """Install :func:`_on_sigterm` for STOP_SIGNALS; returns the handlers it replaced (None where signals cannot be
    caught)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.signal(s, _on_sigterm) for s in STOP_SIGNALS}


def _error_line(text: str) -> None:
    # A worker of gpt1's launcher leaves its error to the launcher, which says it in one line for the whole job.
    if keep_for_launcher(f"error: {text}"):
        return
    # The message is text, not Rich markup: a path like "data/[abc].txt" or a gloo error "[/__w/…]" must print as is.
    # One line by contract: a newline or escape sequence inside (a path the user typed) is shown escaped.
    err_console.print(f"[bold red]error:[/] {escape(printable(text))}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with one-line user errors and meaningful exit codes."""
    debug_env = os.environ.get("GPT1_DEBUG")
    _state["debug"] = debugging()
    command = typer.main.get_command(app)
    previous = _catch_sigterm()
    try:
        args = _optional_values(list(sys.argv[1:] if argv is None else argv))
        _refuse_empty_models(args)
        rv = command.main(args=args, prog_name="gpt1", standalone_mode=False)
    except GPT1Error as e:
        _record_for_launcher(e)
        if _state["debug"]:
            raise
        _error_line(str(e))
        sys.exit(e.exit_code)
    except typer.Abort:
        err_console.print("[bold red]aborted[/]")
        sys.exit(130)
    except ClickError as e:  # usage errors: Click's own message and exit code (2)
        hint = _stray_hint(e)
        if hint is not None:
            e.message = f"{e.message} ({hint})"
        _show(e)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        if not keep_for_launcher("interrupted"):  # a worker's launcher says how the job stopped
            err_console.print("[bold red]interrupted[/]")
        sys.exit(130)
    except Terminated as e:
        word = "hung up" if e.signum != signal.SIGTERM else "terminated"
        if not keep_for_launcher(word):
            err_console.print(f"[bold red]{word}[/]")
        sys.exit(128 + e.signum)
    except OSError as e:  # read-only or full disks, an --out that is a file: the user can act on these
        _record_for_launcher(e)
        if _state["debug"]:
            raise
        _error_line(os_error_line(e))
        sys.exit(1)
    except BaseException as e:
        _record_for_launcher(e)
        line = _out_of_memory_line(e)
        if line is None and not _state["debug"] and keep_for_launcher(traceback.format_exc()):
            sys.exit(1)  # its launcher names the error; the traceback is in the run's workers.log
        if line is None or _state["debug"]:
            raise
        _error_line(line)
        sys.exit(1)
    finally:
        for s, handler in (previous or {}).items():
            signal.signal(s, handler)
        if debug_env is None:
            os.environ.pop("GPT1_DEBUG", None)
        else:
            os.environ["GPT1_DEBUG"] = debug_env
    sys.exit(rv if isinstance(rv, int) else 0)
