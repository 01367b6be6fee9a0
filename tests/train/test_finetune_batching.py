"""Fine-tuning's batch order and schedule (issue #13, section 3): i.i.d. random batches and the released
``warmup_linear`` by default, length-bucketed batches and gpt1's earlier schedule as options; both batch orders
resume bitwise, and neither may change on resume."""

from __future__ import annotations

import json
import random
import signal

import pytest

import gptcli.train.finetune as ft
from gptcli.data.batching import bucketed_batches, random_batches
from gptcli.errors import GPT1Error
from gptcli.progress import RecordingProgress
from gptcli.train.finetune import FinetuneConfig, finetune
from gptcli.train.finetune_config import RULES
from gptcli.train.finetune_job import epoch_batches, lr_schedule
from gptcli.train.optim import lr_at
from gptcli.train.run.directory import finished_results
from tests.train.test_finetune_resume import SignalAt, _cfg, _write_sst2, outcome

pytestmark = pytest.mark.usefixtures("one_thread")


def _released(x, warmup=0.002):
    """The released opt.py warmup_linear: s = tf.cast(x <= warmup, tf.float32); (s*(x/warmup) + (1-s))*(1-x)."""
    s = float(x <= warmup)
    return (s * (x / warmup) + (1 - s)) * (1 - x)


def test_defaults_are_the_released_codes():
    c = FinetuneConfig()
    assert c.batching == "random" and c.schedule == "warmup_linear" and c.warmup == 0.002
    assert "batching" in ft.RULES.defining and "schedule" in ft.RULES.defining
    total = 2491  # MNLI-sized: 0.2% warm-up is 4.98 updates
    sched = lr_schedule(c, total)
    assert [sched(t) for t in range(total)] == [c.lr * _released(t / total) for t in range(total)]
    # The earlier schedule stays available: a warm-up of ceil(0.002·T) updates, then decay from its end.
    old = lr_schedule(FinetuneConfig(schedule="linear"), total)
    assert [old(t) for t in range(total)] == [lr_at(t, total, c.lr, 5, "linear") for t in range(total)]
    assert old(0) == c.lr / 5 and sched(0) == 0.0


@pytest.mark.parametrize("batching", ["random", "length"])
def test_epoch_batches_follow_the_batching_setting(batching):
    lengths = [random.Random(i).randint(3, 90) for i in range(100)]
    rng = random.Random(42)
    config, start = FinetuneConfig(batching=batching, batch_size=8), rng.getstate()
    want = (
        random_batches(100, 8, random.Random(42))
        if batching == "random"
        else bucketed_batches(lengths, 8, shuffle=True, rng=random.Random(42))
    )
    assert epoch_batches(config, lengths, rng, start) == want
    assert (
        epoch_batches(config, lengths, rng, start) == want
    )  # rebuilt from the epoch's saved RNG state, as a resume does


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_sst2(tmp_path_factory.mktemp("sst2") / "SST-2")


@pytest.fixture(scope="module")
def length_reference(pretrained, data, tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("ref") / "run"
    finetune(_cfg(pretrained, data, run, batching="length"))
    return outcome(run)


def test_length_batching_resumes_bitwise_and_differs_from_random(pretrained, data, length_reference, tmp_path):
    run = tmp_path / "run"
    res = finetune(_cfg(pretrained, data, run, batching="length"), progress=SignalAt(7, signum=signal.SIGINT))
    assert res.stopped_by == "SIGINT" and res.step == 7
    with pytest.raises(GPT1Error, match="cannot resume with changed settings: batching length → random"):
        finetune(_cfg(pretrained, data, run, resume=True))
    finetune(_cfg(pretrained, data, run, resume=True, batching="length"))
    assert outcome(run) == length_reference
    other = tmp_path / "random"
    finetune(_cfg(pretrained, data, other))
    assert outcome(other)["weights"] != length_reference["weights"]  # the batch order is part of the run


def test_a_run_recorded_before_batching_existed_counts_as_length_bucketed(tmp_path):
    """Its config has no ``batching``: it was length-bucketed, so today's default is a change, refused by name."""
    recorded = {k: v for k, v in ft.to_dict(FinetuneConfig(task="sst2")).items() if k != "batching"}
    (tmp_path / ft.RESULTS).write_text(json.dumps({"config": recorded, "steps": 3}), encoding="utf-8")
    with pytest.raises(GPT1Error, match="finished with other settings: batching length → random"):
        finished_results(tmp_path / ft.RESULTS, RULES, FinetuneConfig(task="sst2", resume=True))
    res = finished_results(tmp_path / ft.RESULTS, RULES, FinetuneConfig(task="sst2", batching="length"))
    assert res["steps"] == 3


def test_a_resume_onto_the_other_architecture_is_refused_by_name(pretrained, data, tmp_path):
    """Fine-tuning from random init: a run started as a Transformer (--model tiny) and resumed as an LSTM
    (--model lstm-tiny) shares no weights; the shape fields both configs have cannot tell them apart, the
    architecture does (the bug: it was not compared)."""
    tok = str(next(pretrained.rglob("tokenizer")))  # a bare tokenizer directory: the preset gives the shape
    run = tmp_path / "run"
    res = finetune(
        _cfg(pretrained, data, run, init="none", tokenizer=tok, model="tiny", save_every=1),
        progress=SignalAt(2, signum=signal.SIGINT),
    )
    assert res.stopped_by == "SIGINT"
    with pytest.raises(GPT1Error, match="architecture transformer → lstm"):
        finetune(_cfg(pretrained, data, run, init="none", tokenizer=tok, model="lstm-tiny", save_every=1, resume=True))


def test_an_lstm_in_the_runs_own_precision_notes_no_empty_line(pretrained, data, tmp_path):
    """An LSTM computing in the run's precision (fp32) has no precision line to say: the run notes none (the bug:
    it noted None, which the console's reporter could not print)."""
    tok = str(next(pretrained.rglob("tokenizer")))
    rec = RecordingProgress()
    cfg = _cfg(pretrained, data, tmp_path / "run", init="none", tokenizer=tok, model="lstm-tiny", epochs=1)
    finetune(cfg, progress=rec)
    assert rec.of("note") and all(isinstance(n["message"], str) for n in rec.of("note"))
