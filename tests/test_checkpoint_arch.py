"""The ``arch`` field of config.json: an LSTM checkpoint round-trips (weights, head, state carry), a Transformer
checkpoint written before the field existed still loads as a Transformer, an unknown architecture is one line."""

from __future__ import annotations

import json

import pytest
import torch

from gptcli import checkpoint as ckpt
from gptcli.errors import GPT1Error
from gptcli.model.build import new_cache
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.lstm import LSTMLM, LSTMConfig

LSTM = LSTMConfig(vocab_size=50, n_ctx=16, n_embd=16, n_hidden=24, n_layer=2)


def test_an_lstm_checkpoint_round_trips(tmp_path):
    torch.manual_seed(0)
    model = LSTMLM(LSTM)
    model.add_special_tokens(3)
    head = {"linear.weight": torch.randn(2, 16), "linear.bias": torch.zeros(2)}
    path = ckpt.save_checkpoint(tmp_path / "c", model, kind="finetuned", meta={"step": 3}, head_state=head)
    config = json.loads((path / ckpt.CONFIG).read_text())
    assert config["arch"] == "lstm" and config["model"]["n_hidden"] == 24 and config["model"]["n_special"] == 3
    assert ckpt.read_header(path).arch == "lstm"
    loaded = ckpt.load_checkpoint(path)
    assert isinstance(loaded.model, LSTMLM) and loaded.config == model.config and not loaded.model.training
    torch.testing.assert_close(loaded.head_state["linear.weight"], head["linear.weight"])
    model.eval()
    x = torch.randint(0, 53, (2, 10))
    torch.testing.assert_close(loaded.model(x), model(x))
    state_a, state_b = new_cache(model, 2), new_cache(loaded.model, 2)
    for part in (x[:, :4], x[:, 4:]):  # the loaded weights drive the carried state as the saved ones did
        torch.testing.assert_close(loaded.model(part, state_b), model(part, state_a))


def test_a_transformer_checkpoint_records_its_arch(tmp_path):
    path = ckpt.save_checkpoint(
        tmp_path / "t", GPT(ModelConfig(vocab_size=50, n_ctx=8, n_embd=16, n_layer=1, n_head=2, n_inner=32))
    )
    assert json.loads((path / ckpt.CONFIG).read_text())["arch"] == "transformer"


@pytest.mark.parametrize("era", ["before arch", "before checksums"])
def test_old_transformer_checkpoints_without_the_field_load_as_transformers(era, tmp_path):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, n_ctx=8, n_embd=16, n_layer=1, n_head=2, n_inner=32)).eval()
    path = ckpt.save_checkpoint(tmp_path / "old", model, meta={"step": 1})
    config = json.loads((path / ckpt.CONFIG).read_text())
    del config["arch"]
    if era == "before arch":  # checksummed, with the digest such a checkpoint was written with
        config[ckpt.CONFIG_DIGEST] = ckpt._config_digest(config)
    else:
        del config["files"], config[ckpt.CONFIG_DIGEST]
    (path / ckpt.CONFIG).write_text(json.dumps(config, indent=2))
    assert ckpt.verify_checkpoint(path) == []
    assert ckpt.read_header(path).arch == "transformer"
    loaded = ckpt.load_checkpoint(path)
    assert isinstance(loaded.model, GPT) and loaded.config == model.config
    x = torch.randint(0, 50, (1, 8))
    torch.testing.assert_close(loaded.model(x), model(x))


def test_an_unknown_or_mismatched_arch_is_one_line(tmp_path):
    path = ckpt.save_checkpoint(tmp_path / "c", LSTMLM(LSTM))
    config = json.loads((path / ckpt.CONFIG).read_text())
    for arch, message in (
        ("mamba", "unknown model architecture 'mamba'"),
        ("transformer", "unreadable checkpoint config"),
    ):
        config["arch"] = arch
        config[ckpt.CONFIG_DIGEST] = ckpt._config_digest(config)
        (path / ckpt.CONFIG).write_text(json.dumps(config))
        with pytest.raises(GPT1Error, match=message):
            ckpt.load_checkpoint(path)
