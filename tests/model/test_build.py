"""The one model factory (gptcli/model/build.py): re-initialising the blocks a transfer does not keep."""

from __future__ import annotations

import pytest
import torch

import gptcli.model.build as build_mod
from gptcli.errors import GPT1Error
from gptcli.model.build import build_model, new_model, preset, reinit_after


@pytest.mark.parametrize("name", ["tiny", "lstm-tiny"])
def test_reinit_after_keeps_the_embeddings_and_the_first_layers(name):
    torch.manual_seed(0)
    model = build_model(preset(name, vocab_size=40))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    keep = 1 if name == "tiny" else 0
    reinit_after(model, keep)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "nothing was re-initialised"
    if name == "tiny":
        assert all(k.startswith("blocks.") and not k.startswith("blocks.0.") for k in changed)
    assert not any("wte" in k or "wpe" in k or k.startswith("emb") for k in changed)


def test_reinit_after_refuses_more_layers_than_the_model_has():
    model = build_model(preset("tiny", vocab_size=40))
    with pytest.raises(ValueError, match="keep_layers must be between 0 and"):
        reinit_after(model, model.config.n_layer + 1)
    reinit_after(model, model.config.n_layer)  # keeps every block: nothing to do


@pytest.mark.parametrize("name", ["tiny", "lstm-tiny"])
def test_new_model_draws_the_weights_build_model_draws(name):
    cfg = preset(name, vocab_size=40)
    torch.manual_seed(3)
    want = build_model(cfg).state_dict()
    torch.manual_seed(3)
    got = new_model(cfg, torch.device("cpu")).state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_new_model_too_big_for_the_device_says_its_size(monkeypatch):
    """The allocation error becomes the one-line error that gives the model's size (counted on the meta device)."""
    real, cfg = build_mod.build_model, preset("tiny", vocab_size=40)

    def too_big(config):
        if torch.get_default_device().type != "meta":
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes")
        return real(config)

    monkeypatch.setattr(build_mod, "build_model", too_big)
    params = real(cfg).num_params()
    with pytest.raises(GPT1Error, match=f"^cpu has no room for the model itself: its {params:,} parameters"):
        new_model(cfg)
