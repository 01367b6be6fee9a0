"""Impossible pretraining settings and corpora (issue 17, item 11): one line each, checked before any run directory
is created — `--lr -0.001` was a ValueError from the optimizer, `--dropout 1.5` one from torch, `--max-steps 0` ran
one update, and `--no-verify` on out-of-range token ids was an IndexError that left a run directory behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
from corpus_helpers import random_corpus, write_corpus
from error_lines import assert_one_line_error, gpt1
from run_helpers import TINY_ARGS, flip_byte, tiny_config

from gptcli.errors import GPT1Error
from gptcli.eval.perplexity import corpus_perplexity
from gptcli.train.pretrain import pretrain
from gptcli.train.pretrain_config import check_pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return random_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--lr", "-0.001"], "--lr -0.001 is impossible (it must be a positive number)"),
        (["--lr", "0"], "--lr 0.0 is impossible"),
        (["--lr", "nan"], "--lr nan is impossible"),
        (["--warmup-steps", "-5"], "--warmup-steps -5 is impossible (it must be 0 or more)"),
        (["--batch-size", "0"], "--batch-size 0 is impossible (it must be at least 1)"),
        (["--micro-batch-size", "0"], "--micro-batch-size 0 is impossible"),  # was taken as "unset"
        (["--seq-len", "0"], "--seq-len 0 is impossible (it must be at least 1)"),
        (["--dropout", "1.5"], "--dropout 1.5 is impossible (it must be a probability in [0, 1))"),
        (["--dropout", "-0.1"], "--dropout -0.1 is impossible"),
        (["--weight-decay", "-1"], "--weight-decay -1.0 is impossible"),
        (["--beta1", "1"], "--beta1 1.0 is impossible (it must be in [0, 1))"),
        (["--eps", "0"], "--eps 0.0 is impossible"),
        (["--grad-clip", "-1"], "--grad-clip -1.0 is impossible"),
        (["--epochs", "0"], "--epochs 0.0 is impossible"),
        (["--epochs", "inf"], "--epochs inf is impossible"),
        (["--max-steps", "0"], "--max-steps 0 is impossible (it must be at least 1 (leave it unset for no cap))"),
        (["--max-tokens", "-3"], "--max-tokens -3 is impossible"),
        (["--seed", "-1"], "--seed -1 is impossible"),
        (["--save-every", "-1"], "--save-every -1 is impossible"),
        (["--keep-last", "-2"], "--keep-last -2 is impossible"),
        (["--eval-batches", "0"], "--eval-batches 0 is impossible"),
        (["--n-layer", "0"], "--n-layer 0 is impossible (it must be at least 1)"),
    ],
)
def test_impossible_numbers_are_one_line_and_create_nothing(corpus, tmp_path, capsys, flags, named):
    out = tmp_path / "run"
    res = gpt1(["pretrain", "--data", str(corpus), "--out", str(out), *TINY_ARGS, "--max-steps", "2", *flags], capsys)
    assert_one_line_error(res, named, alone=True)
    assert not out.exists()


def test_every_impossible_number_is_caught_by_the_library_too(corpus, tmp_path):
    for kw in (
        {"lr": -1e-3},
        {"warmup_steps": -1},
        {"max_steps": 0},
        {"beta2": 1.5},
        {"log_every": -1},
        {"peak_flops": 0.0},
        {"model": {"attn_pdrop": 1.0}},
    ):
        with pytest.raises(GPT1Error, match="is impossible"):
            check_pretrain(tiny_config(corpus, tmp_path / "run", **kw), world_size=1)
    check_pretrain(
        tiny_config(
            corpus, tmp_path / "run", warmup_steps=0, grad_clip=0.0, keep_last=0, seed=0, model={"embd_pdrop": 0.0}
        ),
        world_size=1,
    )
    assert not (tmp_path / "run").exists()


def test_max_steps_one_is_one_update(corpus, tmp_path):
    assert pretrain(tiny_config(corpus, tmp_path / "run", max_steps=1)).step == 1


def _out_of_range_corpus(directory):
    """A byte corpus (ids < 256) whose second training shard holds id 1000 — as a damaged shard or
    one written with another tokenizer would. Its manifest checksums match: only the ids are wrong."""
    rng = np.random.default_rng(0)
    bad = rng.integers(0, 256, 1500)
    bad[700] = 1000
    return write_corpus(
        directory, {"train": [[rng.integers(0, 256, 1500)], [bad]], "val": [[rng.integers(0, 256, 600)]]}
    )


@pytest.mark.parametrize("verify", [[], ["--no-verify"]])
def test_out_of_range_token_ids_are_one_line_and_leave_no_run(tmp_path, capsys, verify):
    data = _out_of_range_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    res = gpt1(["pretrain", "--data", str(data), "--out", str(out), *TINY_ARGS, "--max-steps", "2", *verify], capsys)
    assert_one_line_error(
        res, f"{data}/train-00001.arrow: holds token id 1000", "vocabulary of 256 ids", "gpt1 inspect", alone=True
    )
    assert not out.exists()


def test_a_damaged_shard_with_no_verify_is_one_line(corpus, tmp_path, capsys):
    # The issue's own case: bytes flipped in a shard's token data, checksums skipped.
    import shutil

    data = tmp_path / "corpus"
    shutil.copytree(corpus, data)
    shard = data / "train-00000.arrow"
    raw = bytearray(shard.read_bytes())
    raw[600:640] = b"\xff" * 40  # inside the uint16 ids: 0xffff, far outside 256
    shard.write_bytes(bytes(raw))
    out = tmp_path / "run"
    res = gpt1(
        ["pretrain", "--data", str(data), "--out", str(out), *TINY_ARGS, "--max-steps", "2", "--no-verify"], capsys
    )
    assert_one_line_error(res, "train-00000.arrow: holds token id 65535", alone=True)
    assert not out.exists()
    res = gpt1(["pretrain", "--data", str(data), "--out", str(out), *TINY_ARGS, "--max-steps", "2"], capsys)
    assert_one_line_error(res, "train-00000.arrow: checksum mismatch", alone=True)
    assert not out.exists()


def test_eval_on_out_of_range_ids_is_one_line(corpus, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config(corpus, run, max_steps=1))
    data = _out_of_range_corpus(tmp_path / "bad")
    # The ids sit in the train split: scoring it must not reach the embedding with id 1000.
    with pytest.raises(GPT1Error, match="holds token id 1000"):
        corpus_perplexity([run], data, "train", device="cpu", verify=False)
    assert json.loads((data / "manifest.json").read_text())["shards"]  # untouched


def test_flip_byte_helper_really_damages(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"abc" * 40)
    flip_byte(f)
    assert f.read_bytes() != b"abc" * 40
