"""Command lines that used to be misread: an empty model option (a shell variable never set) silently became the
Hub's default model, a stray positional argument got no hint toward the option it belongs to, and without the Hub
the data and the model failed one per round. Each is now one line that names the option to use."""

from __future__ import annotations

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import gpt1


@pytest.mark.parametrize(
    "args",
    (
        ["finetune", "--task", "rte", "--init", ""],
        ["finetune", "--task", "rte", "--tokenizer", " "],
        ["zeroshot", "--task", "sst2", "--checkpoint", ""],
        ["zeroshot", "--task", "sst2", "--checkpoint="],
        ["generate", "-c", "", "--prompt", "hi"],
        ["eval", "--checkpoint", "", "--task", "rte"],
    ),
    ids=("init", "tokenizer", "checkpoint", "checkpoint=", "-c", "eval"),
)
def test_an_empty_model_option_is_refused(args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT1_DATA", str(tmp_path))
    flag = next(a.partition("=")[0] for a in args if a.startswith("-") and a.partition("=")[0] != "--task")
    assert_one_line_error(gpt1(args, capsys), f"{flag} was given an empty value", f"leave {flag} out")


@pytest.mark.parametrize(
    "args, hint",
    (
        (["finetune", "rte"], "did you mean --task rte?"),
        (["generate", "Once upon a time"], "did you mean --prompt Once"),
        (["finetune", "--task", "rte", "runs/none"], "options are named: see gpt1 finetune --help"),
    ),
)
def test_a_stray_argument_gets_a_hint(args, hint, capsys):
    res = gpt1(args, capsys)
    assert res.code == 2 and "unexpected extra argument" in res.err and hint in res.err, res.err


def test_a_stray_directory_is_matched_to_its_option(corpus, run, capsys):
    assert "did you mean --data " in gpt1(["pretrain", corpus], capsys).err
    assert "did you mean --checkpoint " in gpt1(["zeroshot", run], capsys).err
    assert "did you mean --init " in gpt1(["finetune", "--task", "rte", run], capsys).err


@pytest.mark.parametrize("command, flag", (("finetune", "--init"), ("zeroshot", "--checkpoint")))
def test_without_the_hub_data_and_model_are_named_at_once(command, flag, tmp_path, capsys, monkeypatch):
    """Offline (the suite's Hugging Face cache is empty and HF_HUB_OFFLINE is set), with no task data: the one error
    says how to supply both, so that the user does not learn about the model only after fixing the data."""
    monkeypatch.delenv("GPT1_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # the default data root, ~/.cache/gpt1/data, is empty
    task = "rte" if command == "finetune" else "sst2"
    for extra in ([], ["--data-dir", tmp_path / "nowhere"]):
        res = gpt1([command, "--task", task, "--out", tmp_path / "run", *extra], capsys)
        assert_one_line_error(res, "--data-dir DIR", "GPT1_DATA", f"the model with {flag} CHECKPOINT")


@pytest.mark.parametrize("direction", (["--from", "hf"], ["--to", "hf"]))
def test_a_tokenizer_convert_would_not_read_is_refused(direction, run, tmp_path, capsys):
    """``--tokenizer`` is read by ``--from openai`` alone; with ``--from hf`` it used to be ignored without a word."""
    (tmp_path / "bpe").mkdir()
    args = ["convert", *direction, run, "--tokenizer", tmp_path / "bpe", "--out", tmp_path / "out"]
    assert_one_line_error(gpt1(args, capsys), "--tokenizer is read with --from openai only")
    assert not (tmp_path / "out").exists()
