"""`gpt1 prepare`: options derived from PrepareConfig (panels, defaults in --help, old spellings), the precedence
defaults < --config < command line, and one real run through the command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from error_lines import gpt1
from typer.testing import CliRunner

import gptcli.data.prepare as prep
from gptcli.cli import app, main
from gptcli.data.prepare import PrepareConfig, PrepareResult
from gptcli.errors import GPT1Error

runner = CliRunner()


def test_help_has_panels_and_derived_defaults(capsys):
    code, text, err = gpt1(["prepare", "--help"], capsys, env={"COLUMNS": "200"})
    assert code == 0, text + err
    for panel in ("Input", "Data", "Output", "Runtime"):
        assert re.search(rf"─ {panel} ─", text), f"no {panel} panel"
    for default in ("40478", "text", "0.01", "1000000", "67108864"):
        assert f"[default: {default}]" in text
    assert text.count("default: 40478") == 1  # derived once from the field, not also written into the help string
    for spelling in (
        "--out",
        "-o",
        "--workers",
        "-j",
        "--vocab-size",
        "--tokenizer",
        "--cased",
        "--text-field",
        "--strip-gutenberg",
        "--val-fraction",
        "--seed",
        "--sample-lines",
        "--shard-tokens",
        "--strict",
        "--overwrite",
        "--config",
        "--inspect",
    ):
        assert re.search(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", text), spelling


@pytest.fixture
def captured(monkeypatch):
    """Replace the pipeline by a recorder of the config the command resolved."""
    seen: list[PrepareConfig] = []

    def fake(cfg, progress=None, given=None):
        seen.append(cfg)
        manifest = {
            "shards": [],
            "splits": {},
            "tokenizer": {"vocab_size": cfg.vocab_size, "learned": True},
            "dtype": "uint16",
            "settings": {"workers": cfg.workers},
            "warnings": [],
        }
        return PrepareResult(Path(cfg.out), manifest)

    monkeypatch.setattr(prep, "prepare", fake)
    return seen


def _run(args: list[str]):
    return runner.invoke(app, ["prepare", *args], env={"COLUMNS": "200"})


def test_old_short_spellings_still_parse(captured, tmp_path):
    r = _run(
        [
            "a.txt",
            "b.txt",
            "-o",
            str(tmp_path / "c"),
            "-j",
            "3",
            "--cased",
            "--strict",
            "--overwrite",
            "--strip-gutenberg",
            "--vocab-size",
            "100",
            "--text-field",
            "body",
            "--val-fraction",
            "0.2",
            "--seed",
            "7",
            "--sample-lines",
            "50",
            "--shard-tokens",
            "1000",
        ]
    )
    assert r.exit_code == 0, r.output
    cfg = captured[-1]
    assert cfg.inputs == ["a.txt", "b.txt"] and cfg.out == tmp_path / "c" and cfg.workers == 3
    assert cfg.cased and cfg.strict and cfg.overwrite and cfg.strip_gutenberg
    assert (cfg.vocab_size, cfg.text_field, cfg.val_fraction, cfg.seed, cfg.sample_lines, cfg.shard_tokens) == (
        100,
        "body",
        0.2,
        7,
        50,
        1000,
    )
    r = _run(["a.txt", "--out", str(tmp_path / "d"), "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert captured[-1].workers == 2 and captured[-1] == PrepareConfig(inputs=["a.txt"], out=tmp_path / "d", workers=2)


def test_config_file_then_command_line(captured, tmp_path):
    cfg_file = tmp_path / "prep.toml"
    cfg_file.write_text(
        'inputs = ["x.txt", "y.txt"]\nvocab_size = 40\nseed = 1\nworkers = 2\ncased = true\nval_fraction = 0.5\n'
    )
    r = _run(["--config", str(cfg_file), "-o", str(tmp_path / "c"), "--seed", "3", "--workers", "0"])
    assert r.exit_code == 0, r.output
    cfg = captured[-1]
    assert cfg.inputs == ["x.txt", "y.txt"] and cfg.vocab_size == 40 and cfg.cased and cfg.val_fraction == 0.5
    assert cfg.seed == 3  # typed on the command line: wins over the file
    assert cfg.workers == 0  # also when the typed value equals the default
    assert cfg.text_field == "text" and cfg.shard_tokens == 1 << 26  # neither given: the defaults
    r = _run(["z.txt", "--config", str(cfg_file), "-o", str(tmp_path / "c"), "--no-cased"])
    assert r.exit_code == 0, r.output
    assert captured[-1].inputs == ["z.txt"] and captured[-1].cased is False and captured[-1].seed == 1


def test_no_inputs_is_a_one_line_error(captured, tmp_path):
    r = _run(["-o", str(tmp_path / "c")])
    assert isinstance(r.exception, GPT1Error) and "no inputs" in str(r.exception)
    assert captured == []


def test_command_runs_the_pipeline_and_prints_the_summary(tmp_path, capsys):
    for i, text in enumerate(("The first document.\nTwo lines.\n", "A second, shorter one.\n")):
        (tmp_path / f"d{i}.txt").write_text(text)
    out = tmp_path / "corpus"
    with pytest.raises(SystemExit) as e:
        main(
            [
                "prepare",
                str(tmp_path / "d0.txt"),
                str(tmp_path / "d1.txt"),
                "-o",
                str(out),
                "-j",
                "1",
                "--vocab-size",
                "40",
                "--val-fraction",
                "0.5",
            ]
        )
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # Rich wraps long lines at the console width
    assert text.startswith("prepared ") and "bytes/token" in text and "with 1 workers" in text
    assert (out / "manifest.json").is_file()
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--inspect", str(out)])
    assert e.value.code == 0 and "all 2 shard checksums match" in capsys.readouterr().out
