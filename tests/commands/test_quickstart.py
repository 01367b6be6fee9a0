"""`gpt1 quickstart`'s options: panels and defaults in --help, the old spellings, config-file precedence.

The pipeline itself is replaced by a stand-in that keeps the config it was given (a whole run is
tests/pipelines/test_quickstart.py's job).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from error_lines import gpt1
from help_panels import help_panels, option_row

from gptcli.pipelines.quickstart import QuickstartConfig, QuickstartResult


@pytest.fixture
def seen(monkeypatch) -> list[QuickstartConfig]:
    """Configs the command passed to quickstart(); the run and the final table are stubbed out."""
    import gptcli.commands.quickstart as command
    import gptcli.pipelines.quickstart as pipeline

    configs: list[QuickstartConfig] = []

    def fake(cfg, progress=None):
        configs.append(cfg)
        assert isinstance(progress, command.RichProgress)
        return QuickstartResult(Path(cfg.out), {"seconds_total": 0.0, "seed": cfg.seed}, {}, {})

    monkeypatch.setattr(pipeline, "quickstart", fake)
    monkeypatch.setattr(command, "render_summary", lambda console, result: None)
    return configs


def test_help_groups_options_in_panels_with_defaults(capsys, monkeypatch):
    panels = help_panels(capsys, monkeypatch, "quickstart")
    assert {"Input", "Data", "Optimisation", "Schedule", "Evaluation", "Runtime", "Output"} <= set(panels)
    assert "[default: 4.0]" in option_row(panels["Schedule"], "--minutes")
    assert "[default: runs/quickstart]" in option_row(panels["Output"], "--out")
    assert "--overwrite" in panels["Output"]
    assert "[default: 0]" in option_row(panels["Optimisation"], "--seed")
    assert "[default: auto]" in option_row(panels["Runtime"], "--device")
    assert "[default: auto]" in option_row(panels["Runtime"], "--precision")
    assert "[default: 0]" in option_row(panels["Runtime"], "--workers")
    assert "[default: 3000]" in option_row(panels["Data"], "--vocab-size")
    assert "--config" in panels["Input"]


def test_old_spellings_parse(seen, tmp_path):
    out = tmp_path / "qs"
    assert (
        gpt1(
            [
                "quickstart",
                "--out",
                str(out),
                "--minutes",
                "2.5",
                "--seed",
                "7",
                "--overwrite",
                "--device",
                "cpu",
                "--precision",
                "fp32",
                "--workers",
                "1",
            ]
        ).code
        == 0
    )
    cfg = seen[-1]
    assert (cfg.out, cfg.minutes, cfg.seed, cfg.overwrite) == (out, 2.5, 7, True)
    assert (cfg.device, cfg.precision, cfg.workers) == ("cpu", "fp32", 1)
    assert cfg.model == QuickstartConfig().model  # the model table stays a config-file setting


def test_config_file_under_the_command_line(seen, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out, runs/quickstart: here, not beside a user's real quickstart
    f = tmp_path / "qs.toml"
    f.write_text("minutes = 3.0\nseed = 9\nvocab_size = 500\noverwrite = true\n\n[model]\nn_layer = 1\n")
    assert gpt1(["quickstart", "--config", str(f), "--seed", "0", "--lr", "0.01"]).code == 0
    cfg = seen[-1]
    assert cfg.minutes == 3.0 and cfg.vocab_size == 500 and cfg.overwrite  # from the file
    assert cfg.seed == 0  # typed on the command line: wins, even where it equals the default
    assert cfg.lr == 0.01 and cfg.batch_size == QuickstartConfig.batch_size  # typed; default
    assert cfg.model == {"n_layer": 1}
    assert gpt1(["quickstart", "--config", str(f), "--no-overwrite"]).code == 0
    assert seen[-1].overwrite is False


def test_bad_config_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text("minuets = 3\n")
    assert gpt1(["quickstart", "--config", str(f)]).code == 1
    assert "minuets" in capsys.readouterr().err
