"""`gpt1 eval`: options generated from EvalConfig (panels, defaults, old spellings, --config precedence), dispatch
between perplexity and task metrics, and the combined task table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_lines import gpt1
from typer.testing import CliRunner

from gptcli.cli import app
from gptcli.errors import GPT1Error
from gptcli.eval.tasks import EvalConfig
from gptcli.train.finetune import FinetuneConfig, finetune

WIDE = {"COLUMNS": "200"}


def _finetune(pretrained: Path, out: Path, data: Path, **kw) -> None:
    base = dict(
        task="rte",
        init=str(pretrained),
        out=str(out),
        data_dir=str(data),
        max_train_examples=24,
        max_eval_examples=16,
        batch_size=8,
        epochs=1,
        lr=1e-3,
        device="cpu",
        precision="fp32",
    )
    finetune(FinetuneConfig(**{**base, **kw}))


class Captured(Exception):
    def __init__(self, config: EvalConfig) -> None:
        self.config = config


@pytest.fixture
def capture(monkeypatch):
    """`gpt1 eval ARGS` up to the library call: the EvalConfig the command built for task evaluation."""
    import gptcli.eval.tasks as te

    def fake(config, progress=None):
        raise Captured(config)

    monkeypatch.setattr(te, "evaluate_tasks", fake)
    monkeypatch.setattr(te, "is_finetuned", lambda path: True)

    def run(*args: str) -> EvalConfig:
        r = CliRunner().invoke(app, ["eval", *args])
        assert isinstance(r.exception, Captured), r.output
        return r.exception.config

    return run


def test_help_groups_options_in_panels_with_defaults(capsys):
    code, out, err = gpt1(["eval", "--help"], capsys, env=WIDE)
    assert code == 0, out + err
    for panel in ("Input", "Data", "Evaluation", "Runtime", "Output"):
        assert f"─ {panel} " in out, panel
    for default in ("[default: 8]", "[default: fp32]", "[default: auto]", "[default: verify]"):
        assert default in out, default
    for flag in (
        "--checkpoint",
        "--data",
        "--task",
        "--split",
        "--data-dir",
        "--out",
        "--skip-bad-rows",
        "--max-examples",
        "--batch-size",
        "--seq-len",
        "--max-batches",
        "--no-verify",
        "--config",
    ):
        assert flag in out, flag


def test_old_spellings_parse(capture):
    cfg = capture(
        "--checkpoint",
        "a",
        "--checkpoint",
        "b",
        "--task",
        "mnli,mnli-mm",
        "--task",
        "rte",
        "--split",
        "test",
        "--data-dir",
        "d",
        "--out",
        "o",
        "--skip-bad-rows",
        "--max-examples",
        "5",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--precision",
        "bf16",
    )
    assert cfg.checkpoint == ["a", "b"] and cfg.task == ["mnli,mnli-mm", "rte"]
    assert (cfg.split, cfg.data_dir, cfg.out) == ("test", "d", "o")
    assert cfg.skip_bad_rows and cfg.max_examples == 5 and cfg.batch_size == 4
    assert (cfg.device, cfg.precision) == ("cpu", "bf16")
    defaults = capture("--checkpoint", "a")
    assert defaults.batch_size == 8 and defaults.precision == "fp32" and defaults.split is None and defaults.task == []


def test_config_file_precedence(capture, tmp_path):
    f = tmp_path / "eval.toml"
    f.write_text('checkpoint = ["x", "y"]\nbatch_size = 16\nprecision = "bf16"\nmax_examples = 10\n')
    cfg = capture("--config", str(f), "--precision", "fp32")
    assert cfg.checkpoint == ["x", "y"] and cfg.batch_size == 16 and cfg.max_examples == 10  # from the file
    assert cfg.precision == "fp32"  # typed (at its default value): wins over the file
    assert capture("--config", str(f), "--checkpoint", "z").checkpoint == ["z"]


def test_cli_eval_dispatches_to_tasks(pretrained, shared_data, tmp_path, capsys):
    """`gpt1 eval` scores a fine-tuned run on its own task without --task, refuses ambiguity, and writes results."""
    _finetune(pretrained, tmp_path / "rte", shared_data / "glue" / "RTE")
    rte = str(shared_data / "glue" / "RTE")
    code, out, err = gpt1(
        ["eval", "--checkpoint", str(tmp_path / "rte"), "--data-dir", rte, "--max-examples", "8", "--device", "cpu"],
        capsys,
        env=WIDE,
    )
    output = out + err
    assert code == 0, output
    res = json.loads((tmp_path / "rte" / "eval" / "rte-dev" / "results.json").read_text())
    assert res["task"] == "rte" and res["n"] == 8
    assert "GPT-1 (paper)" in output and "rte · rte (dev)" in output
    # The refusals below are checked as the command raises them (before gpt1's main makes them one line).
    runner = CliRunner()
    # A pretrained (not fine-tuned) checkpoint with neither --data nor --task is a user error.
    r = runner.invoke(app, ["eval", "--checkpoint", str(pretrained)])
    assert isinstance(r.exception, GPT1Error) and "nothing to evaluate" in str(r.exception)
    # Beside a fine-tuned one (which knows its task), it is named: there is something to evaluate.
    r = runner.invoke(app, ["eval", "--checkpoint", str(tmp_path / "rte"), "--checkpoint", str(pretrained)])
    assert isinstance(r.exception, GPT1Error) and str(r.exception).startswith(f"{pretrained}: not fine-tuned")
    assert "(give --task T to score every checkpoint on T" in str(r.exception)
    r = runner.invoke(app, ["eval", "--checkpoint", str(tmp_path / "rte"), "--task", "rte", "--data", str(tmp_path)])
    assert isinstance(r.exception, GPT1Error) and "not both" in str(r.exception)
    r = runner.invoke(app, ["eval", "--task", "rte"])
    assert isinstance(r.exception, GPT1Error) and "--checkpoint" in str(r.exception)


def test_combined_table_of_several_runs(pretrained, shared_data, tmp_path):
    from rich.console import Console

    from gptcli.commands.evaluate import show_task_results
    from gptcli.eval.tasks import evaluate_tasks

    rte = shared_data / "glue" / "RTE"
    _finetune(pretrained, tmp_path / "rte", rte)
    _finetune(pretrained, tmp_path / "rte-nolm", rte, lm_weight=0.0)
    cfg = EvalConfig(
        checkpoint=[str(tmp_path / "rte"), str(tmp_path / "rte-nolm")],
        task=["rte"],
        split="dev",
        data_dir=str(rte),
        out=str(tmp_path / "evals"),
        device="cpu",
        max_examples=8,
    )
    results = evaluate_tasks(cfg)
    console = Console(record=True, width=200)
    show_task_results(results, console)
    text = console.export_text()
    assert "GPT-1 (paper)" in text and "56.0" in text and "no aux LM" in text
    assert [r["run"] for r in results] == ["rte", "rte-nolm"]
    assert (tmp_path / "evals" / "rte-nolm" / "rte-dev" / "results.json").is_file()
    # Beside ours, what always answering the training subset's majority label scores on the same 8 examples: the
    # row under the paper's and the column of the details table, both from results.json.
    for r in results:
        base = r["baseline"]
        assert base["source"] == "train" and sum(base["label_counts"].values()) == 24  # --max-train-examples
        lines = [json.loads(x) for x in Path(r["predictions"]).read_text().splitlines()]
        share = 100 * sum(x["label"] == base["majority_label"] for x in lines) / len(lines)
        assert base["majority"] == {"accuracy": share}
        assert r["prediction_counts"] == {
            lab: sum(x["prediction"] == lab for x in lines) for lab in ("entailment", "not_entailment")
        }
    level_rows = [line for line in text.splitlines() if line.startswith("│ majority ")]
    assert len(level_rows) == 1 and f"{results[0]['baseline']['majority']['accuracy']:.1f}" in level_rows[0]
    assert "┃ majority ┃" in text  # the details table's column


def test_same_run_names_stay_apart_and_data_dir_needs_one_task(pretrained, shared_data, tmp_path):
    from gptcli.eval.tasks import evaluate_tasks

    rte = shared_data / "glue" / "RTE"
    _finetune(pretrained, tmp_path / "a" / "run", rte)
    _finetune(pretrained, tmp_path / "b" / "run", rte)
    cfg = EvalConfig(
        checkpoint=[str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")],
        data_dir=str(rte),
        out=str(tmp_path / "evals"),
        device="cpu",
        max_examples=4,
    )
    assert [r["run"] for r in evaluate_tasks(cfg)] == ["run", "run#2"]
    assert (tmp_path / "evals" / "run#2" / "rte-dev" / "predictions.jsonl").is_file()
    with pytest.raises(GPT1Error, match="--data-dir names one task"):
        evaluate_tasks(EvalConfig(checkpoint=cfg.checkpoint, task=["rte,mrpc"], data_dir=str(rte)))
