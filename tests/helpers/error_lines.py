"""What a user sees when a command fails: its exit status and output, and the one check every failure case makes
(one clean ``error:`` line, no traceback). Shared by the fault suite (tests/faults/) and the command tests."""

from __future__ import annotations

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
