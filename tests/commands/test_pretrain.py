"""`gpt1 pretrain`'s command line: options derived from PretrainConfig, grouped in panels with their defaults, old
spellings, and the precedence defaults < --config FILE < options typed on the command line."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from corpus_helpers import random_corpus
from error_lines import Outcome, assert_one_line_error, gpt1

from gptcli.commands.pretrain import OPTIONS
from gptcli.config import read_config_file
from gptcli.train.pretrain import PretrainConfig

PANELS = (
    "Input",
    "Model",
    "Optimisation",
    "Schedule",
    "Evaluation",
    "Checkpointing",
    "Distributed",
    "Runtime",
    "Output",
)
TINY = [
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
    "--seq-len",
    "16",
    "--batch-size",
    "4",
    "--warmup-steps",
    "1",
    "--eval-batches",
    "1",
    "--device",
    "cpu",
    "--precision",
    "fp32",
    "--peak-flops",
    "1e11",
    "--quiet",
]


def _panels(text: str) -> dict[str, str]:
    """``{panel title: its rows}`` of a Rich --help screen."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    panels: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        head = re.match(r"\s*╭─ (.+?) ─", line)
        if head:
            title = head.group(1)
            panels[title] = ""
        elif line.strip().startswith("╰"):
            title = None
        elif title is not None:
            panels[title] += line + "\n"
    return panels


@pytest.fixture(scope="module")
def help_panels() -> dict[str, str]:
    import typer.rich_utils
    from typer.testing import CliRunner

    from gptcli.cli import app

    # One row per option: wide enough that Rich does not wrap flags and defaults across lines.
    old = typer.rich_utils.MAX_WIDTH
    typer.rich_utils.MAX_WIDTH = 400
    try:
        result = CliRunner().invoke(app, ["pretrain", "--help"])
    finally:
        typer.rich_utils.MAX_WIDTH = old
    assert result.exit_code == 0, result.output
    return _panels(result.output)


def test_help_groups_options_in_panels_with_defaults(help_panels):
    assert [p for p in help_panels if p != "Options"] == list(PANELS)  # in options.PANELS order
    assert "[default: 0.00025]" in _row(help_panels["Optimisation"], "--lr")
    assert "[default: 2000]" in _row(help_panels["Schedule"], "--warmup-steps")
    assert "[default: cosine]" in _row(help_panels["Schedule"], "--schedule")
    assert "[default: from the preset]" in _row(help_panels["Model"], "--n-layer")
    assert "[default: 1000]" in _row(help_panels["Evaluation"], "--eval-every")
    assert "[default: 3]" in _row(help_panels["Checkpointing"], "--keep-last")
    assert "[default: 29500]" in _row(help_panels["Distributed"], "--master-port")
    assert "[default: auto]" in _row(help_panels["Runtime"], "--precision")
    assert "[default: 10]" in _row(help_panels["Output"], "--log-every")
    assert "[default: verify]" in _row(help_panels["Input"], "--verify")


def test_every_setting_is_an_option_in_a_named_panel(help_panels):
    named = "".join(text for title, text in help_panels.items() if title != "Options")
    for f in dataclasses.fields(PretrainConfig):
        if f.name == "model":  # a table: its common fields are --n-layer ... (checked above), the rest config-only
            continue
        flag = "--verify" if f.name == "verify_data" else "--" + f.name.replace("_", "-")
        assert re.search(re.escape(flag) + r"\b", named), f"{flag} is in no panel"
    assert help_panels.get("Options", "").count("--") <= 1  # only --help is left outside the panels


def test_flags_show_no_type(help_panels):
    # On/off options read as --x/--no-x, never as an option that takes a <bool> value (Typer's own --help aside).
    for title, text in help_panels.items():
        rows = [r for r in text.splitlines() if "<bool>" in r and "--help" not in r]
        assert not rows, (title, rows)
    assert "--no-verify" in _row(help_panels["Input"], "--verify")
    assert "--no-tensorboard" in _row(help_panels["Output"], "--tensorboard")


def _row(panel: str, flag: str) -> str:
    rows = [r for r in panel.splitlines() if re.search(r"│\s*" + re.escape(flag) + r"\b", r)]
    assert rows, f"{flag} not found in\n{panel}"
    return rows[0]


def _parse(args: list[str]):
    """The Parsed that `gpt1 pretrain ARGS` hands its body (nothing runs)."""
    import typer
    from typer.testing import CliRunner

    seen = []
    app = typer.Typer()
    app.command()(OPTIONS.command(seen.append))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_old_spellings_parse():
    p = _parse(
        [
            "--data",
            "c",
            "--out",
            "r",
            "--procs",
            "2",
            "--nodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "node0",
            "--master-port",
            "1234",
            "--rdzv-endpoint",
            "node0:29400",
            "--dropout",
            "0.2",
            "-q",
            "--n-layer",
            "3",
            "--n-ctx",
            "64",
            "--compile",
            "--tensorboard",
            "--resume",
            "--lr",
            "1e-3",
        ]
    )
    launch = p.sections["launch"]
    assert (
        launch.procs,
        launch.nodes,
        launch.node_rank,
        launch.master_addr,
        launch.master_port,
        launch.rdzv_endpoint,
    ) == (2, 2, 1, "node0", 1234, "node0:29400")
    assert p.cli["dropout"] == 0.2 and p.cli["quiet"] is True
    assert p.given["model"] == {"n_layer": 3, "n_ctx": 64}
    assert p.given["compile"] is True and p.given["tensorboard"] is True and p.given["resume"] is True
    assert p.given["lr"] == 1e-3 and p.given["data"] == Path("c")
    assert _parse(["--gpus", "4", "--quiet"]).sections["launch"].gpus == 4
    for flag, value in (
        ("--verify", True),
        ("--no-verify", False),
        ("--verify-data", True),
        ("--no-verify-data", False),
    ):
        assert _parse([flag]).given["verify_data"] is value, flag
    assert "verify_data" not in _parse([]).given  # not typed: a config file's value stays


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return random_corpus(tmp_path_factory.mktemp("corpus"), train_tokens=(600,), val_tokens=100)


def test_config_file_is_kept_unless_an_option_is_typed(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tmp_path / "my.toml"
    cfg.write_text(
        f'data = "{corpus}"\nout = "{run}"\nmax_steps = 3\nlr = 0.001\nwarmup_steps = 1\nseed = 7\n'
        'schedule = "linear"\nkeep_last = 1\n\n[model]\nn_embd = 32\nn_layer = 2\n',
        encoding="utf-8",
    )
    # Typed options win even when they spell the default (--lr 0.00025); --n-layer merges into the [model] table.
    args = ["pretrain", "--config", str(cfg), *TINY, "--max-steps", "2", "--lr", "0.00025", "--n-layer", "1"]
    code, _, err = gpt1(args, capsys)
    assert code == 0, err
    saved = read_config_file(run / "config.toml")
    assert saved["max_steps"] == 2 and saved["lr"] == 0.00025  # typed
    assert saved["seed"] == 7 and saved["schedule"] == "linear" and saved["keep_last"] == 1  # from the file
    assert saved["model"]["n_layer"] == 1 and saved["model"]["n_embd"] == 32
    assert saved["data"] == str(corpus) and saved["resume"] is False


def test_verify_and_no_verify_both_run(corpus, tmp_path, capsys):
    for flag in ("--verify", "--no-verify"):
        run = tmp_path / flag.strip("-")
        code, _, err = gpt1(
            ["pretrain", "--data", str(corpus), "--out", str(run), *TINY, "--max-steps", "1", flag], capsys
        )
        assert code == 0, err
        assert read_config_file(run / "config.toml")["verify_data"] is (flag == "--verify")


def test_launcher_verifies_shards_before_starting_workers(corpus, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    shard = next(bad.glob("train-*.arrow"))
    raw = bytearray(shard.read_bytes())
    raw[-50] ^= 0xFF
    shard.write_bytes(bytes(raw))
    code, _, err = gpt1(["pretrain", "--data", str(bad), "--out", str(tmp_path / "r"), *TINY, "--procs", "2"], capsys)
    assert code == 1 and f"{shard.name}: checksum mismatch" in err
    assert not (tmp_path / "r").exists()  # refused before any worker started


def test_missing_data_and_out_are_one_line_errors(tmp_path, capsys, monkeypatch):
    """No --data: ./corpus (what `gpt1 prepare` writes) when it is there, else one line; a resume names its run.
    (The defaults themselves: tests/commands/test_defaults.py.)"""
    monkeypatch.chdir(tmp_path)
    code, _, err = gpt1(["pretrain", "--out", str(tmp_path / "r")], capsys)
    assert code == 1 and "--data is required: there is no ./corpus here" in err and "gpt1 prepare" in err
    code, _, err = gpt1(["pretrain", "--data", str(tmp_path), "--resume"], capsys)
    assert code == 1 and "--resume needs --out RUN" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was made


@pytest.mark.parametrize(
    "setting", ['seq_len = "abc"', "seq_lenn = 64", "lr = -1.0", 'kernels = "bogus"', '[model]\nn_layer = "x"']
)
def test_a_bad_setting_is_the_only_line_when_the_defaults_were_chosen(setting, corpus, tmp_path, capsys, monkeypatch):
    """No --data and no --out: ./corpus and runs/pretrain are said once the settings are valid, so a bad --config
    file is one line, not the defaults' notes above an error."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(corpus, tmp_path / "corpus")
    (tmp_path / "bad.toml").write_text(setting + "\n", encoding="utf-8")
    assert_one_line_error(Outcome(*gpt1(["pretrain", "--config", "bad.toml"], capsys)), alone=True)
    assert not (tmp_path / "runs").exists()


def test_a_mistyped_model_table_is_one_line_naming_the_file(corpus, tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    for line, message in (
        ('n_layer = "x"', "model.n_layer: expected an integer, got 'x'"),
        ("n_layer = true", "model.n_layer: expected an integer, got True"),
    ):
        cfg.write_text(f'data = "{corpus}"\nout = "{tmp_path / "run"}"\n\n[model]\n{line}\n', encoding="utf-8")
        code, _, err = gpt1(["pretrain", "--config", str(cfg), *TINY[:1], "tiny", "--max-steps", "1"], capsys)
        assert code == 1 and err.strip() == f"error: {cfg}: {message}", err
    assert not (tmp_path / "run").exists()


def test_a_launch_stopped_before_its_first_checkpoint_does_not_advise_a_resume(corpus, tmp_path, capsys, monkeypatch):
    """ "Continue with: gpt1 pretrain --out RUN --resume" after a stop in start-up started another run: with no
    run there, the short form took ./corpus and the paper's model at 64 × 512."""
    import gptcli.train.distributed as distributed

    monkeypatch.setattr(distributed, "launch_command", lambda *a, **k: "SIGINT")
    code, _, err = gpt1(
        ["pretrain", "--data", str(corpus), "--out", str(tmp_path / "r"), *TINY, "--procs", "2"], capsys
    )
    assert code == 130 and "before the first checkpoint: nothing to resume" in err and "--resume" not in err
