"""``--kernels auto|reference`` (and ``GPT1_KERNELS``) on every command that runs the model: shown in --help,
carried by the config, applied when the run starts, refused in one line when unknown."""

from __future__ import annotations

import pytest
from error_lines import gpt1
from help_panels import help_panels, option_row

from gptcli.model import kernels

COMMANDS = ("quickstart", "pretrain", "finetune", "eval", "zeroshot", "generate")


def test_the_option_reads_the_environment_variable_of_the_switch() -> None:
    from gptcli.commands.options import FIELD_ENVVARS

    assert FIELD_ENVVARS["kernels"] == kernels.ENV


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_that_runs_the_model_has_the_switch(capsys, monkeypatch, command: str) -> None:
    row = option_row(help_panels(capsys, monkeypatch, command)["Runtime"], "--kernels")
    assert "reference = plain PyTorch everywhere" in row
    assert "[env var: GPT1_KERNELS]" in row and "[default: auto]" in row


@pytest.fixture
def generation(monkeypatch) -> list:
    """`gpt1 generate` up to the library call, which records the config and stops."""
    import gptcli.pipelines.generate as pipeline

    configs: list = []

    def stop(cfg, progress=None):
        configs.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(pipeline, "start_generation", stop)
    return configs


@pytest.mark.parametrize(
    "args, env, want",
    [
        ((), None, "auto"),
        (("--kernels", "reference"), None, "reference"),
        ((), "reference", "reference"),
        (("--kernels", "auto"), "reference", "auto"),  # the command line wins over the environment
    ],
)
def test_the_config_takes_the_option_or_the_environment(generation, monkeypatch, args, env, want) -> None:
    if env is None:
        monkeypatch.delenv(kernels.ENV, raising=False)
    else:
        monkeypatch.setenv(kernels.ENV, env)
    assert gpt1(["generate", "-c", "ck", "-p", "x", *args]).code == 0
    assert generation[-1].kernels == want


def test_a_generation_computes_in_its_setting_and_leaves_the_callers(pretrained, monkeypatch) -> None:
    """Each step of the stream computes in the config's mode; the caller's code between the pieces, and after,
    runs in its own (start_generation used to set the process's mode for good)."""
    import gptcli.pipelines.generate as pipeline
    from gptcli.model.generate import GenerateConfig

    monkeypatch.delenv(kernels.ENV, raising=False)
    seen: list[str] = []
    real = pipeline.iter_generate

    def spy(*args, **kwargs):
        for token in real(*args, **kwargs):
            seen.append(kernels.mode())
            yield token

    monkeypatch.setattr(pipeline, "iter_generate", spy)
    gen = pipeline.start_generation(
        GenerateConfig(checkpoint=pretrained, prompt="the cat", max_new_tokens=3, kernels="reference", device="cpu")
    )
    assert kernels.mode() == "auto"
    between = [kernels.mode() for _ in gen.stream()]
    assert seen == ["reference"] * 3 and between == ["auto"] * 3 and kernels.mode() == "auto"
    cfg = GenerateConfig(
        checkpoint=pretrained, prompt="the cat", max_new_tokens=2, samples=2, kernels="reference", device="cpu"
    )
    batch = pipeline.iter_generate_batch

    def batch_spy(*args, **kwargs):
        for step in batch(*args, **kwargs):
            seen.append(kernels.mode())
            yield step

    monkeypatch.setattr(pipeline, "iter_generate_batch", batch_spy)
    seen.clear()
    pipeline.start_generation(cfg).sample_texts()
    assert seen == ["reference"] * 2 and kernels.mode() == "auto"


def test_an_unknown_mode_is_one_line_and_starts_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = gpt1(["pretrain", "--data", str(tmp_path / "corpus"), "--out", str(out), "--kernels", "fast"]).code
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == ["error: --kernels: expected one of auto, reference, got 'fast'"]
    assert not out.exists()


def test_a_resume_may_change_it() -> None:
    """How the run is computed, not what: pretraining takes a change silently (as device and precision), fine-tuning
    notes it (as device and precision); neither refuses it."""
    from gptcli.train.finetune_config import RULES as FINETUNE
    from gptcli.train.pretrain_config import RULES as PRETRAIN

    assert "kernels" in PRETRAIN.silent
    assert "kernels" in FINETUNE.adjustable


def test_a_pretraining_run_resumes_under_the_other_mode(tmp_path, capsys, monkeypatch) -> None:
    from corpus_helpers import random_corpus
    from run_helpers import TINY_ARGS

    import gptcli.train.pretrain as pretraining

    corpus, out = random_corpus(tmp_path / "corpus"), tmp_path / "run"
    assert gpt1(["pretrain", "--data", str(corpus), "--out", str(out), *TINY_ARGS, "--max-steps", "2"]).code == 0
    capsys.readouterr()
    seen: list[str] = []
    monkeypatch.setattr(pretraining, "prepare_kernels", lambda device, report: seen.append(kernels.mode()))
    code = gpt1(
        [
            "pretrain",
            "--data",
            str(corpus),
            "--out",
            str(out),
            *TINY_ARGS,
            "--max-steps",
            "3",
            "--resume",
            "--kernels",
            "reference",
        ]
    ).code
    assert code == 0, capsys.readouterr().err
    assert seen == ["reference"]  # the run computed in it
    assert 'kernels = "reference"' in (out / "config.toml").read_text()


def test_the_environment_is_a_default_under_a_config_file(generation, monkeypatch, tmp_path) -> None:
    """``GPT1_KERNELS`` sits under ``--config`` (and a resumed run's config.toml): the workers of a ``--procs``
    launch read the launcher's resolved settings from a file and must not be overridden by what they inherit."""
    monkeypatch.setenv(kernels.ENV, "reference")
    cfg = tmp_path / "run.toml"
    cfg.write_text('kernels = "auto"\n')
    assert gpt1(["generate", "-c", "ck", "-p", "x", "--config", str(cfg)]).code == 0
    assert generation[-1].kernels == "auto"
    assert gpt1(["generate", "-c", "ck", "-p", "x"]).code == 0
    assert generation[-1].kernels == "reference"
