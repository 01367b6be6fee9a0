"""A shard cut short in place by another program while gpt1 has it memory-mapped: reading past the file's new end
would be SIGBUS (a bare "Bus error", no Python handler runs). Every command that reads shards — `pretrain`'s
window sampler, its token-id check and unigram count, `inspect`'s sample, `eval --data` — refuses in one line
naming the shard instead.

Each case runs `gpt1` in a subprocess that truncates the shard through a public seam (right after the corpus maps
it, or before a later training batch), so that a regression fails the test instead of killing pytest. A shard
truncated before the run is refused when it is opened (tests/faults/test_bad_corpora.py; an empty one here).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from error_lines import Outcome, assert_one_line_error

from tests.faults.conftest import (
    KILL_TIMEOUT,
    TINY_ARGS,
    copy_of,
    gpt1,
    one_thread_env,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# argv: SHARD SEAM AT ARGS... — cut SHARD to half its size in place, then run `gpt1 ARGS`. SEAM "mapped": right after
# the corpus memory-maps SHARD's split; "batch": just before the sampler's AT-th batch (1-based).
SCRIPT = """
import os, sys
from pathlib import Path

from gptcli.cli import main
from gptcli.data.shards import Corpus
from gptcli.data.windows import WindowSampler

shard, seam, at, args = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
done = []


def cut():
    if not done:
        os.truncate(shard, shard.stat().st_size // 2)
        done.append(True)


real_shards, real_next = Corpus.shards, WindowSampler.next_batch


def shards(self, split):
    out = real_shards(self, split)
    if seam == "mapped" and any(s.path.name == shard.name for s in out):
        cut()
    return out


def next_batch(self):
    calls.append(1)
    if seam == "batch" and len(calls) == at:
        cut()
    return real_next(self)


calls = []
Corpus.shards, WindowSampler.next_batch = shards, next_batch
main(args)
"""


def _gpt1_cutting(shard: Path, seam: str, args: list, at: int = 0) -> Outcome:
    cmd = [sys.executable, "-c", SCRIPT, str(shard), seam, str(at), *map(str, args)]
    proc = subprocess.run(
        cmd, cwd=shard.parent, env=one_thread_env(), capture_output=True, text=True, timeout=KILL_TIMEOUT
    )
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-3000:]}"
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def _pretrain(data: Path, out: Path, steps: int = 2) -> list:
    return ["pretrain", "--data", data, "--out", out, "--max-steps", steps, *TINY_ARGS]


def _shrank(res: Outcome, shard: Path) -> None:
    size = shard.stat().st_size
    assert_one_line_error(res, str(shard), f"to {size} bytes while in use", "re-run prepare or restore it")


@pytest.mark.parametrize(
    "command,rel",
    [
        ("inspect", "val-00000.arrow"),
        ("pretrain", "train-00000.arrow"),
        ("pretrain", "val-00000.arrow"),
        ("eval", "val-00000.arrow"),
    ],
)
def test_a_shard_cut_short_after_it_was_mapped_is_a_one_line_error(command, rel, corpus, run, tmp_path):
    data = copy_of(corpus, tmp_path)
    args = {
        "inspect": ["inspect", data],
        "pretrain": _pretrain(data, tmp_path / "new-run"),
        "eval": ["eval", "--checkpoint", run, "--data", data, "--device", "cpu"],
    }[command]
    _shrank(_gpt1_cutting(data / rel, "mapped", args), data / rel)


def test_a_shard_cut_short_while_pretraining_is_a_one_line_error(corpus, tmp_path):
    """The window sampler of a run that has already trained on the shard."""
    data = copy_of(corpus, tmp_path)
    res = _gpt1_cutting(data / "train-00000.arrow", "batch", _pretrain(data, tmp_path / "new-run", steps=8), at=3)
    _shrank(res, data / "train-00000.arrow")
    assert "done" not in res.out


@pytest.mark.parametrize("command", ("inspect", "pretrain"))
def test_an_empty_shard_is_a_one_line_error(command, corpus, tmp_path, capsys):
    """Cut to nothing before the run (a file of 0 bytes cannot even be mapped)."""
    data = copy_of(corpus, tmp_path)
    (data / "val-00000.arrow").write_bytes(b"")
    args = {"inspect": ["inspect", data], "pretrain": _pretrain(data, tmp_path / "new-run")}[command]
    res = gpt1([*args, "--no-verify"], capsys)
    assert_one_line_error(res, "val-00000.arrow", "not a readable token shard")


def test_mapped_shard_slices_are_plain_arrays_with_the_same_ids(corpus):
    """What the sampler and the evaluation read is unchanged: the same ids, as ordinary numpy arrays."""
    import numpy as np

    from gptcli.data.shards import ShardTokens, read_shard

    shard = read_shard(corpus / "train-00000.arrow")
    assert isinstance(shard.tokens, ShardTokens)
    window = shard.tokens[3:20]
    assert type(window) is np.ndarray and type(shard.document(0)) is np.ndarray
    assert window.tobytes() == np.asarray(shard.tokens).tobytes()[6:40]
    assert shard.max_id(chunk=7) == int(np.asarray(shard.tokens).max())
