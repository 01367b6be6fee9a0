"""check_pretrain_launch: what a `gpt1 pretrain --procs N` launcher checks once and hands its workers."""

from __future__ import annotations

import dataclasses

import pytest
from corpus_helpers import random_corpus

from gptcli.errors import GPT1Error
from gptcli.train.distributed import LaunchSpec
from gptcli.train.pretrain import PretrainConfig, check_pretrain_launch


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return random_corpus(tmp_path_factory.mktemp("corpus"))


def _config(corpus, out, **kw) -> PretrainConfig:
    return PretrainConfig(
        data=corpus,
        out=out,
        preset="tiny",
        model={"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16},
        seq_len=16,
        batch_size=4,
        max_steps=2,
        device="cpu",
        **kw,
    )


def test_planning_says_whether_it_verified_the_shards_and_writes_nothing(corpus, tmp_path) -> None:
    cfg = _config(corpus, tmp_path / "run", kernels="reference")
    assert check_pretrain_launch(cfg, LaunchSpec(nproc_per_node=2)) is True
    assert check_pretrain_launch(dataclasses.replace(cfg, verify_data=False), LaunchSpec(nproc_per_node=2)) is False
    assert not (tmp_path / "run").exists()  # planning writes nothing


def test_what_cannot_run_is_refused_before_any_worker_starts(corpus, tmp_path) -> None:
    with pytest.raises(GPT1Error, match="not divisible by the 3 processes"):
        check_pretrain_launch(_config(corpus, tmp_path / "run"), LaunchSpec(nproc_per_node=3))
    with pytest.raises(GPT1Error, match="--kernels: expected one of auto, reference"):
        check_pretrain_launch(_config(corpus, tmp_path / "run", kernels="fast"), LaunchSpec(nproc_per_node=2))
    for verify in (True, False):  # refused once here, not by every worker after it started
        with pytest.raises(GPT1Error, match="--val-split nosuch: corpus .* has no such split"):
            check_pretrain_launch(
                _config(corpus, tmp_path / "run", val_split="nosuch", verify_data=verify), LaunchSpec(nproc_per_node=2)
            )
