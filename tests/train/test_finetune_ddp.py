"""Data-parallel fine-tuning on CPU (issue #13, section 4): `gpt1 finetune --procs 2` (DDP over gloo) against one
process, on real SST-2 rows.

Process start-up dominates, so the file launches a 2-process job twice: one stopped by SIGTERM (both ranks stop
after the same update, one checkpoint) and finished by one process, and one that continues a 1-process checkpoint.
Each whole run must equal the 1-process run: every update's loss terms, tokens and gradient norm within float
reduction order, every dev record (scores and prediction counts, from the dev split shared out over the ranks)
exactly, and the final weights within 1e-5; rank 0 alone writes (the same files as one process, every record once,
the encoding cache filled by rank 0 only). The model has no dropout, so 1 and 2 processes compute the same thing.

The global batch of 8 splits 4 + 4 over the ranks with micro-batches of 3 (a rank accumulates 3 + 1: uneven
micro-batches), and each epoch of 33 examples ends in a batch of one, which leaves a rank without examples: the
loss is weighted by example counts, never a plain mean of means.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from error_lines import assert_one_line_error

from gptcli.progress import Progress
from gptcli.train.finetune import FinetuneConfig, finetune
from gptcli.train.finetune_job import micro_batches, packed_extract, rank_share
from gptcli.train.trainer import Parallel
from tests.faults.conftest import REPO, gpt1, one_thread_env, step_numbers, tree

pytestmark = pytest.mark.usefixtures("one_thread")

N_TRAIN, N_DEV = 33, 20
SETTINGS = dict(
    task="sst2",
    batch_size=8,
    micro_batch_size=3,
    epochs=3,
    lr=5e-3,
    clf_pdrop=0.0,
    seed=7,
    log_every=1,
    save_every=0,
    device="cpu",
    precision="fp32",
    workers=1,
)
UPDATES = 15  # 5 per epoch: 8, 8, 8, 8, 1
TIMEOUT = 180  # a guard against hangs only


def _copy_rows(src: Path, dst: Path, n_train: int, n_dev: int) -> Path:
    dst.mkdir(parents=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        lines = (src / name).read_text(encoding="utf-8").splitlines()
        (dst / name).write_text("\n".join(lines[: n + 1]) + "\n", encoding="utf-8")  # the header and n rows
    return dst


@pytest.fixture(scope="module")
def inputs(shared_data, tmp_path_factory) -> tuple[Path, Path]:
    """(a "pretrained" 1-block checkpoint without dropout carrying a real sentencepiece tokenizer, which worker
    processes can load; an SST-2 folder of the first 33 train and 20 dev rows of the real files)."""
    from gptcli.checkpoint import save_checkpoint
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.tokenizers.learned import LearnedBPETokenizer

    root = tmp_path_factory.mktemp("ddp-ft")
    src = shared_data / "glue" / "SST-2"
    lines = [x.split("\t")[0].lower() for x in (src / "train.tsv").read_text(encoding="utf-8").splitlines()[1:400]]
    tok = LearnedBPETokenizer.train(lines, 200)
    torch.manual_seed(0)
    gpt = GPT(
        ModelConfig(
            vocab_size=tok.vocab_size,
            n_ctx=48,
            n_embd=32,
            n_layer=1,
            n_head=2,
            n_inner=64,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
        )
    )
    pre = save_checkpoint(root / "pre", gpt, tok, meta={"step": 1})
    return pre, _copy_rows(src, root / "SST-2", N_TRAIN, N_DEV)


def _cfg(inputs: tuple[Path, Path], out: Path, **kw) -> FinetuneConfig:
    return FinetuneConfig(**{**SETTINGS, "init": str(inputs[0]), "data_dir": str(inputs[1]), "out": str(out), **kw})


def _cli(inputs: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    args = ["finetune", "--init", str(inputs[0]), "--data-dir", str(inputs[1]), "--out", str(out), "--quiet"]
    for key, value in SETTINGS.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return [*args, *extra]


def _start(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gptcli", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**one_thread_env(), "GPT1_DIST_TIMEOUT": "60", **env},
    )


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("one") / "run"
    assert finetune(_cfg(inputs, run)).results["steps"] == UPDATES
    return run


def _assert_same_run(run: Path, ref: Path) -> None:
    """``run`` is ``ref`` up to the order of float additions (see the module docstring)."""
    from safetensors.torch import load_file

    got, want = _records(run), _records(ref)
    assert [(r["kind"], r["step"]) for r in got] == [(r["kind"], r["step"]) for r in want]  # every record once
    for a, b in zip(got, want):
        if a["kind"] == "eval":
            assert a == b  # the same predictions: scores and their distribution
            continue
        assert (a["epoch"], a["tokens"], a["lr"]) == (b["epoch"], b["tokens"], b["lr"])
        for key in ("loss", "clf_loss", "lm_loss", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key, a[key], b[key])
    res, ref_res = (json.loads((r / "results.json").read_text()) for r in (run, ref))
    for key in ("scores", "epoch", "steps", "history", "prediction_counts"):
        assert res.get(key) == ref_res.get(key), key
    weights = [load_file(r / "checkpoints" / "final" / "model.safetensors") for r in (run, ref)]
    assert max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[1]) < 1e-5
    assert tree(run) == tree(ref)  # the same files: nothing written twice, nothing left by another rank
    assert [p.name for p in run.parent.iterdir() if p.name.startswith(".")] == []  # no other rank's partial dir


# --------------------------------------------------------------------------------------------- sharing out the work


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("size,micro", [(8, None), (8, 3), (5, 2), (1, None), (2, 4), (7, 1)])
def test_each_example_weighs_one_over_the_global_batch(size, micro, world):
    """Whatever the shares and micro-batches, the gradient DDP applies is the mean over the global batch: a
    micro-batch's loss enters with factor / (micro-batches on its rank · ranks) = its examples / the batch."""
    idx = list(range(100, 100 + size))
    parts = [micro_batches(idx, r, world, micro) for r in range(world)]
    assert [i for r in range(world) for i in rank_share(idx, r, world)] == idx  # the global batch, in order
    seen, weight = [], 0.0
    for rank_parts in parts:
        for chunk, factor, share in rank_parts:
            assert factor / (len(rank_parts) * world) == pytest.approx(share if share else 0.0, abs=1e-12)
            if share:
                assert share == pytest.approx(len(chunk) / size) and len(chunk) <= (micro or size)
                seen += chunk
                weight += share
            else:  # a rank without examples still joins the all-reduce, on one example that counts for nothing
                assert factor == 0.0 and len(chunk) == 1
    assert sorted(seen) == idx and weight == pytest.approx(1.0)
    if world == 1 and size % (micro or size) == 0:
        assert {factor for _, factor, _ in parts[0]} == {1.0}  # one process, equal micro-batches: unscaled


class _Ranks(Parallel):
    """Rank ``rank`` of ``world`` in this process: :meth:`gather` returns the shares the ranks called so far."""

    def __init__(self, rank: int, world: int, shares: dict[int, list]) -> None:
        self.rank, self.world_size, self.shares = rank, world, shares

    def gather(self, obj):
        self.shares[self.rank] = obj
        return [self.shares.get(r, []) for r in range(self.world_size)]


def test_dev_predictions_are_shared_out_and_gathered_in_the_split_order(inputs, shared_data, tmp_path):
    """STS-B scores (floats, different for every pair) from 3 ranks' shares, gathered: the 1-process list."""
    from gptcli.model.classifier import FinetuneModel
    from gptcli.model.heads import TaskHead
    from gptcli.progress import SILENT
    from gptcli.tasks import get_task
    from gptcli.train.finetune_dev import predict_dev
    from gptcli.train.finetune_setup import build_setup
    from gptcli.train.trainer import Parallel

    data = _copy_rows(shared_data / "glue" / "STS-B", tmp_path / "STS-B", 8, 17)
    cfg = _cfg(inputs, tmp_path / "run", task="stsb", data_dir=str(data), batch_size=2)
    setup, gpt = build_setup(cfg, get_task("stsb"), Parallel(), SILENT)
    model = FinetuneModel(gpt, TaskHead(setup.head_config))
    torch.nn.init.constant_(model.head.linear.bias, 0.5)  # mid-range scores: none clipped to 0 or 5
    extract = packed_extract(cfg.layout, model)  # as the job lays out its dev batches
    single = predict_dev(setup, model, Parallel(), extract)
    assert len(single) == 17 and len(set(single)) > 10
    shares: dict[int, list] = {}
    for rank in (2, 1, 0):  # rank 0 gathers last, so it sees every share
        gathered = predict_dev(setup, model, _Ranks(rank, 3, shares), extract)
    assert sorted(len(s) for s in shares.values()) == [5, 6, 6]
    assert sorted(i for s in shares.values() for i, _ in s) == list(range(17))
    assert gathered == pytest.approx(single, rel=1e-5)


# --------------------------------------------------------------------------------------------- launched jobs

# Loaded in the workers (sitecustomize): every write to the encoding cache is logged with its rank, and rank 1
# tells the launcher to stop (as a Ctrl-C would) when update 7 starts, then holds the job there until the signal
# has reached both workers.
HOOK = """
import os, signal, time
RANK = os.environ.get("RANK")
if RANK is not None:
    from gptcli.data import cache
    real_write = cache.write_entry

    def write_entry(root, name, parts, seqs):
        with open(os.environ["GPT1_TEST_WRITES"], "a", encoding="utf-8") as f:
            f.write(f"rank {RANK} wrote {name}\\n")
        return real_write(root, name, parts, seqs)

    cache.write_entry = write_entry
    if RANK == "1":
        from gptcli.train import trainer
        real_step = trainer.Trainer.step

        def step(self, n, mbs):
            if n == 6:
                os.kill(os.getppid(), signal.SIGTERM)
            if n >= 6:
                time.sleep(0.5)
            return real_step(self, n, mbs)

        trainer.Trainer.step = step
"""


@pytest.mark.slow
def test_two_processes_stop_together_and_one_process_finishes_the_run(inputs, reference, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
    run, writes, cache = tmp_path / "two", tmp_path / "writes.log", tmp_path / "cache"
    path = os.pathsep.join([str(hook), str(REPO), os.environ.get("PYTHONPATH", "")])
    proc = _start(
        _cli(inputs, run, "--procs", "2"), PYTHONPATH=path, GPT1_TEST_WRITES=str(writes), GPT1_CACHE=str(cache)
    )
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err[-3000:]
    assert "launching 2 CPU worker(s): global batch 8 = 2 × 4" in err
    assert "stopped by SIGTERM" in err and "--resume (with any number of processes)" in err, err[-3000:]
    # Both ranks stopped after the same update and saved once (beside the end of epoch 1's checkpoint).
    steps = step_numbers(run)
    stop = steps[-1]
    assert steps == [5, stop] and 7 <= stop < UPDATES, steps
    assert [r["step"] for r in _records(run) if r["kind"] == "train"] == list(range(1, stop + 1))
    # The encoding cache: written by rank 0 alone (the train and dev entries), read by rank 1.
    lines = writes.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(x.startswith("rank 0 wrote ") for x in lines), lines
    assert len(list(cache.glob("*.arrow"))) == 2 and not list(cache.glob(".*"))
    # One process continues the 2-process checkpoint (the position is counted in global batches).
    assert finetune(_cfg(inputs, run, resume=True)).results["steps"] == UPDATES
    _assert_same_run(run, reference)


class _SignalAt(Progress):
    def __init__(self, at: int) -> None:
        self.at, self.n = at, 0

    def advance(self, n: float = 0, **status) -> None:
        self.n += 1
        if self.n == self.at:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_a_one_process_checkpoint_continues_in_two_processes(inputs, reference, tmp_path, capsys):
    run = tmp_path / "one"
    res = finetune(_cfg(inputs, run), progress=_SignalAt(3))
    assert res.stopped_by == "SIGINT" and step_numbers(run) == [3]
    proc = _start(_cli(inputs, run, "--procs", "2", "--resume"))
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    assert "done: 15 updates" in err
    _assert_same_run(run, reference)
    # Resuming the finished run has nothing to do: no worker is started.
    res = gpt1(_cli(inputs, run, "--procs", "2", "--resume"), capsys)
    assert res.code == 0 and "launching" not in res.err, res.err[-3000:]


# --------------------------------------------------------------------------------------------- refusals


def test_launches_that_cannot_work_are_refused_before_any_worker_starts(inputs, reference, tmp_path, capsys):
    out = tmp_path / "run"
    res = gpt1(_cli(inputs, out, "--procs", "2", "--batch-size", "1"), capsys)
    assert_one_line_error(res, "--batch-size 1 is smaller than the 2 processes")
    if not torch.cuda.is_available():
        res = gpt1(_cli(inputs, out, "--gpus", "2"), capsys)
        assert_one_line_error(res, "--gpus 2: no CUDA device is available", "--procs 2")
    assert not out.exists()
    before = tree(reference)
    res = gpt1(_cli(inputs, reference, "--procs", "2"), capsys)  # a finished run, without --overwrite
    assert_one_line_error(res, "already holds a fine-tuned checkpoint")
    assert "launching" not in res.err and tree(reference) == before
