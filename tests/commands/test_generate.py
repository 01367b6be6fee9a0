"""`gpt1 generate`'s options: panels and defaults in --help, the old spellings, config-file precedence.

Generation is replaced by a stand-in that keeps the config and streams three fixed pieces (real generation:
tests/model/test_generate.py and tests/pipelines/test_generate.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from error_lines import gpt1
from help_panels import help_panels, option_row

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
    assert "-n" in option_row(sampling, "--max-new-tokens") and "[default: 64]" in option_row(
        sampling, "--max-new-tokens"
    )
    assert "--sample" in option_row(sampling, "--greedy") and "[default: sample]" in option_row(sampling, "--greedy")
    assert "-t" in option_row(sampling, "--temperature") and "[default: 1.0]" in option_row(sampling, "--temperature")
    assert "[default: 0]" in option_row(sampling, "--top-k")
    assert "[default: 1.0]" in option_row(sampling, "--top-p")
    option_row(sampling, "--seed")
    assert "--no-cache" in option_row(panels["Runtime"], "--cache")
    assert "[default: auto]" in option_row(panels["Runtime"], "--device")
    assert "--config" in panels["Input"]


def test_old_spellings_parse_and_stream(seen, capsys):
    assert (
        gpt1(
            [
                "generate",
                "-c",
                "ck",
                "-p",
                "Hello there",
                "-n",
                "5",
                "--greedy",
                "-t",
                "0.7",
                "--top-k",
                "3",
                "--top-p",
                "0.9",
                "--seed",
                "11",
                "--no-cache",
                "--device",
                "cpu",
            ]
        ).code
        == 0
    )
    cfg = seen[-1]
    assert (cfg.checkpoint, cfg.prompt, cfg.max_new_tokens, cfg.greedy) == (Path("ck"), "Hello there", 5, True)
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed) == (0.7, 3, 0.9, 11)
    assert (cfg.use_cache, cfg.device) == (False, "cpu")
    cap = capsys.readouterr()
    assert cap.out == "the prompt one two three\n"
    assert "3 tokens in 0.50 s" in cap.err and "greedy" in cap.err and "no cache" in cap.err
    assert gpt1(["generate", "--checkpoint", "ck", "--prompt", "x", "--sample", "--max-new-tokens", "2"]).code == 0
    cfg = seen[-1]
    assert (cfg.greedy, cfg.max_new_tokens, cfg.use_cache, cfg.device) == (False, 2, True, "auto")


def test_config_file_under_the_command_line(seen, tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('max_new_tokens = 3\ngreedy = true\ntop_k = 5\ncheckpoint = "from-file"\n')
    assert gpt1(["generate", "-p", "x", "--config", str(f), "--top-k", "0", "--sample"]).code == 0
    cfg = seen[-1]
    assert cfg.max_new_tokens == 3 and cfg.checkpoint == Path("from-file")  # from the file
    assert cfg.top_k == 0 and cfg.greedy is False  # typed: win over the file, also at their defaults
    assert cfg.temperature == 1.0  # neither: the default


def test_samples_option_prints_each_sample_under_a_header(monkeypatch, capsys, tmp_path):
    import gptcli.pipelines.generate as pipeline

    assert "[default: 1]" in option_row(help_panels(capsys, monkeypatch, "generate")["Sampling"], "--samples")

    class FakeBatch(FakeGeneration):
        rows = [[1, 2], [3, 4], [5, 6]]
        batches = 1

        def sample_texts(self, progress=None):
            return [" one", " two", " three"]

    configs: list[GenerateConfig] = []
    monkeypatch.setattr(pipeline, "start_generation", lambda cfg, progress=None: configs.append(cfg) or FakeBatch())
    assert gpt1(["generate", "-c", "ck", "-p", "x", "--samples", "3", "--seed", "1"]).code == 0
    assert configs[-1].samples == 3
    cap = capsys.readouterr()
    assert cap.out == (
        "--- sample 1/3 ---\nthe prompt one\n--- sample 2/3 ---\nthe prompt two\n--- sample 3/3 ---\nthe prompt three\n"
    )
    assert "6 tokens in 0.50 s" in cap.err and "3 samples as one batch" in cap.err
    (tmp_path / "s.toml").write_text("samples = 2\n")
    assert gpt1(["generate", "-c", "ck", "-p", "x", "--config", str(tmp_path / "s.toml")]).code == 0
    assert configs[-1].samples == 2


def test_samples_end_to_end(tmp_path, capsys):
    """A real tiny checkpoint: greedy samples all equal the single streamed continuation; --samples 0 is refused."""
    import torch
    from toy_tokenizer import ToyTokenizer

    from gptcli.checkpoint import save_checkpoint
    from gptcli.model.gpt import GPT, ModelConfig

    torch.manual_seed(4)
    model = GPT(ModelConfig(vocab_size=97, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32))
    save_checkpoint(tmp_path / "ck", model, ToyTokenizer(97))
    common = ("-c", str(tmp_path / "ck"), "-p", "a b c", "-n", "4", "--greedy", "--device", "cpu")
    assert gpt1(["generate", *common]).code == 0
    single = capsys.readouterr().out
    assert gpt1(["generate", *common, "--samples", "2"]).code == 0
    cap = capsys.readouterr()
    assert cap.out == f"--- sample 1/2 ---\n{single}--- sample 2/2 ---\n{single}"
    assert "8 tokens in" in cap.err
    assert gpt1(["generate", *common, "--samples", "0"]).code == 1
    assert "--samples 0 is impossible" in capsys.readouterr().err


def test_greedy_does_not_check_the_sampling_settings_it_ignores(tmp_path, capsys):
    """--help says --greedy ignores temperature, top_k, top_p and seed: they used to be refused all the same."""
    import torch
    from toy_tokenizer import ToyTokenizer

    from gptcli.checkpoint import save_checkpoint
    from gptcli.model.gpt import GPT, ModelConfig

    torch.manual_seed(4)
    save_checkpoint(
        tmp_path / "ck",
        GPT(ModelConfig(vocab_size=97, n_ctx=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)),
        ToyTokenizer(97),
    )
    common = ("-c", str(tmp_path / "ck"), "-p", "a b c", "-n", "3", "--device", "cpu")
    assert gpt1(["generate", *common, "--greedy"]).code == 0
    greedy = capsys.readouterr().out
    for ignored in (("--temperature", "0"), ("--top-p", "0"), ("--top-k", "-1"), ("--seed", "-5")):
        assert gpt1(["generate", *common, "--greedy", *ignored]).code == 0, ignored
        assert capsys.readouterr().out == greedy
    assert gpt1(["generate", *common, "--temperature", "0"]).code == 1  # sampling reads it: still refused
    assert "--temperature 0.0 is impossible" in capsys.readouterr().err
    settings = tmp_path / "sampling.toml"  # the file's temperature is ignored when --greedy is typed over it
    settings.write_text("temperature = 0.0\ntop_p = 0.0\n")
    assert gpt1(["generate", *common, "--config", str(settings), "--greedy"]).code == 0
    assert capsys.readouterr().out == greedy
    assert gpt1(["generate", *common, "--config", str(settings)]).code == 1
    assert "temperature" in capsys.readouterr().err
