"""`gpt1 pretrain` / `gpt1 eval --data`: learning, bitwise resume (signal and crash), NaN guard, CLI errors."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corpus_helpers import random_corpus, text_corpus
from error_lines import gpt1

import gptcli.train.pretrain as pretrain_mod
from gptcli.checkpoint import load_checkpoint
from gptcli.errors import GPT1Error
from gptcli.progress import Progress, RecordingProgress
from gptcli.train.pretrain import PretrainConfig, pretrain
from gptcli.train.run.loop import NonFiniteLossError

TESTS = Path(__file__).resolve().parents[1] / "helpers"
MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_inner": 256, "n_ctx": 32}


def _cfg(data: Path, out: Path, **kw) -> PretrainConfig:
    base = dict(
        data=data,
        out=out,
        preset="tiny",
        model=dict(MODEL),
        seq_len=32,
        batch_size=8,
        micro_batch_size=4,
        max_steps=8,
        warmup_steps=2,
        eval_every=0,
        save_every=0,
        log_every=1,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    base.update(kw)
    return PretrainConfig(**base)


def _train_losses(run: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return random_corpus(tmp_path_factory.mktemp("corpus"))


def test_progress_is_the_second_argument_and_the_callers_kernels_mode_survives(corpus, tmp_path, monkeypatch):
    """``pretrain(cfg, progress)`` as prepare, finetune, zeroshot and evaluate_tasks take it (it was keyword-only: a
    TypeError); the run computes in its config's mode, and the caller's is back afterwards."""
    from gptcli.model import kernels

    monkeypatch.setenv(kernels.ENV, "reference")
    seen: list[str] = []

    class Watch(RecordingProgress):
        def stage(self, name, total=None, *, unit="", done=0):
            seen.append(kernels.mode())
            super().stage(name, total, unit=unit, done=done)

    rec = Watch()
    res = pretrain(_cfg(corpus, tmp_path / "run", max_steps=1, kernels="auto"), rec)
    assert res.step == 1 and rec.of("stage")[0]["name"] == "pretrain"
    assert set(seen) == {"auto"} and kernels.mode() == "reference"


def test_tiny_run_on_books_learns(shared_data, tmp_path):
    books = ["pg11_alice_in_wonderland.txt", "pg1952_yellow_wallpaper.txt", "pg41_legend_of_sleepy_hollow.txt"]
    texts = [(shared_data / "books" / b).read_text(encoding="utf-8-sig")[20_000:80_000] for b in books]
    data = text_corpus(tmp_path / "books", texts)
    run = tmp_path / "run"
    res = pretrain(
        _cfg(
            data,
            run,
            max_steps=60,
            batch_size=16,
            micro_batch_size=16,
            lr=3e-3,
            warmup_steps=5,
            eval_every=20,
            eval_batches=8,
            log_every=10,
        )
    )
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [e["step"] for e in evals] == [20, 40, 60]
    assert math.log(256) - 1.0 > evals[-1]["loss"]  # far below a uniform byte model (5.55 nats)
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert res.final_val_loss == evals[-1]["loss"]
    ck = load_checkpoint(run)  # the run directory resolves to its newest checkpoint, tokenizer included
    assert ck.meta["step"] == 60 and ck.tokenizer is not None and ck.tokenizer.kind == "test-bytes"


class SignalAt(Progress):
    """Sends this process SIGINT when the logged update ``at`` is reported (the stage's position: its ``done``
    plus every ``advance``)."""

    def __init__(self, at: int) -> None:
        self.at, self.position = at, 0

    def stage(self, name, total=None, *, unit="", done=0):
        self.position = done

    def advance(self, n=0, **status):
        self.position += n
        if self.position == self.at:
            os.kill(os.getpid(), signal.SIGINT)  # handled between updates: checkpoint at `at`, then stop


def test_pretrain_reports_through_progress(corpus, tmp_path):
    rec = RecordingProgress()
    res = pretrain(_cfg(corpus, tmp_path / "run", max_steps=4, log_every=2, eval_every=2), progress=rec)
    kinds = [k for k, _ in rec.events]
    assert kinds[0] == "stage" and kinds[-1] == "end" and kinds.count("stage") == kinds.count("end") == 1
    assert rec.of("stage")[0] == {"name": "pretrain", "total": 4, "unit": "updates", "done": 0}
    advances = rec.of("advance")
    assert [a["n"] for a in advances] == [2, 2]  # one per logged update; positions 2 and 4
    logged = [
        r
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    for a, r in zip(advances, logged):
        assert (a["loss"], a["lr"], a["grad_norm"]) == (r["loss"], r["lr"], r["grad_norm"])
        assert a["tok/s"] == round(r["tokens_per_s"]) and {"MFU", "ETA"} <= set(a)
    notes = [n["message"] for n in rec.of("note")]
    assert notes[0].startswith("validation at update 2: loss ") and notes[-1].startswith("validation at update 4:")
    assert f"loss {res.final_val_loss:.4f}" in notes[-1]
    # A resumed run's stage starts where the checkpoint left off.
    rec = RecordingProgress()
    pretrain(_cfg(corpus, tmp_path / "run", max_steps=6, log_every=2, resume=True), progress=rec)
    assert rec.of("stage")[0]["done"] == 4 and [a["n"] for a in rec.of("advance")] == [2]


def test_resume_after_sigint_is_bitwise_identical(corpus, tmp_path):
    full = tmp_path / "full"
    pretrain(_cfg(corpus, full, eval_every=3))
    reference = _train_losses(full)

    run = tmp_path / "interrupted"
    res = pretrain(_cfg(corpus, run, eval_every=3), progress=SignalAt(5))
    assert res.stopped_by == "SIGINT" and res.step == 5 and res.last_checkpoint.name == "step-0000005"
    with pytest.raises(GPT1Error, match="--resume"):
        pretrain(_cfg(corpus, run, eval_every=3))
    res = pretrain(_cfg(corpus, run, eval_every=3, resume=True))
    assert res.step == 8
    assert _train_losses(run) == reference  # bitwise: floats compared exactly


KILL_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads({threads})  # the reference run's: LayerNorm's weight gradients are summed in per-thread parts
from pathlib import Path
import corpus_helpers  # registers the test tokenizer
import gptcli.train.run.training_state as ts
from gptcli.train.pretrain import PretrainConfig, pretrain

real = ts.write_training_state
def dying(d, optimizer, state, **kw):
    if state["step"] == 6:  # weights are written, training state not yet: die like `kill -9`
        os.kill(os.getpid(), signal.SIGKILL)
    return real(d, optimizer, state, **kw)
ts.write_training_state = dying
cfg = PretrainConfig(**{cfg})
pretrain(cfg)
"""


def test_resume_after_kill_mid_save(corpus, tmp_path):
    full = tmp_path / "full"
    pretrain(_cfg(corpus, full, max_steps=9, save_every=3))
    run = tmp_path / "killed"
    kw = dict(
        data=str(corpus),
        out=str(run),
        preset="tiny",
        model=MODEL,
        seq_len=32,
        batch_size=8,
        micro_batch_size=4,
        max_steps=9,
        warmup_steps=2,
        eval_every=0,
        save_every=3,
        log_every=1,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    script = KILL_SCRIPT.format(tests=str(TESTS), cfg=f"{kw!r}", threads=torch.get_num_threads())
    proc = subprocess.run([sys.executable, "-c", script], cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names[1] == "step-0000003" and names[0].startswith(".step-0000006.tmp-"), names
    res = pretrain(_cfg(corpus, run, max_steps=9, save_every=3, resume=True))
    assert res.step == 9
    assert _train_losses(run) == _train_losses(full)
    assert not any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())  # stale temp dir cleaned


def test_nan_loss_stops_naming_last_good_checkpoint(corpus, tmp_path, monkeypatch):
    real = pretrain_mod.lm_loss
    calls = {"n": 0}

    def poisoned(model, batch):
        calls["n"] += 1
        loss = real(model, batch)
        return loss * float("nan") if calls["n"] > 10 else loss  # 2 micro-batches per update: NaN at update 6

    monkeypatch.setattr(pretrain_mod, "lm_loss", poisoned)
    run = tmp_path / "nan"
    with pytest.raises(NonFiniteLossError) as e:
        pretrain(_cfg(corpus, run, save_every=4))
    msg = str(e.value)
    assert "nan" in msg and "update 6" in msg and str(run / "checkpoints" / "step-0000004") in msg


def test_cli_pretrain_then_eval_perplexity(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    args = [
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(run),
        "--preset",
        "tiny",
        "--n-layer",
        "2",
        "--n-embd",
        "64",
        "--n-head",
        "4",
        "--n-inner",
        "256",
        "--n-ctx",
        "32",
        "--seq-len",
        "32",
        "--batch-size",
        "8",
        "--max-steps",
        "3",
        "--warmup-steps",
        "1",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--peak-flops",
        "1e11",
        "--quiet",
    ]
    code, _, err = gpt1(args, capsys)
    assert code == 0, err
    saved = (run / "config.toml").read_text()
    assert "max_steps = 3" in saved and "n_layer = 2" in saved
    final = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x][-1]
    code, out, err = gpt1(
        [
            "eval",
            "--checkpoint",
            str(run),
            "--data",
            str(corpus),
            "--split",
            "val",
            "--seq-len",
            "32",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, err
    assert f"{final['perplexity']:.2f}" in out  # same windows, same number
    # Resuming a finished run with its saved config extends it.
    code, _, err = gpt1(["pretrain", "--out", str(run), "--resume", "--max-steps", "4", "--quiet"], capsys)
    assert code == 0, err
    assert load_checkpoint(run).meta["step"] == 4


def test_cli_errors_are_one_line(corpus, tmp_path, capsys):
    code, _, err = gpt1(["pretrain", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "r")], capsys)
    assert code == 1 and "corpus directory not found" in err and "Traceback" not in err
    bad = random_corpus(tmp_path / "bad")
    shard = bad / "train-00001.arrow"
    raw = bytearray(shard.read_bytes())
    raw[-200] ^= 0xFF
    shard.write_bytes(bytes(raw))
    code, _, err = gpt1(["pretrain", "--data", str(bad), "--out", str(tmp_path / "r"), "--device", "cpu"], capsys)
    assert code == 1 and "train-00001.arrow: checksum mismatch" in err
    code, _, err = gpt1(["eval", "--checkpoint", str(tmp_path / "nope"), "--data", str(corpus)], capsys)
    assert code == 1 and "checkpoint not found" in err
    code, _, err = gpt1(["pretrain", "--data", str(corpus), "--out", str(tmp_path / "r"), "--precision", "fp8"], capsys)
    assert code == 1 and "--precision" in err
    code, _, err = gpt1(
        [
            "pretrain",
            "--data",
            str(corpus),
            "--out",
            str(tmp_path / "r"),
            "--batch-size",
            "6",
            "--micro-batch-size",
            "4",
        ],
        capsys,
    )
    assert code == 1 and "multiple of --micro-batch-size" in err
    bad_cfg = tmp_path / "run.toml"
    bad_cfg.write_text('data = "x"\nout = "y"\nlearning_rate = 1.0\n')
    code, _, err = gpt1(["pretrain", "--config", str(bad_cfg)], capsys)
    assert code == 1 and "unknown setting learning_rate" in err


def test_perplexity_scores_every_token_once():
    import numpy as np

    from gptcli.eval.perplexity import eval_windows, evaluate_lm
    from gptcli.model.gpt import GPT, ModelConfig

    arrays = [np.arange(5), np.arange(100, 140), np.arange(200, 233), np.arange(300, 301)]
    scored = []
    for w, skip in eval_windows(arrays, 8):
        scored += list(w[1:][skip:])
    assert sorted(scored) == sorted(int(t) for a in arrays for t in a[1:])
    model = GPT(ModelConfig(vocab_size=400, n_ctx=8, n_embd=16, n_layer=1, n_head=2, n_inner=32))
    res = evaluate_lm(model, arrays, 8, batch_size=3)
    assert res.tokens == 4 + 39 + 32 and math.isfinite(res.perplexity)


@pytest.mark.parametrize(
    "model, message",
    [
        ({"n_layer": "x"}, "model.n_layer: expected an integer, got 'x'"),  # was a TypeError traceback
        ({"n_head": "4"}, "model.n_head: expected an integer, got '4'"),
        ({"n_embd": 256.0}, "model.n_embd: expected an integer, got 256.0"),  # was a traceback in torch.empty
        ({"n_embd": 1.5}, "model.n_embd: expected an integer, got 1.5"),  # was "must be divisible by n_head"
        ({"n_layer": True}, "model.n_layer: expected an integer, got True"),  # trained a 1-layer model
        ({"init_std": "wide"}, "model.init_std: expected a number, got 'wide'"),
        ({"n_hidden": 64}, "unknown model setting(s) n_hidden in [model]"),  # an LSTM's field on a Transformer
    ],
)
def test_model_overrides_are_typed_against_the_presets_fields(model, message, corpus, tmp_path):
    with pytest.raises(GPT1Error, match=re.escape(message)):
        pretrain(_cfg(corpus, tmp_path / "run", model={**MODEL, **model}))
    assert not (tmp_path / "run").exists()
    with pytest.raises(GPT1Error, match=re.escape("model.n_hidden: expected an integer, got True")):
        pretrain(_cfg(corpus, tmp_path / "run", preset="lstm-tiny", model={"n_hidden": True}))


def test_a_val_split_the_corpus_lacks_is_refused_naming_its_splits(corpus, tmp_path):
    with pytest.raises(GPT1Error, match=r"--val-split nosuch: corpus .* has no such split \(its splits: train, val;"):
        pretrain(_cfg(corpus, tmp_path / "run", val_split="nosuch"))
    assert not (tmp_path / "run").exists()  # refused before training


def _bare_lm(directory: Path, tokenizer=None) -> Path:
    """A random 16-token-context model over the byte corpus's 256 ids, with or without a tokenizer/."""
    from gptcli.checkpoint import save_checkpoint
    from gptcli.model.gpt import GPT, ModelConfig

    cfg = ModelConfig(vocab_size=256, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)
    return save_checkpoint(directory, GPT(cfg), tokenizer, meta={"step": 1})


def test_eval_refuses_a_seq_len_over_the_models_context(corpus, tmp_path):
    from corpus_helpers import ByteTokenizer

    from gptcli.eval.perplexity import corpus_perplexity

    ck = _bare_lm(tmp_path / "ck", ByteTokenizer())
    with pytest.raises(GPT1Error, match=r"--seq-len 100000 exceeds the context of .* \(n_ctx=16; pass --seq-len 16"):
        corpus_perplexity([ck], corpus, seq_len=100000, device="cpu", max_batches=1)  # was clamped to 16 silently
    assert corpus_perplexity([ck], corpus, seq_len=16, device="cpu", max_batches=1)[0].tokens > 0


def test_eval_of_a_tokenizerless_checkpoint_warns_that_the_tokenizer_was_not_checked(corpus, tmp_path):
    from gptcli.eval.perplexity import corpus_perplexity

    ck = _bare_lm(tmp_path / "bare")
    progress = RecordingProgress()
    rows = corpus_perplexity([ck], corpus, device="cpu", max_batches=1, progress=progress)
    assert rows[0].tokens > 0  # scored: eval cannot know the tokenizer, the corpus's ids fit the model
    warnings = [a["message"] for kind, a in progress.events if kind == "note" and a["level"] == "warn"]
    assert len(warnings) == 1 and warnings[0].startswith("the tokenizer could not be checked:")
    assert f"{ck} has no tokenizer/" in warnings[0]
