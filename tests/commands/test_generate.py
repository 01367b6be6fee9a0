"""`gpt1 generate`'s options: panels and defaults in --help, the old spellings, config-file precedence.

Generation is replaced by a stand-in that keeps the config and streams three fixed pieces (real generation:
tests/model/test_generate.py and tests/pipelines/test_generate.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from help_panels import help_panels, option_row, run_cli

from gptcli.model.generate import GenerateConfig


class FakeGeneration:
    prompt_text = "the prompt"
    generated = [1, 2, 3]
    seconds = 0.5
    device = "cpu"

    def stream(self):
        yield from (" one", " two", " three")


@pytest.fixture
def seen(monkeypatch) -> list[GenerateConfig]:
    import gptcli.pipelines.generate as pipeline

    configs: list[GenerateConfig] = []

    def fake(cfg: GenerateConfig, progress=None) -> FakeGeneration:
        configs.append(cfg)
        return FakeGeneration()

    monkeypatch.setattr(pipeline, "start_generation", fake)
    return configs


def test_help_groups_options_in_panels_with_defaults(capsys, monkeypatch):
    panels = help_panels(capsys, monkeypatch, "generate")
    assert {"Input", "Sampling", "Runtime"} <= set(panels)
    assert "-c" in option_row(panels["Input"], "--checkpoint") and "-p" in option_row(panels["Input"], "--prompt")
    sampling = panels["Sampling"]
    assert "-n" in option_row(sampling, "--max-new-tokens") and "[default: 64]" in option_row(sampling, "--max-new-tokens")
    assert "--sample" in option_row(sampling, "--greedy") and "[default: sample]" in option_row(sampling, "--greedy")
    assert "-t" in option_row(sampling, "--temperature") and "[default: 1.0]" in option_row(sampling, "--temperature")
    assert "[default: 0]" in option_row(sampling, "--top-k")
    assert "[default: 1.0]" in option_row(sampling, "--top-p")
    option_row(sampling, "--seed")
    assert "--no-cache" in option_row(panels["Runtime"], "--cache")
    assert "[default: auto]" in option_row(panels["Runtime"], "--device")
    assert "--config" in panels["Input"]


def test_old_spellings_parse_and_stream(seen, capsys):
    assert run_cli("generate", "-c", "ck", "-p", "Hello there", "-n", "5", "--greedy", "-t", "0.7", "--top-k", "3",
                   "--top-p", "0.9", "--seed", "11", "--no-cache", "--device", "cpu") == 0
    cfg = seen[-1]
    assert (cfg.checkpoint, cfg.prompt, cfg.max_new_tokens, cfg.greedy) == (Path("ck"), "Hello there", 5, True)
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed) == (0.7, 3, 0.9, 11)
    assert (cfg.use_cache, cfg.device) == (False, "cpu")
    cap = capsys.readouterr()
    assert cap.out == "the prompt one two three\n"
    assert "3 tokens in 0.50 s" in cap.err and "greedy" in cap.err and "no cache" in cap.err
    assert run_cli("generate", "--checkpoint", "ck", "--prompt", "x", "--sample", "--max-new-tokens", "2") == 0
    cfg = seen[-1]
    assert (cfg.greedy, cfg.max_new_tokens, cfg.use_cache, cfg.device) == (False, 2, True, "auto")


def test_config_file_under_the_command_line(seen, tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('max_new_tokens = 3\ngreedy = true\ntop_k = 5\ncheckpoint = "from-file"\n')
    assert run_cli("generate", "-p", "x", "--config", str(f), "--top-k", "0", "--sample") == 0
    cfg = seen[-1]
    assert cfg.max_new_tokens == 3 and cfg.checkpoint == Path("from-file")  # from the file
    assert cfg.top_k == 0 and cfg.greedy is False  # typed: win over the file, also at their defaults
    assert cfg.temperature == 1.0  # neither: the default
