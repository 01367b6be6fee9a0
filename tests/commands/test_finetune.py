"""`gpt1 finetune`: options generated from FinetuneConfig (panels, defaults, old spellings, --config precedence),
--list-tasks, and a real run through the command line."""

from __future__ import annotations

import pytest
from error_lines import gpt1
from typer.testing import CliRunner

from gptcli.cli import app
from gptcli.errors import GPT1Error
from gptcli.train.finetune import FinetuneConfig

WIDE = {"COLUMNS": "200"}


class Captured(Exception):
    def __init__(self, config: FinetuneConfig, progress) -> None:
        self.config, self.progress = config, progress


@pytest.fixture
def capture(monkeypatch):
    """Replace the library's finetune with one that stops with the config the command built."""
    import gptcli.train.finetune as ft

    def fake(config, progress=None, parallel=None):
        raise Captured(config, progress)

    monkeypatch.setattr(ft, "finetune", fake)
    # Nor is data looked for or fetched (the names here are made up; tests/interop/test_hub.py runs the real thing).
    monkeypatch.setattr("gptcli.commands.defaults.task_data", lambda *a, **k: None)

    def run(*args: str) -> Captured:
        r = CliRunner().invoke(app, ["finetune", *args])
        assert isinstance(r.exception, Captured), r.output
        return r.exception

    return run


def test_help_groups_options_in_panels_with_defaults(capsys):
    code, text, err = gpt1(["finetune", "--help"], capsys, env=WIDE)
    assert code == 0, text + err
    for panel in (
        "Input",
        "Model",
        "Data",
        "Optimisation",
        "Schedule",
        "Evaluation",
        "Checkpointing",
        "Runtime",
        "Output",
    ):
        assert f"─ {panel} " in text, panel
    # Panels appear in PANELS order.
    assert (
        text.index("─ Input ") < text.index("─ Optimisation ") < text.index("─ Evaluation ") < text.index("─ Output ")
    )
    for default in (
        "[default: 6.25e-05]",
        "[default: 32]",
        "[default: 0.002]",
        "[default: warmup_linear]",
        "[default: random]",
        "[default: 0.1]",
        "[default: 0.5]",
        "[default: best]",
        "[default: 42]",
        "[default: dev]",
    ):
        assert default in text, default
    for flag in (
        "--clf-dropout",
        "--list-tasks",
        "--init",
        "--data-dir",
        "--skip-bad-rows",
        "--no-skip-bad-rows",
        "--quiet",
        "--overwrite",
        "--transfer-layers",
        "--micro-batch-size",
        "--config",
        "--batching",
    ):
        assert flag in text, flag
    assert "Show a Rich progress bar" not in text  # a display choice is no longer a config field


def test_old_spellings_parse(capture):
    c = capture(
        "--task",
        "rte",
        "--init",
        "pre",
        "--out",
        "o",
        "--clf-dropout",
        "0.2",
        "--data-dir",
        "d",
        "--skip-bad-rows",
        "--lm-weight",
        "0",
        "--transfer-layers",
        "1",
        "--schedule",
        "cosine",
        "--eval-split",
        "",
        "-q",
    )
    cfg = c.config
    assert (cfg.task, cfg.init, cfg.out, cfg.data_dir) == ("rte", "pre", "o", "d")
    assert cfg.clf_pdrop == 0.2 and cfg.skip_bad_rows and cfg.lm_weight == 0.0 and cfg.transfer_layers == 1
    assert cfg.schedule == "cosine" and cfg.eval_split == ""
    assert type(c.progress).__name__ == "WarningsOnly"  # --quiet: nothing rendered but warnings
    c = capture("--task", "rte", "--init", "pre", "--out", "o", "--clf-pdrop", "0.3", "--no-skip-bad-rows")
    assert c.config.clf_pdrop == 0.3 and not c.config.skip_bad_rows
    assert type(c.progress).__name__ == "RichProgress"


def test_config_file_precedence(capture, tmp_path):
    """dataclass defaults < --config FILE < options typed on the command line (even when equal to the default)."""
    f = tmp_path / "ft.toml"
    f.write_text('task = "sst2"\ninit = "pre"\nout = "o"\nlr = 0.001\nbatch_size = 8\nepochs = 5\n')
    cfg = capture("--config", str(f), "--lr", "0.002", "--epochs", "3").config
    assert cfg.task == "sst2" and cfg.batch_size == 8  # from the file
    assert cfg.lr == 0.002 and cfg.epochs == 3  # typed: wins, also at the default value
    assert cfg.warmup == FinetuneConfig.warmup  # neither: the default


def test_config_saved_by_an_older_version_still_loads(capture, tmp_path):
    """Runs saved before `progress` left FinetuneConfig have `progress = true|false` in their config.toml."""
    f = tmp_path / "old.toml"
    f.write_text('task = "rte"\ninit = "pre"\nout = "o"\nprogress = false\n')
    c = capture("--config", str(f))
    assert c.config.task == "rte" and type(c.progress).__name__ == "WarningsOnly"
    f.write_text('task = "rte"\ninit = "pre"\nout = "o"\nprogress = true\n')
    assert type(capture("--config", str(f)).progress).__name__ == "RichProgress"


def test_required_settings_are_one_line_errors(tmp_path):
    """--init and --out have defaults (the released GPT-1, a fresh run directory: tests/interop/test_hub.py);
    the task has none, and a resume must name its run."""
    runner = CliRunner()
    r = runner.invoke(app, ["finetune", "--init", "pre", "--out", str(tmp_path / "x")])
    assert isinstance(r.exception, GPT1Error) and "--task is required" in str(r.exception)
    r = runner.invoke(app, ["finetune", "--task", "rte", "--init", "pre", "--resume"])
    assert isinstance(r.exception, GPT1Error) and "--resume needs --out RUN" in str(r.exception)
    r = runner.invoke(app, ["finetune", "--task", "bogus", "--out", str(tmp_path / "x")])
    assert isinstance(r.exception, GPT1Error) and "unknown task 'bogus'" in str(r.exception)  # before any download


def test_cli_finetune_and_list_tasks(pretrained, shared_data, tmp_path, capsys):
    from gptcli.config import from_dict, read_config_file

    code, out, err = gpt1(["finetune", "--list-tasks"], capsys, env=WIDE)
    output = out + err
    assert code == 0, output
    for name in ("sst2", "mnli-mm", "race-h", "storycloze", "stsb"):
        assert name in output
    assert "<s> premise $ hypothesis <e>" in output
    assert "<s> story $ ending <e>" in output and "<s> context question $ answer <e>" in output  # Story Cloze, RACE
    cfg = tmp_path / "ft.toml"
    cfg.write_text('lr = 0.001\nbatch_size = 8\nepochs = 1\ndevice = "cpu"\nprecision = "fp32"\n')
    code, out, err = gpt1(
        [
            "finetune",
            "--task",
            "rte",
            "--init",
            str(pretrained),
            "--out",
            str(tmp_path / "run"),
            "--data-dir",
            str(shared_data / "glue" / "RTE"),
            "--config",
            str(cfg),
            "--max-train-examples",
            "16",
            "--max-eval-examples",
            "8",
            "--lm-weight",
            "0",
            "-q",
        ],
        capsys,
    )
    output = out + err
    assert code == 0, output
    saved = (tmp_path / "run" / "config.toml").read_text()
    assert "lm_weight = 0.0" in saved and "lr = 0.001" in saved and "batch_size = 8" in saved
    again = from_dict(FinetuneConfig, read_config_file(tmp_path / "run" / "config.toml"))  # repeatable with --config
    assert again.lm_weight == 0.0 and again.task == "rte" and again.max_train_examples == 16
    assert "dev scores of the kept epoch" in output and "done" in output


def test_cli_shows_progress_and_epoch_scores(pretrained, shared_data, tmp_path, capsys):
    code, out, err = gpt1(
        [
            "finetune",
            "--task",
            "rte",
            "--init",
            str(pretrained),
            "--out",
            str(tmp_path / "run"),
            "--data-dir",
            str(shared_data / "glue" / "RTE"),
            "--max-train-examples",
            "16",
            "--max-eval-examples",
            "8",
            "--batch-size",
            "8",
            "--epochs",
            "2",
            "--lr",
            "1e-3",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ],
        capsys,
        env=WIDE,
    )
    output = out + err
    assert code == 0, output
    assert "epoch 1 (update 2): dev accuracy" in output and "epoch 2 (update 4): dev accuracy" in output


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_layout_shared_trains_story_cloze_and_a_resume_may_not_leave_it(
    kernels, pretrained, shared_data, tmp_path, capsys, monkeypatch
):
    """``--layout shared`` on the tiny preset: a Story Cloze run stopped after its first epoch (SIGINT at the dev
    score) resumes under the same layout, and a resume that switches to packed is refused by name (shared-prefix
    training shares dropout masks: it changes what the run computes, not only how)."""
    import json

    from run_helpers import signal_at_dev_score

    signal_at_dev_score(monkeypatch)
    run = tmp_path / "run"
    assert (
        gpt1(
            [
                "finetune",
                "--task",
                "storycloze",
                "--init",
                "none",
                "--model",
                "tiny",
                "--tokenizer",
                str(pretrained / "tokenizer"),
                "--out",
                str(run),
                "--data-dir",
                str(shared_data / "storycloze"),
                "--max-train-examples",
                "16",
                "--max-eval-examples",
                "8",
                "--batch-size",
                "8",
                "--epochs",
                "2",
                "--lr",
                "1e-3",
                "--device",
                "cpu",
                "--precision",
                "fp32",
                "--kernels",
                kernels,
                "--layout",
                "shared",
                "--log-every",
                "1",
                "-q",
            ]
        ).code
        == 130
    )
    assert 'layout = "shared"' in (run / "config.toml").read_text()
    capsys.readouterr()
    assert gpt1(["finetune", "--out", str(run), "--resume", "--layout", "packed", "-q"]).code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot resume with changed settings: layout shared → packed (these define the run" in err
    assert gpt1(["finetune", "--out", str(run), "--resume", "-q"]).code == 0
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 4 and len(results["history"]) == 2 and "accuracy" in results["scores"]
    train = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(r["lm_loss"] > 0 and r["clf_loss"] > 0 for r in train)  # finite: the log would hold NaN otherwise


def test_help_lists_the_shared_layout(capsys, monkeypatch):
    from help_panels import help_panels, option_row

    row = " ".join(
        option_row(
            next(p for p in help_panels(capsys, monkeypatch, "finetune").values() if "--layout" in p), "--layout"
        ).split()
    )
    assert "packed|padded|shared" in row and "deviation from the paper" in row and "[default: packed]" in row


@pytest.mark.parametrize("kept, note", [(2, True), (3, False)])
def test_a_best_epoch_is_shown_with_the_last_epochs_score(kept, note, tmp_path, capsys):
    """A best epoch is chosen on the dev examples it is scored on: the outcome says so and gives the last epoch's
    (unbiased) score; when the last epoch is the best there is nothing to add."""
    from rich.console import Console

    from gptcli.commands.finetune import show_outcome
    from gptcli.train.finetune import FinetuneResult

    results = {
        "task": "rte",
        "metric": "accuracy",
        "paper_score": 56.0,
        "scores": {"accuracy": 80.0},
        "epoch": kept,
        "select": "best",
        "last_scores": {"accuracy": 70.0},
        "config": {"epochs": 3},
        "steps": 9,
        "split": "dev",
    }
    console = Console(width=200, record=True)
    show_outcome(FinetuneResult(tmp_path, tmp_path / "final", results), console)
    said = console.export_text()
    expected = (
        "epoch 2 was kept as the best of 3 on these dev examples, so its score is optimistic; the last epoch "
        "scored accuracy 70.0 (--select last keeps it)"
    )
    assert (expected in said) is note
