"""gptcli/eval/tasks.py as a library: evaluate_task's settings (checked, and with `gpt1 eval`'s defaults), and
evaluate_tasks, `gpt1 eval` as one call (both modes; the kernels mode it leaves). The command's own tests are in
tests/commands/test_eval.py; scoring each kind of task, in tests/train/test_finetune.py."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from corpus_helpers import ByteTokenizer, random_corpus

from gptcli.errors import GPT1Error
from gptcli.eval.tasks import EvalConfig, evaluate_task, evaluate_tasks
from gptcli.model import kernels

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def finetuned(pretrained, shared_data, tmp_path_factory) -> Path:
    """A tiny RTE run (one epoch of 16 examples)."""
    from gptcli.train.finetune import FinetuneConfig, finetune

    out = tmp_path_factory.mktemp("ft") / "rte"
    finetune(
        FinetuneConfig(
            task="rte",
            init=str(pretrained),
            out=str(out),
            data_dir=str(shared_data / "glue" / "RTE"),
            max_train_examples=16,
            max_eval_examples=8,
            batch_size=8,
            epochs=1,
            device="cpu",
            precision="fp32",
            cache=False,
        )
    )
    return out


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"batch_size": 0}, "--batch-size 0 is impossible (it must be at least 1)"),  # was an endless loop
        ({"max_examples": 0}, "--max-examples 0 is impossible (it must be at least 1 (leave it unset for all))"),
        ({"seed": -1}, "--seed -1 is impossible"),
    ],
)
def test_evaluate_task_checks_its_settings_as_every_command_does(setting, message, tmp_path):
    """Refused in one line before anything is read (the checkpoint here does not even exist)."""
    with pytest.raises(GPT1Error, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        evaluate_task("rte", tmp_path / "no-such-run", out=tmp_path / "ev", **setting)
    assert not (tmp_path / "ev").exists()


def test_evaluate_task_has_the_commands_defaults_and_records_its_precision(
    finetuned, shared_data, tmp_path, monkeypatch
):
    """One home per default: EvalConfig's fields. evaluate_task's own (precision auto, batch size 64) gave bf16 logits
    on a CPU with avx512_bf16 where `gpt1 eval` computes in fp32; results.json says which precision ran."""
    from gptcli.system import runtime

    shared = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
    params = inspect.signature(evaluate_task).parameters
    for name in ("batch_size", "device", "precision", "skip_bad_rows", "max_examples", "verify", "layout"):
        assert params[name].default == shared[name], name
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)  # a CPU where "auto" means bf16
    r = evaluate_task(
        "rte", finetuned, data_dir=shared_data / "glue" / "RTE", out=tmp_path / "ev", device="cpu", max_examples=4
    )
    assert r["precision"] == "fp32"
    r = evaluate_task(
        "rte",
        finetuned,
        data_dir=shared_data / "glue" / "RTE",
        out=tmp_path / "ev",
        device="cpu",
        max_examples=4,
        precision="auto",
    )
    assert r["precision"] == "bf16"  # "auto" as resolved, not as asked


def test_evaluate_tasks_with_data_is_perplexity_on_the_corpus(tmp_path, monkeypatch):
    """`data` was ignored outside the command (a fine-tuned checkpoint was scored on its task instead). The
    perplexity computes in the config's kernels mode and leaves the caller's."""
    from gptcli.checkpoint import save_checkpoint
    from gptcli.eval.perplexity import corpus_perplexity
    from gptcli.model.gpt import GPT, ModelConfig

    corpus = random_corpus(tmp_path / "corpus")
    cfg = ModelConfig(vocab_size=256, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)
    ck = save_checkpoint(tmp_path / "ck", GPT(cfg), ByteTokenizer(), meta={"step": 3})
    monkeypatch.setenv(kernels.ENV, "reference")
    rows = evaluate_tasks(
        EvalConfig(checkpoint=[str(ck)], data=str(corpus), device="cpu", max_batches=1, kernels="auto")
    )
    assert [(r["run"], r["step"], r["split"], r["data"]) for r in rows] == [("ck", 3, "val", str(corpus))]
    assert rows[0]["tokens"] > 0 and rows[0]["perplexity"] > 1 and rows[0]["checkpoint"] == str(ck)
    assert kernels.mode() == "reference"
    assert corpus_perplexity([ck], corpus, device="cpu", max_batches=1, kernels="auto")[0].loss == rows[0]["loss"]
    assert kernels.mode() == "reference"
    with pytest.raises(GPT1Error, match=r"^give either --data \(perplexity\) or --task \(task metric\), not both$"):
        evaluate_tasks(EvalConfig(checkpoint=[str(ck)], data=str(corpus), task=["rte"]))
    with pytest.raises(GPT1Error, match="^nothing to evaluate: give --data CORPUS_DIR"):
        evaluate_tasks(EvalConfig(checkpoint=[str(ck)]))  # a language model, and neither data nor task


def test_evaluate_tasks_computes_in_its_mode_and_gives_the_callers_back(finetuned, shared_data, tmp_path, monkeypatch):
    import gptcli.eval.tasks as tasks

    monkeypatch.setenv(kernels.ENV, "reference")
    seen: list[str] = []
    real = tasks.predict
    monkeypatch.setattr(tasks, "predict", lambda *a, **k: (seen.append(kernels.mode()), real(*a, **k))[1])
    evaluate_tasks(
        EvalConfig(
            checkpoint=[str(finetuned)],
            data_dir=str(shared_data / "glue" / "RTE"),
            device="cpu",
            out=str(tmp_path / "ev"),
            max_examples=4,
            kernels="auto",
        )
    )
    assert seen == ["auto"] and kernels.mode() == "reference"  # was "auto" for the rest of the process
    evaluate_tasks(
        EvalConfig(
            checkpoint=[str(finetuned)],
            data_dir=str(shared_data / "glue" / "RTE"),
            device="cpu",
            out=str(tmp_path / "ev"),
            max_examples=4,
        )
    )
    assert seen == ["auto", "reference"]  # the config's default: the variable, which a library run now follows
