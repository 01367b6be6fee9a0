"""What a user sees when a command runs: ``gpt1`` run in this process (:func:`gpt1`, the suite's one in-process
runner), its exit status and output, and the one check every failure case makes (one clean ``error:`` line, no
traceback). Shared by the fault suite (tests/faults/) and the command tests."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterable, Mapping
from typing import NamedTuple


class Outcome(NamedTuple):
    """A command's exit status and output (unpacks as ``code, out, err``)."""

    code: int | None
    """The exit status; None when an exception escaped ``main`` (a traceback for the user)."""
    out: str
    err: str


def assert_one_line_error(res: Outcome, *fragments: str, code: int = 1, alone: bool = False) -> str:
    """The command failed with ``code``, its stderr ends in exactly one ``error: …`` line containing every
    fragment, and no traceback reached the user; with ``alone``, that line is all stderr holds (no note or warning
    above it). Returns the error line."""
    assert "Traceback" not in res.err, res.err[-3000:]
    assert res.code == code, (res.code, res.err[-3000:])
    lines = [x for x in res.err.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.err[-3000:]
    assert not alone or len(lines) == 1, res.err[-3000:]
    for f in fragments:
        assert f in errors[0], (f, errors[0])
    return errors[0]


def gpt1(
    args: Iterable[object], capsys=None, *, env: Mapping[str, str] | None = None, unwrap_err: bool = False
) -> Outcome:
    """``gpt1 ARGS`` in this process, as the console script runs it (each argument passed as ``str``).

    The exit status is the one ``main`` exits with; an exception that escapes ``main`` (what would reach the user as
    a traceback) gives None, with its traceback printed to stderr. With pytest's ``capsys``, what the command printed
    is read into ``out`` and ``err``; without it both are empty and the output stays for the caller's ``capsys``.
    ``env`` is set for this run only (a wide COLUMNS, say); ``unwrap_err`` joins the runs of whitespace in ``err``
    into single spaces, so that a message Rich wrapped at the terminal's width reads as one line."""
    from gptcli.cli import main

    before = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    code: int | None
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # what would reach the user as a traceback
        code = None
        print(traceback.format_exc(), file=sys.stderr)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if capsys is None:
        return Outcome(code, "", "")
    cap = capsys.readouterr()
    return Outcome(code, cap.out, " ".join(cap.err.split()) if unwrap_err else cap.err)
