"""Data-parallel pretraining on CPU: `gpt1 pretrain --procs 2` (DDP over gloo) against one process.

Process start-up dominates here, so the whole file launches the 2-process job three times: one run stopped by
SIGTERM (equivalence with one process, graceful stop, then resumed by one process), one 2-process resume of a
1-process checkpoint, and one run where a rank fails on corrupt data.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus_helpers import write_corpus
from error_lines import gpt1

from gptcli.data.shards import open_corpus
from gptcli.data.windows import WindowSampler
from gptcli.train.pretrain import PretrainConfig, pretrain

ROOT = Path(__file__).resolve().parents[2]
MODEL = {
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "n_inner": 64,
    "n_ctx": 16,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
}  # no dropout: 1 and 2 processes see equal math
SEQ, BATCH, MICRO, SEED = 16, 8, 2, 3
# Constant schedule after warmup: a run's learning rates do not depend on where it stops, so a run stopped by
# SIGTERM at an unknown update compares step by step with a reference of any length.
COMMON = dict(
    preset="tiny",
    seq_len=SEQ,
    batch_size=BATCH,
    micro_batch_size=MICRO,
    seed=SEED,
    lr=1e-2,
    warmup_steps=2,
    schedule="constant",
    eval_every=0,
    eval_batches=2,
    log_every=1,
    device="cpu",
    precision="fp32",
    peak_flops=1e11,
)
TIMEOUT = 240  # a guard against hangs only; nothing asserts on time


def _tokenizer():
    from gptcli.tokenizers.learned import LearnedBPETokenizer

    # A real (sentencepiece) tokenizer kind, so worker processes can load the corpus without test-only imports.
    lines = ["the quick brown fox jumps over the lazy dog and runs far away from home"] * 50
    return LearnedBPETokenizer.train(lines + ["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 20, 64)


def _corpus(directory: Path, poison: tuple[int, int] | None = None) -> Path:
    """Random ids in two one-document train shards (flat array = the document) and a val shard; ``poison``
    = (shard, position) gets the id 1000, outside the 64-id vocabulary."""
    rng = np.random.default_rng(0)
    train = [rng.integers(0, 64, n) for n in (700, 500)]
    if poison is not None:
        train[poison[0]][poison[1]] = 1000
    return write_corpus(directory, {"train": [[a] for a in train], "val": [[rng.integers(0, 64, 200)]]}, _tokenizer())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("corpus"))


def _cfg(data: Path, out: Path, **kw) -> PretrainConfig:
    return PretrainConfig(data=data, out=out, model=dict(MODEL), **{**COMMON, **kw})


def _cli_args(data: Path, out: Path, *extra: str) -> list[str]:
    args = [
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--n-head",
        "2",
        "--n-inner",
        "64",
        "--n-ctx",
        "16",
        "--dropout",
        "0",
        "--seq-len",
        str(SEQ),
        "--batch-size",
        str(BATCH),
        "--micro-batch-size",
        str(MICRO),
        "--seed",
        str(SEED),
        "--lr",
        "1e-2",
        "--warmup-steps",
        "2",
        "--eval-every",
        "0",
        "--eval-batches",
        "2",
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
    # --schedule comes from a config file here, so the launched workers also exercise --config below typed options.
    cfg = out.parent / f"{out.name}.toml"
    cfg.write_text('schedule = "constant"\n', encoding="utf-8")
    return [*args, "--config", str(cfg), *extra]


def _gpt1(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPT1_DIST_TIMEOUT": "60", **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "gptcli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _losses(run: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


def _evals(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]


def _close(a: dict[int, float], b: dict[int, float], steps) -> None:
    for s in steps:
        assert a[s] == pytest.approx(b[s], rel=1e-5, abs=1e-6), (s, a[s], b[s])


def test_ranks_split_every_global_batch_of_the_epoch(corpus):
    """Rank r takes the r-th slice of each global batch: disjoint windows that together are the 1-process epoch."""
    arrays = open_corpus(corpus).arrays("train")
    single = WindowSampler(arrays, SEQ, BATCH, SEED)
    ranks = [WindowSampler(arrays, SEQ, BATCH, SEED, rank=r, world_size=2) for r in range(2)]
    seen: list[set[int]] = [set(), set()]
    epoch: list[int] = []
    for _ in range(single.steps_per_epoch):
        whole, offset = single.next_indices()
        parts = [r.next_indices() for r in ranks]
        assert all(o == offset for _, o in parts)  # same grid offset on every rank
        assert np.array_equal(np.concatenate([p for p, _ in parts]), whole)
        for r, (p, _) in enumerate(parts):
            seen[r].update(p.tolist())
        epoch.extend(whole.tolist())
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(epoch) and len(epoch) == len(set(epoch))
    assert len(epoch) == single.steps_per_epoch * BATCH


def test_validation_batches_are_shared_out_over_ranks(corpus):
    from gptcli.eval.perplexity import evaluate_lm
    from gptcli.model.gpt import GPT
    from gptcli.train.pretrain import build_model_config

    torch.manual_seed(0)
    model = GPT(build_model_config(_cfg(corpus, corpus), 64))
    val = open_corpus(corpus).arrays("val")
    for cap in (None, 3):
        whole = evaluate_lm(model, val, SEQ, 2, max_batches=cap)
        parts = [evaluate_lm(model, val, SEQ, 2, max_batches=cap, rank=r, world_size=2) for r in range(2)]
        assert sum(p.tokens for p in parts) == whole.tokens and all(p.tokens for p in parts)
        combined = sum(p.loss * p.tokens for p in parts) / whole.tokens
        assert combined == pytest.approx(whole.loss, rel=1e-9)


def test_launch_options_are_checked_before_starting_anything(corpus, tmp_path, capsys):
    def run(*extra):
        code, _, err = gpt1(["pretrain", "--data", str(corpus), "--out", str(tmp_path / "r"), *extra], capsys)
        return code, err

    if not torch.cuda.is_available():
        code, err = run("--gpus", "2")
        assert code == 1 and "--gpus 2: no CUDA device is available" in err and "--procs 2" in err
    code, err = run("--gpus", "1", "--procs", "2")
    assert code == 1 and "exclusive" in err
    code, err = run("--nodes", "2", "--master-addr", "10.0.0.1")
    assert code == 1 and "need --gpus N (or --procs N)" in err
    code, err = run("--procs", "2", "--nodes", "2")
    assert code == 1 and "--master-addr" in err
    code, err = run("--procs", "2", "--batch-size", "6", "--micro-batch-size", "2")
    assert code == 1 and "× 2 process(es)" in err
    assert not (tmp_path / "r").exists()


def test_environment_decides_launcher_or_worker(monkeypatch):
    from gptcli.train.distributed import LaunchConfig, env_world, is_launched_worker, plan_launch

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GPT1_DIST_WORKER", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(k, raising=False)
    assert env_world() is None and plan_launch() is None  # a plain process trains itself
    spec = plan_launch(LaunchConfig(procs=2))
    assert spec.nproc_per_node == 2 and not spec.use_cuda
    # A bare SLURM task is a worker of the SLURM job, unless launch options ask it to start workers per node.
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert env_world() == (3, 4, 1) and not is_launched_worker()
    assert plan_launch(LaunchConfig(procs=2, nodes=2, node_rank=1, master_addr="node0")).node_rank == 1
    # torchrun's variables win, and a worker never launches again.
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert env_world() == (5, 8, 1) and is_launched_worker() and plan_launch(LaunchConfig(procs=2)) is None


def test_workers_take_a_repeated_signal_as_one_stop(capfd):
    from gptcli.train.run.loop import GracefulStop

    # A Ctrl-C reaches a worker twice (terminal and launcher): it must still checkpoint, not raise.
    with GracefulStop(escalate=False) as stop:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    assert stop.name == "SIGTERM"
    # One process: the second one interrupts, saying that the stop checkpoint was skipped.
    with pytest.raises(KeyboardInterrupt, match="without its stop checkpoint"), GracefulStop() as stop:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert "without its stop checkpoint" in capfd.readouterr().err  # said at once: the CLI exits 130 quietly


def _wait_for_step(run: Path, step: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        path = run / "metrics.jsonl"
        if path.is_file() and any(s >= step for s in _losses_partial(path)):
            return
        time.sleep(0.05)
    out, err = proc.communicate(timeout=5) if proc.poll() is not None else ("", "")
    pytest.fail(f"the 2-process run never logged update {step} (rc {proc.poll()}): {err[-3000:]}")


def _losses_partial(path: Path) -> list[int]:
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass  # a line being written
    return steps


def test_two_processes_match_one_stop_on_sigterm_and_resume_with_one(corpus, tmp_path):
    two = tmp_path / "two"
    proc = _gpt1(_cli_args(corpus, two, "--procs", "2", "--max-steps", "500", "--save-every", "0"))
    _wait_for_step(two, 3, proc)
    proc.send_signal(signal.SIGTERM)  # to the launcher only: it forwards the signal to its workers
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err[-3000:]
    assert "stopped by SIGTERM" in err and "--resume" in err
    ckpts = sorted(p.name for p in (two / "checkpoints").iterdir())
    assert len(ckpts) == 1, ckpts  # checkpointed once
    stop = int(ckpts[0].split("-")[1])
    got = _losses(two)
    assert 3 <= stop < 500 and max(got) == stop
    # tokens/s counts the global batch; MFU divides by the peak of both processes' devices.
    from gptcli.model.gpt import GPT
    from gptcli.train.pretrain import build_model_config

    fpt = GPT(build_model_config(_cfg(corpus, two), 64)).flops_per_token(SEQ)
    for r in (json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()):
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * fpt / (2 * COMMON["peak_flops"]), rel=1e-9)

    # The same global batch in one process gives the same losses (DDP averages gradients of disjoint halves).
    ref = tmp_path / "one"
    pretrain(_cfg(corpus, ref, max_steps=stop + 3, save_every=1, keep_last=0))
    reference = _losses(ref)
    _close(got, reference, range(1, stop + 1))

    # The 2-process checkpoint continues in one process (the sampler position is global).
    res = pretrain(_cfg(corpus, two, max_steps=stop + 3, resume=True))
    assert res.step == stop + 3
    _close(_losses(two), reference, range(1, stop + 4))

    # ... and a 1-process checkpoint continues in two processes.
    back = tmp_path / "back"
    shutil.copytree(ref, back)
    for p in (back / "checkpoints").iterdir():
        if int(p.name.split("-")[1]) > 2:
            shutil.rmtree(p)
    proc = _gpt1(_cli_args(corpus, back, "--procs", "2", "--max-steps", str(stop + 3), "--resume"))
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    resumed = _losses(back)
    assert sorted(resumed) == list(range(1, stop + 4))
    _close(resumed, reference, range(1, stop + 4))
    assert (back / "checkpoints" / f"step-{stop + 3:07d}").is_dir()
    # The final validation, split over the two ranks and combined, equals the 1-process one.
    evals = [_evals(r)[-1] for r in (back, ref)]
    assert evals[0]["step"] == evals[1]["step"] == stop + 3 and evals[0]["tokens"] == evals[1]["tokens"]
    assert evals[0]["loss"] == pytest.approx(evals[1]["loss"], rel=1e-5)


FAIL_ON_RANK_1 = """
import os
if os.environ.get("RANK") == "1":
    from gptcli.data import windows
    real, calls = windows.WindowSampler.next_batch, [0]

    def failing(self):
        calls[0] += 1
        if calls[0] == 2:
            raise IndexError("index 1000 is out of range for the embedding (injected on rank 1 at update 2)")
        return real(self)

    windows.WindowSampler.next_batch = failing
"""


def test_a_failing_rank_fails_the_whole_job_with_its_message(corpus, tmp_path):
    # Rank 1 fails at its second update while rank 0 waits for it in the gradient all-reduce. (Out-of-range ids,
    # the real error this stood for, are now refused by every rank before training: pretrain checks the ids.)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_ON_RANK_1, encoding="utf-8")
    temp = tmp_path / "temp"  # the launcher's temporary folders: all gone when it ends (elastic's own stayed)
    temp.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(hook), str(ROOT), os.environ.get("PYTHONPATH", "")]), "TMPDIR": str(temp)}
    proc = _gpt1(_cli_args(corpus, tmp_path / "run", "--procs", "2", "--max-steps", "50"), env)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, err[-3000:]
    assert "worker rank 1 failed" in err and "index 1000 is out of range" in err, err[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert [p.name for p in temp.iterdir() if p.name.startswith(("torchelastic_", "gpt1-"))] == []


def test_two_nodes_on_one_machine_match_one_process(corpus, tmp_path):
    """The multi-node path (static rendezvous on --master-addr, as on a cluster) with two 1-process "nodes"."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    nodes = [
        _gpt1(
            _cli_args(
                corpus,
                run,
                "--procs",
                "1",
                "--max-steps",
                "3",
                "--nodes",
                "2",
                "--node-rank",
                str(r),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
            )
        )
        for r in (0, 1)
    ]
    for p in nodes:
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err[-3000:]
    ref = tmp_path / "one"
    pretrain(_cfg(corpus, ref, max_steps=3))
    _close(_losses(run), _losses(ref), range(1, 4))


def test_each_rank_draws_its_own_dropout_masks_and_rank_0_keeps_the_single_process_stream():
    from gptcli.train.run.loop import seed_rank_rng

    def masks(rank: int, step: int) -> torch.Tensor:
        torch.manual_seed(1234)  # what every rank did before building the model (or restored on resume)
        seed_rank_rng(1234, rank, step)
        return torch.nn.functional.dropout(torch.ones(4096), p=0.5) > 0

    single = masks(0, 0)
    torch.manual_seed(1234)
    assert torch.equal(single, torch.nn.functional.dropout(torch.ones(4096), p=0.5) > 0)  # rank 0 untouched
    r1, r2 = masks(1, 0), masks(2, 0)
    for a, b in ((single, r1), (single, r2), (r1, r2)):
        assert (a != b).float().mean() > 0.4  # independent halves disagree on about half the units
    assert torch.equal(masks(1, 0), r1)  # reproducible per (rank, step): a resume redraws the same stream
    assert not torch.equal(masks(1, 100), r1)


def test_the_elastic_launch_config_builds_on_a_pytorch_without_shutdown_timeout(monkeypatch):
    """torch 2.11's LaunchConfig has no ``shutdown_timeout``: the first GPU run's ``gpt1 pretrain --gpus 1`` failed
    on it (TypeError). The field is passed where it exists and left out where it does not."""
    import dataclasses

    import torch.distributed.launcher.api as api

    from gptcli.train.distributed import LaunchConfig, elastic_config, plan_launch

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GPT1_DIST_WORKER", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(k, raising=False)
    spec = plan_launch(LaunchConfig(procs=2))
    if "shutdown_timeout" in {f.name for f in dataclasses.fields(api.LaunchConfig)}:
        assert elastic_config(spec).shutdown_timeout == spec.shutdown_timeout_s
    older = dataclasses.make_dataclass(
        "LaunchConfig",
        [(f.name, f.type, f) for f in dataclasses.fields(api.LaunchConfig) if f.name != "shutdown_timeout"],
    )
    monkeypatch.setattr(api, "LaunchConfig", older)
    config = elastic_config(spec)
    assert isinstance(config, older) and config.nproc_per_node == 2 and config.max_restarts == 0


def test_a_rank_after_the_first_draws_the_same_masks_after_a_resume():
    """Reseeded from (seed, rank, step) only when a run started, rank 1's dropout stream after a resume was another
    than the uninterrupted run's: a 2-process run with dropout stopped and resumed ended with other weights. The
    update loop now redraws it before every update, so the masks of update k depend on k alone."""
    from gptcli.progress import SILENT
    from gptcli.train.run.loop import Due, GracefulStop, RunState, train
    from gptcli.train.trainer import Parallel

    class Rank1(Parallel):
        rank, world_size = 1, 2

        def any(self, flag: bool) -> bool:
            return flag

    class Job:  # the least of the Job protocol: each update draws a dropout mask
        def __init__(self, start: int, total: int) -> None:
            self.state, self.par, self.masks = RunState(torch.device("cpu"), total), Rank1(), {}
            self.state.step, self.state.rank_seed = start, 1234

        def due_on_resume(self):
            return None

        def next_update(self) -> torch.Tensor:
            self.masks[self.state.step] = torch.nn.functional.dropout(torch.ones(256), p=0.5) > 0
            self.state.step += 1
            return torch.tensor(1.0)

        def after_update(self) -> Due:
            return Due()

        def log(self, report, due) -> None:
            pass

    whole, resumed = Job(0, 6), Job(3, 6)
    torch.manual_seed(1234)
    train(whole, GracefulStop(signals=()), SILENT)
    torch.manual_seed(99)  # a new process: whatever the stream was before the resume
    train(resumed, GracefulStop(signals=()), SILENT)
    for step in (3, 4, 5):
        assert torch.equal(resumed.masks[step], whole.masks[step]), step
    assert not torch.equal(whole.masks[0], whole.masks[1])  # a new mask each update, not the same one repeated


def test_a_worker_whose_launcher_was_killed_stops(tmp_path):
    """`kill -9` of the launcher left its workers training as orphans, outside the run lock that died with it; the
    heartbeat thread now ends a worker whose parent is gone."""
    worker = (
        "import time; from gptcli.train.heartbeat import heartbeat; "
        f"heartbeat({str(tmp_path)!r}, 1, 0.1); time.sleep(60)"
    )
    launcher = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {worker!r}]); print(p.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while not (tmp_path / "rank-1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()

    def ended() -> bool:  # gone, or a zombie left for an init that does not reap
        try:
            return Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
        except OSError:
            return True

    while time.monotonic() < deadline:
        if ended():
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the orphaned worker kept running")
    assert "the launching process is gone; stopping" in parent.stderr.read()


def test_a_validation_cap_scores_the_same_windows_whatever_the_processes(corpus):
    """--eval-batches counted micro-batches: with 2 processes (or --micro-batch-size 4) validation scored half the
    windows of one process, and another loss. It counts global batches of --batch-size windows now."""
    from gptcli.eval.perplexity import evaluate_lm
    from gptcli.model.gpt import GPT
    from gptcli.train.pretrain import build_model_config
    from gptcli.train.pretrain_job import validation_batches

    cfg = _cfg(corpus, corpus, batch_size=4, eval_batches=2)
    torch.manual_seed(0)
    model = GPT(build_model_config(cfg, 64))
    val = open_corpus(corpus).arrays("val")
    one = evaluate_lm(model, val, SEQ, 4, max_batches=validation_batches(cfg, 4))
    for world, micro in ((2, 2), (2, 1), (1, 2)):
        parts = [
            evaluate_lm(model, val, SEQ, micro, max_batches=validation_batches(cfg, micro), rank=r, world_size=world)
            for r in range(world)
        ]
        assert sum(p.tokens for p in parts) == one.tokens == 8 * SEQ, (world, micro)
        assert sum(p.loss * p.tokens for p in parts) / one.tokens == pytest.approx(one.loss, rel=1e-6)


class _Failure:
    """A worker's failure as elastic reports it: exit code (negative: the signal), signal name, time in seconds."""

    def __init__(self, exitcode: int, timestamp: int) -> None:
        self.exitcode, self.timestamp = exitcode, timestamp

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name if self.exitcode < 0 else "<N/A>"


def test_the_failure_named_is_the_worker_that_failed_not_the_one_the_launcher_stopped():
    """Rank 1 fails on its own and the launcher SIGTERMs rank 0 within the same second: rank 1 is named, not the
    lower rank the launcher stopped."""
    from gptcli.train.distributed import failure_that_ended

    failures = {0: _Failure(-signal.SIGTERM, 100), 1: _Failure(1, 100)}
    assert failure_that_ended(failures)[0] == 1
    # A worker killed from outside (SIGKILL) is named before the others, which then fail on its closed connection.
    failures = {0: _Failure(-signal.SIGKILL, 101), 1: _Failure(1, 100)}
    assert failure_that_ended(failures)[0] == 0
    # A SIGTERM alone (the user's or a scheduler's) is still named.
    assert failure_that_ended({1: _Failure(-signal.SIGTERM, 100)})[0] == 1
