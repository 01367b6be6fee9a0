"""`--compile-mode` (gptcli/train/compiled.py): its choices, its refusal without --compile, the mode reaching
torch.compile, gradients kept for CUDA graphs, and runs written before the setting existed.

torch.compile itself is replaced by a recorder that returns the function uncompiled: what is tested is what gpt1
asks of it, not inductor."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch
from corpus_helpers import random_corpus
from error_lines import gpt1

from gptcli.config import from_dict, read_config_file
from gptcli.errors import GPT1Error
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.progress import RecordingProgress
from gptcli.train.compiled import GRAPHED_MODES
from gptcli.train.pretrain import PretrainConfig, pretrain
from gptcli.train.pretrain_config import RULES, check_pretrain
from gptcli.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = ("default", "reduce-overhead", "max-autotune")
TINY = ["--preset", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--n-inner", "64", "--n-ctx", "16"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return random_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def compiles(monkeypatch) -> list[dict]:
    """torch.compile recorded (its keyword arguments per call), the function returned as it was. Each call of the
    returned function also records whether every parameter held a gradient when the loss was computed."""
    calls: list[dict] = []

    def record(fn, **kwargs):
        call = {"kwargs": kwargs, "grads_held": []}
        calls.append(call)

        def loss(model, batch):
            call["grads_held"].append(all(p.grad is not None for p in model.parameters()))
            return fn(model, batch)

        return loss

    monkeypatch.setattr(torch, "compile", record)
    return calls


def _cfg(data: Path, out: Path, **kw) -> PretrainConfig:
    base = dict(
        data=data,
        out=out,
        preset="tiny",
        model={"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16},
        seq_len=16,
        batch_size=8,
        micro_batch_size=4,
        max_steps=3,
        warmup_steps=1,
        eval_every=0,
        save_every=0,
        log_every=1,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    return PretrainConfig(**{**base, **kw})


def _losses(run: Path) -> list[float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["kind"] == "train"]


def test_the_modes_are_the_settings_choices_and_others_are_refused(tmp_path, capsys):
    assert typing.get_args(typing.get_type_hints(PretrainConfig)["compile_mode"]) == MODES
    assert PretrainConfig().compile_mode == "default"
    assert set(GRAPHED_MODES) < set(MODES)
    with pytest.raises(GPT1Error, match="compile_mode: expected one of"):
        from_dict(PretrainConfig, {"compile": True, "compile_mode": "fast"})
    code, _, err = gpt1(["pretrain", "--data", str(tmp_path), "--compile", "--compile-mode", "fast"], capsys)
    assert code == 2 and "'fast' is not one of 'default', 'reduce-overhead', 'max-autotune'" in err


def test_a_mode_without_compile_is_refused_in_one_line(corpus, tmp_path, capsys):
    check_pretrain(PretrainConfig(compile_mode="default"), None)  # the default needs no --compile
    with pytest.raises(GPT1Error, match=r"--compile-mode max-autotune takes effect only with --compile \(add"):
        check_pretrain(PretrainConfig(compile_mode="max-autotune"), None)
    args = ["pretrain", "--data", str(corpus), "--out", str(tmp_path / "r"), "--compile-mode", "reduce-overhead"]
    code, _, err = gpt1(args, capsys)
    assert code == 1 and err.startswith("error: --compile-mode reduce-overhead takes effect only with --compile")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


@pytest.mark.parametrize("mode", MODES)
def test_the_mode_reaches_torch_compile_and_graphed_modes_keep_gradients(mode, corpus, tmp_path, compiles):
    """``default`` is the call --compile made before the setting existed (no mode argument). The graphed modes keep
    every gradient allocated, so a loss is never computed with a gradient freed; the updates are the same bits."""
    pretrain(_cfg(corpus, tmp_path / "plain"))
    assert compiles == []
    pretrain(_cfg(corpus, tmp_path / "compiled", compile=True, compile_mode=mode))
    (call,) = compiles
    assert call["kwargs"] == ({} if mode == "default" else {"mode": mode})
    assert len(call["grads_held"]) == 3 * 2  # 3 updates of 2 micro-batches
    if mode in GRAPHED_MODES:
        assert all(call["grads_held"])
    else:  # freed after each update: the first micro-batch of each finds none
        assert call["grads_held"] == [False, True] * 3
    assert _losses(tmp_path / "compiled") == _losses(tmp_path / "plain")


def test_kept_gradients_are_zeroed_in_place_and_give_the_same_update():
    def run(keep: bool) -> tuple[Trainer, list[torch.Tensor]]:
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=50, n_ctx=8, n_embd=16, n_layer=1, n_head=2, n_inner=32, embd_pdrop=0.0)
        model = GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tr = Trainer(
            model,
            opt,
            lambda m, b: m.lm_loss(b[:, :-1], b[:, 1:]),
            lambda s: 1e-3,
            device=torch.device("cpu"),
            keep_grads=keep,
        )
        grads = [p.grad for p in tr.params]
        for step, batch in enumerate(torch.randint(0, 50, (2, 4, 9), generator=torch.Generator().manual_seed(1))):
            tr.step(step, list(batch.split(2)))
        return tr, grads

    kept, before = run(True)
    assert all(g is not None and g is p.grad and not g.any() for g, p in zip(before, kept.params))
    freed, _ = run(False)
    assert all(p.grad is None for p in freed.params)
    assert all(torch.equal(a, b) for a, b in zip(kept.params, freed.params))


def test_compile_mode_is_taken_silently_on_resume():
    assert "compile_mode" in RULES.silent
    assert "compile_mode" not in RULES.defining + RULES.adjustable


def test_a_run_whose_config_lacks_the_setting_loads_and_resumes_with_a_new_mode(corpus, tmp_path, capsys, compiles):
    """A run directory written before --compile-mode existed (no compile_mode in its config.toml) loads as the
    default and resumes, also with another mode: taken without a refusal or a note."""
    run = tmp_path / "run"
    args = ["pretrain", "--data", str(corpus), "--out", str(run), *TINY, "--seq-len", "16", "--batch-size", "4"]
    args += ["--max-steps", "2", "--warmup-steps", "1", "--device", "cpu", "--precision", "fp32", "--compile"]
    code, _, err = gpt1([*args, "--peak-flops", "1e11", "--quiet"], capsys)
    assert code == 0, err
    config = run / "config.toml"
    text = config.read_text()
    assert 'compile_mode = "default"' in text
    config.write_text(text.replace('compile_mode = "default"\n', ""))  # as an older gpt1 wrote it
    assert from_dict(PretrainConfig, read_config_file(config)).compile_mode == "default"

    resume = ["pretrain", "--out", str(run), "--resume", "--max-steps", "3", "--quiet"]
    code, _, err = gpt1(resume, capsys)
    assert code == 0, err
    code, _, err = gpt1([*resume[:-2], "4", "--compile-mode", "reduce-overhead", "--quiet"], capsys)
    assert code == 0, err
    assert [c["kwargs"] for c in compiles] == [{}, {}, {"mode": "reduce-overhead"}]
    assert 'compile_mode = "reduce-overhead"' in config.read_text()

    rec = RecordingProgress()
    res = pretrain(_cfg(corpus, run, batch_size=4, micro_batch_size=None, max_steps=5, compile=True, resume=True), rec)
    assert res.step == 5
    notes = str(rec.of("note"))
    assert "max_steps 4 → 5" in notes and "compile" not in notes
