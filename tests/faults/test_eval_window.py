"""`gpt1 eval --data` scores a pretraining run at the window it trained at: a model trained on 8-token windows of a
16-token context used to be scored on 16-token windows by default, positions it never learned."""

from __future__ import annotations

import pytest

from tests.faults.conftest import TINY_ARGS, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")


def test_eval_defaults_to_the_run_s_window(corpus, tmp_path, capsys):
    from gptcli.eval.perplexity import corpus_perplexity, trained_seq_len

    run = tmp_path / "run"
    args = ["pretrain", "--data", corpus, "--out", run, "--max-steps", "2", *TINY_ARGS, "--seq-len", "8"]
    assert gpt1(args, capsys).code == 0
    (ckpt,) = (run / "checkpoints").iterdir()
    assert trained_seq_len(ckpt) == 8
    default, at8, at16 = (
        corpus_perplexity([run], corpus, seq_len=n, device="cpu", verify=False)[0].loss for n in (None, 8, 16)
    )
    assert default == at8 and default != at16
