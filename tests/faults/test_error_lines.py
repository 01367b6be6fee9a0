"""How a failure reaches the user: one ``error: <what> (<what to do>)`` line printed verbatim (even with brackets,
which Rich would take for markup), exit status 2 for usage, 1 for user errors, 130 for Ctrl-C and 143 for SIGTERM —
after the interrupted command removed its temporaries — and the traceback only with --debug."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import (
    REPO,
    TINY_ARGS,
    assert_nothing_new,
    gpt1,
    tree,
)

TEXT = "The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up.\n"


@pytest.mark.parametrize("name", ["[abc]", "[/y]", "[bold red]x[/]", "a [link=http://x]b"])
def test_error_messages_print_verbatim(name, tmp_path, capsys):
    """A path with brackets: "[abc]" used to vanish from the message, "[/y]" to crash Rich with a MarkupError."""
    missing = tmp_path / name / "corpus"
    res = gpt1(["inspect", missing], capsys)
    assert_one_line_error(res, str(missing), "corpus directory not found")


def test_os_error_messages_print_verbatim(tmp_path, capsys):
    target = tmp_path / "[/x] notes.txt"  # a file "x] notes.txt" in a directory "["
    target.parent.mkdir()
    target.write_text("mine\n")
    res = gpt1(["prepare", target, "--out", target / "corpus"], capsys)
    assert_one_line_error(res, str(target))


# --- the shape: `error: <what> (<what to do>)`, alone on stderr -------------------------------------------------------


def _advised(res, *fragments: str) -> str:
    """The one error line, alone on stderr (no note, blank line or rule before it), ending in ``(what to do)``."""
    line = assert_one_line_error(res, *fragments)
    assert res.err.strip() == line, res.err[-3000:]
    assert re.fullmatch(r"error: \S.* \(.+\)", line), line
    return line


def _bad_sst2(tmp: Path) -> Path:
    (tmp / "sst2").mkdir()
    (tmp / "sst2" / "dev.tsv").write_text("text\tlabel\ngood .\t1\n", encoding="utf-8")
    return tmp / "sst2"


ADVISED = {  # a name → (the command line, fragments its error names), from (tmp_path, the faults' corpus and run)
    "missing input": lambda t, c, r: (["prepare", t / "nonexistent.txt", "--out", t / "o"], ["no such file", "check"]),
    "missing checkpoint": lambda t, c, r: (
        ["zeroshot", "--task", "sst2", "--checkpoint", t / "nosuch", "--data-dir", t],
        ["checkpoint not found", "give a checkpoint directory"],
    ),
    "corpus as checkpoint": lambda t, c, r: (["eval", "--checkpoint", c, "--task", "rte"], ["neither a checkpoint"]),
    "file as corpus": lambda t, c, r: (
        ["pretrain", "--data", t / "afile", "--out", t / "run"],
        ["a file, not a corpus directory", "gpt1 prepare"],
    ),
    "output under a file": lambda t, c, r: (
        ["prepare", t / "afile", "--out", t / "afile" / "sub"],
        [f"{t / 'afile'} is a file, not a directory", "choose another path"],
    ),
    "glue header": lambda t, c, r: (
        ["zeroshot", "--task", "sst2", "--checkpoint", r, "--data-dir", _bad_sst2(t)],
        ["header lacks column 'sentence'", "official file"],
    ),
    "tiny vocabulary": lambda t, c, r: (
        ["prepare", t / "afile", "--vocab-size", "10", "--out", t / "o"],
        ["--vocab-size 10 is too small", "pass 16 or more"],
    ),
    "config is a folder": lambda t, c, r: (
        ["pretrain", "--config", t, "--out", t / "run"],
        ["a directory, not a config file", "give a .toml or .json file"],
    ),
    "config not found": lambda t, c, r: (
        ["finetune", "--config", t / "nosuch.toml", "--task", "rte"],
        ["config file not found", "check the path"],
    ),
}


@pytest.mark.parametrize("case", sorted(ADVISED))
def test_errors_say_what_to_do(case, corpus, run, tmp_path, capsys):
    (tmp_path / "afile").write_text("hi\n", encoding="utf-8")
    args, fragments = ADVISED[case](tmp_path, corpus, run)
    line = _advised(gpt1(args, capsys), *fragments)
    assert ".lock" not in line  # the user's path, never a hidden lock file of gpt1's


@pytest.mark.parametrize("code", (errno.EACCES, errno.EROFS))
def test_an_unwritable_output_directory_is_named_not_its_lock(code, tmp_path, capsys, monkeypatch):
    """The lock beside --out is the first thing written: a directory gpt1 may not write in is named as such (root
    writes anywhere, so the refusal is simulated at the lock file's creation)."""
    import gptcli.files.locks as locks

    real = os.open

    def refuse(path, *a, **k):
        if str(path).endswith(".lock"):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(locks.os, "open", refuse)
    (tmp_path / "t.txt").write_text("hi\n", encoding="utf-8")
    ro = tmp_path / "ro"
    ro.mkdir()
    line = _advised(
        gpt1(["prepare", tmp_path / "t.txt", "--out", ro / "corpus"], capsys),
        f"cannot write in {ro}: {os.strerror(code)}",
    )
    assert ".lock" not in line


def test_usage_errors_exit_2(capsys):
    for args in (["pretrain", "--no-such-option"], ["pretrain", "--lr", "fast"], ["no-such-command"]):
        res = gpt1(args, capsys)
        assert res.code == 2 and "Traceback" not in res.err, (args, res.err)


def test_debug_shows_the_traceback(tmp_path, capsys):
    res = gpt1(["--debug", "inspect", tmp_path / "missing"], capsys)
    assert res.code is None and "Traceback" in res.err and "GPT1Error" in res.err


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def _interrupt(cmd: list[str], ready, sig: int, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``gpt1 CMD``, send ``sig`` once ``ready()`` holds, and return how it ended."""
    # Ctrl-C as from a terminal: a test run started in the background of a non-interactive shell (`cmd &`)
    # inherits SIGINT ignored, and so would gpt1 (POSIX keeps an ignored signal ignored across exec).
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptcli", *map(str, cmd)],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# Ctrl-C ends quietly: Typer turns KeyboardInterrupt into exit 130 itself (the terminal already shows the ^C).
@pytest.mark.parametrize(
    "sig,code,word", [(signal.SIGINT, 130, None), (signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hung up")]
)
def test_an_interrupted_prepare_leaves_nothing(sig, code, word, tmp_path):
    """SIGTERM used to end `prepare` on the spot, leaving its hidden ``.corpus.partial-PID`` (as big as the corpus)
    for good; now both signals unwind like Ctrl-C."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(3):
        (inputs / f"t{i}.txt").write_text(TEXT * 8000 + f"document {i}\n")
    before = tree(tmp_path)
    started = lambda: any(p.name.startswith(".corpus.partial-") for p in tmp_path.iterdir())  # noqa: E731
    done = _interrupt(
        ["prepare", inputs, "--out", tmp_path / "corpus", "--vocab-size", "40", "--workers", "1"], started, sig
    )
    assert done.returncode == code, done.stderr[-3000:]
    if word is not None:
        assert done.stderr.strip().splitlines()[-1] == word, done.stderr and "Traceback" not in done.stderr
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("sig", (signal.SIGTERM, signal.SIGHUP), ids=("SIGTERM", "SIGHUP"))
def test_sigterm_to_pretrain_checkpoints_and_resumes(sig, corpus, tmp_path, capsys):
    """SIGHUP (the terminal or ssh session closed) stops like SIGTERM: a checkpoint, then exit, never a lost run."""
    run = tmp_path / "run"
    args = ["pretrain", "--data", corpus, "--out", run, "--max-steps", "100000", "--save-every", "0", *TINY_ARGS]
    logged = lambda: (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size > 0  # noqa: E731
    done = _interrupt(args, logged, sig)
    assert done.returncode == 130, done.stderr[-3000:]
    assert f"stopped by {sig.name}" in done.stderr and "--resume" in done.stderr and "Traceback" not in done.stderr
    (ckpt,) = (run / "checkpoints").iterdir()
    step = int(ckpt.name.split("-")[1])
    res = gpt1(["pretrain", "--out", run, "--resume", "--max-steps", str(step + 1), "--quiet"], capsys)
    assert res.code == 0, res.err[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == f"step-{step + 1:07d}"


def test_sigterm_handler_is_restored_after_an_in_process_call(tmp_path, capsys):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    gpt1(["inspect", Path(tmp_path) / "missing"], capsys)
    assert {s: signal.getsignal(s) for s in before} == before
