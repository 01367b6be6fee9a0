"""`gpt1 convert`'s options: panels and defaults in --help, and every old spelling reaching ConvertConfig.

The conversion itself is replaced by a stand-in that keeps the config (real conversions: tests/interop/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from error_lines import gpt1
from help_panels import help_panels, option_row

from gptcli.interop.convert import ConvertConfig, ConvertResult


@pytest.fixture
def seen(monkeypatch) -> list[ConvertConfig]:
    import gptcli.interop.convert as conv

    configs: list[ConvertConfig] = []

    def fake(cfg: ConvertConfig) -> ConvertResult:
        cfg.check()
        configs.append(cfg)
        return ConvertResult(
            Path(cfg.out),
            "hf" if cfg.to_format else "gpt1",
            ["a warning"],
            conv.ModelConfig(vocab_size=10, n_ctx=8, n_embd=8, n_layer=1, n_head=2),
            1234,
        )

    monkeypatch.setattr(conv, "convert", fake)
    return configs


def test_help_groups_options_in_panels_with_defaults(capsys, monkeypatch):
    panels = help_panels(capsys, monkeypatch, "convert")
    assert {"Arguments", "Input", "Model", "Output"} <= set(panels)
    assert "src" in panels["Arguments"].lower()
    for flag in ("--from", "--to", "--tokenizer"):
        option_row(panels["Input"], flag)
    assert "[default: 12]" in option_row(panels["Model"], "--n-head")
    assert "-o" in option_row(panels["Output"], "--out")
    option_row(panels["Output"], "--overwrite")
    assert "--config" not in "".join(panels.values())  # a conversion is all on the command line


def test_old_spellings_parse(seen, tmp_path, capsys):
    src, tok = tmp_path / "release", tmp_path / "bpe"
    assert (
        gpt1(
            [
                "convert",
                "--from",
                "openai",
                str(src),
                "--out",
                str(tmp_path / "a"),
                "--n-head",
                "4",
                "--tokenizer",
                str(tok),
            ]
        ).code
        == 0
    )
    cfg = seen[-1]
    assert (cfg.src, cfg.from_format, cfg.to_format, cfg.out) == (str(src), "openai", None, tmp_path / "a")
    assert (cfg.n_head, cfg.tokenizer, cfg.overwrite) == (4, tok, False)
    err = capsys.readouterr().err
    assert "warning: a warning" in err and "wrote gpt1 checkpoint" in err and "1,234 parameters" in err

    (tmp_path / "b").mkdir()
    assert gpt1(["convert", "--to", "hf", str(src), "-o", str(tmp_path / "b"), "--overwrite"]).code == 0
    cfg = seen[-1]
    assert (cfg.to_format, cfg.from_format, cfg.out, cfg.overwrite, cfg.n_head) == (
        "hf",
        None,
        tmp_path / "b",
        True,
        12,
    )
    assert "wrote Hugging Face openai-gpt directory" in capsys.readouterr().err


def test_usage_errors_are_one_line(seen, tmp_path, capsys):
    assert gpt1(["convert", "--from", "hf", "--out", str(tmp_path / "x")]).code == 1
    assert "SRC is required" in capsys.readouterr().err
    assert gpt1(["convert", "--from", "hf", str(tmp_path)]).code == 1
    assert "--out is required" in capsys.readouterr().err
    assert gpt1(["convert", "--from", "hf", "--to", "hf", str(tmp_path), "--out", str(tmp_path / "x")]).code == 1
    assert "exactly one of --from" in capsys.readouterr().err
    assert not seen
