"""The fault suite's shared pieces: a tiny corpus and pretraining run to damage, a way to run `gpt1` in this process
and read what a user would see (checked by ``error_lines.assert_one_line_error``: exit code, one ``error:`` line, no
traceback), a check that nothing was left behind, and kill -9 then resume (:func:`kill_and_resume`).

The corpus is a real `gpt1 prepare` output (real manifest, learned sentencepiece tokenizer), so the same files also
work in the subprocesses of the kill -9 and DDP tests, which cannot import the test-only tokenizers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from error_lines import gpt1

REPO = Path(__file__).resolve().parents[2]
VOCAB = 64
# The smallest model that still has every part (embeddings, one block, tied head) and that Hugging Face can
# represent (n_inner = 4·n_embd, for `convert --to hf`); no dropout, so runs with any number of processes agree.
MODEL = {
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "n_inner": 128,
    "n_ctx": 16,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
}
TINY_ARGS = [
    "--preset",
    "tiny",
    "--n-layer",
    "1",
    "--n-embd",
    "32",
    "--n-head",
    "2",
    "--n-inner",
    "128",
    "--n-ctx",
    "16",
    "--dropout",
    "0",
    "--seq-len",
    "16",
    "--batch-size",
    "4",
    "--warmup-steps",
    "1",
    "--eval-every",
    "0",
    "--eval-batches",
    "1",
    "--log-every",
    "1",
    "--device",
    "cpu",
    "--precision",
    "fp32",
    "--peak-flops",
    "1e11",
    "--quiet",
]


WORDS = (
    "the quick brown fox jumps over a lazy dog and runs far away from home while small birds sing in tall "
    "green trees near old river where children play with red ball every sunny morning before school starts "
    "but nobody knows why clever cat sleeps under warm blanket during cold winter nights"
).split()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A corpus made by `gpt1 prepare` (so its manifest is the real one) from four seeded random texts: a 64-id
    BPE, one train shard of ~7,700 tokens, one validation shard of ~2,500. Tests that damage it copy it first."""
    import random

    from gptcli.data.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("faults")
    texts = root / "texts"
    texts.mkdir()
    rng = random.Random(0)
    for i in range(4):
        lines = [" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(60)]
        (texts / f"doc{i}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return prepare(
        PrepareConfig(inputs=[str(texts)], out=root / "corpus", vocab_size=VOCAB, workers=1, val_fraction=0.25)
    ).out


@pytest.fixture(scope="session")
def run(corpus, tmp_path_factory) -> Path:
    """A pretraining run of 4 updates with checkpoints at 2 and 4 (training state included)."""
    from gptcli.train.pretrain import PretrainConfig, pretrain

    out = tmp_path_factory.mktemp("faults-run") / "run"
    pretrain(
        PretrainConfig(
            data=corpus,
            out=out,
            preset="tiny",
            model=dict(MODEL),
            seq_len=16,
            batch_size=4,
            max_steps=4,
            warmup_steps=1,
            eval_every=0,
            eval_batches=1,
            save_every=2,
            keep_last=0,
            log_every=1,
            device="cpu",
            precision="fp32",
            peak_flops=1e11,
        )
    )
    return out


def copy_of(src: Path, where: Path) -> Path:
    """A private copy of a session fixture under ``where`` (the test's tmp_path), to damage freely."""
    dst = where / src.name
    shutil.copytree(src, dst)
    return dst


# --- running gpt1 ---------------------------------------------------------------------------------------------------
# In this process: error_lines.gpt1, which the fault tests import from here with the rest.


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (files and directories, hidden ones included), relative to it."""
    return {p.relative_to(root).as_posix() for p in Path(root).rglob("*")}


def assert_nothing_new(root: Path, before: set[str], allowed: tuple[str, ...] = ()) -> None:
    """Nothing appeared under ``root`` since ``before`` was taken (no partial output, no hidden temporary),
    except paths starting with one of ``allowed``."""
    new = sorted(p for p in tree(root) - before if not p.startswith(allowed))
    assert new == [], new


# --- damaging files -------------------------------------------------------------------------------------------------


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip(path: Path, at: float | int = 0.5, mask: int = 0x01) -> None:
    """Flip bits of one byte: at a fraction of the file (float) or an offset (int, negative from the end)."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at) if isinstance(at, float) else at % len(data)
    data[i] ^= mask
    path.write_bytes(bytes(data))


class Payload:
    """A pickle whose unpickling creates ``marker``: if the file ever appears, gpt1 ran code from a data file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_pickle(path: Path, marker: Path) -> Path:
    """Write a pickle at ``path`` that would create ``marker`` when loaded (plain pickle and torch.save formats
    both: torch.save wraps the same pickle in a zip archive)."""
    import pickle

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".bin", ".pt", ".pth"):
        import torch

        torch.save({"weight": Payload(marker)}, path)
    else:
        path.write_bytes(pickle.dumps(Payload(marker)))
    return path


# --- for the --overwrite cases (tests/faults/test_overwrite_*.py): exit code and text, and every file's bytes


def cli_text(capsys, *args) -> tuple[int | None, str]:
    """:func:`gpt1` as (exit code, stdout + stderr)."""
    res = gpt1(list(args), capsys)
    return res.code, res.out + res.err


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (hidden ones too)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- for the kill -9 cases (tests/faults/test_kill9*.py): subprocesses that compute the same floats as the reference

KILL_TIMEOUT = 120  # a guard against hangs only


def one_thread_env() -> dict[str, str]:
    """One thread everywhere: the reference and every resumed piece must do the same float arithmetic."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def start_gpt1(args: list[str]) -> subprocess.Popen:
    """``python -m gptcli ARGS`` (the real command) in a subprocess, one thread everywhere, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "gptcli", *args],
        cwd=REPO,
        env=one_thread_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass
class Kill:
    """One SIGKILL that landed: when (:func:`kill_and_resume`'s moment) and what the run held after it."""

    due: int | None
    delay: float
    newest: int
    """The newest complete step checkpoint left (0: none)."""
    mid_write: bool
    """A checkpoint's temporary directory was left: the process died writing it."""


def kill_and_resume(args: list[str], run: Path, moments: Iterable[tuple[int | None, float]]) -> list[Kill]:
    """Start ``gpt1 ARGS`` (a run that resumes into ``run`` and saves step checkpoints there) and SIGKILL it, once
    per moment ``(due, delay)``: ``delay`` seconds after launch when ``due`` is None, else ``delay`` seconds after
    its newest step checkpoint reaches update ``due``. The moments are read one at a time, each just before its start
    (a moment may depend on what the run holds). Stops at a start that ends before its kill; then resumes the run to
    its end, which must go well. Returns the kills that landed."""
    kills: list[Kill] = []
    for due, delay in moments:
        proc = start_gpt1(args)
        if due is not None and not wait_for(
            lambda due=due: max(step_numbers(run), default=0) >= due, proc, "a checkpoint", poll=0.001
        ):
            break  # finished before the kill: the run is over
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=KILL_TIMEOUT)
        if proc.returncode != -signal.SIGKILL:
            break
        temporary = run.is_dir() and any(p.name.startswith(".step-") for p in (run / "checkpoints").glob(".*"))
        kills.append(Kill(due, round(delay, 3), max(step_numbers(run), default=0), temporary))
    finish(start_gpt1(args))
    return kills


# The subprocess of kill_in_write: gpt1 with the checkpoint writer patched to die at the step KILL_IN names.
KILL_IN_WRITE = r"""
import os, signal, sys
from pathlib import Path
import gptcli.checkpoint as ckpt
from gptcli.cli import main

what, at = os.environ["KILL_IN"].split(":")
real_save = ckpt.save_file


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def save_file(tensors, filename, metadata=None):
    # Write the file whole, then cut it to half and die: what the disk holds when power goes mid-write.
    real_save(tensors, filename, metadata=metadata)
    name, parent = Path(filename).name, Path(filename).parent.name
    if name == what and parent.startswith(f".{at}.tmp-"):
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])
        die()


real_move = ckpt.move_into_place


def move_into_place(tmp, target):
    if what == "rename" and target.name == at:
        die()  # every file written and flushed, not yet renamed
    real_move(tmp, target)


real_rmtree = ckpt.shutil.rmtree


def rmtree(path, *a, **k):
    if what == "prune" and Path(path).name.startswith(f".{at}.tmp-pruned-"):  # the pruned checkpoint, hidden
        (Path(path) / "model.safetensors").unlink()  # the first file gone, the rest still there
        die()
    real_rmtree(path, *a, **k)


ckpt.save_file = save_file
ckpt.move_into_place = move_into_place
ckpt.shutil.rmtree = rmtree
main(sys.argv[1:])
"""


def kill_in_write(args: list[str], what: str, at: str) -> None:
    """Run ``gpt1 ARGS`` in a subprocess that dies by SIGKILL inside the write of checkpoint ``at`` (a step
    checkpoint's name, or "final"), at ``what``: a file of it (written whole, then cut to half: power gone
    mid-write), "rename" (every file written, not yet renamed into place) or "prune" (``at`` being removed, its
    first file gone)."""
    proc = subprocess.run(
        [sys.executable, "-c", KILL_IN_WRITE, *args],
        cwd=REPO,
        env={**one_thread_env(), "KILL_IN": f"{what}:{at}"},
        capture_output=True,
        text=True,
        timeout=KILL_TIMEOUT,
    )
    assert proc.returncode == -signal.SIGKILL, (what, at, proc.stderr[-3000:])


def finish(proc: subprocess.Popen) -> None:
    """Wait for a run to end and require that it ended well, without a traceback."""
    _, err = proc.communicate(timeout=KILL_TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err


def step_numbers(run: Path) -> list[int]:
    """The updates of the complete step checkpoints in ``run``, oldest first."""
    d = run / "checkpoints"
    return sorted(int(p.name[5:]) for p in d.iterdir() if p.name.startswith("step-")) if d.is_dir() else []


def wait_for(predicate, proc: subprocess.Popen, what: str, poll: float = 0.002) -> bool:
    """Poll until ``predicate()``; False when the process ended first."""
    deadline = time.monotonic() + KILL_TIMEOUT
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    pytest.fail(f"timed out waiting for {what}")


# --- for the special-file cases (tests/faults/test_hostile_*.py)


def unblock_later(fifo: Path, after: float = 30.0) -> None:
    """Should a reader open ``fifo`` (the bug), open its other end after a while so the test fails, not hangs."""
    import threading

    def release() -> None:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass  # nobody is reading: nothing to release

    t = threading.Timer(after, release)
    t.daemon = True
    t.start()


def sst2_inputs(corpus: Path, root: Path, n_train: int, n_dev: int) -> tuple[Path, Path]:
    """(a "pretrained" checkpoint with the corpus's real tokenizer, so a subprocess can load it; an SST-2 folder of
    ``n_train`` and ``n_dev`` random sentences) under ``root``, for fine-tuning runs killed in subprocesses."""
    import random

    import torch

    from gptcli.checkpoint import save_checkpoint
    from gptcli.data.shards import open_corpus
    from gptcli.model.gpt import GPT, ModelConfig

    tok = open_corpus(corpus).tokenizer
    torch.manual_seed(0)
    # Dropout stays on (the default 0.1): a resume must restore the torch RNG state to draw the same masks.
    gpt = GPT(ModelConfig(vocab_size=tok.vocab_size, n_ctx=32, n_embd=32, n_layer=1, n_head=2, n_inner=128))
    pre = save_checkpoint(root / "pre", gpt, tok, meta={"step": 1})
    data = root / "SST-2"
    data.mkdir()
    rng = random.Random(1)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = ["sentence\tlabel"] + [
            f"{' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))}\t{rng.randint(0, 1)}" for _ in range(n)
        ]
        (data / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return pre, data


def launch_workers(launcher: int) -> dict[int, int]:
    """{rank: pid} of a launcher's worker processes (its children with a RANK in their environment)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher:
            for item in env:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(d.name)
    return found


def end_launch(proc: subprocess.Popen) -> None:
    """Kill a launcher still running after a test, and its workers first (they would outlive it)."""
    if proc.poll() is None:
        for pid in launch_workers(proc.pid).values():
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
