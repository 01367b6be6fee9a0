"""The one model factory (gptcli/model/build.py): re-initialising the blocks a transfer does not keep."""

from __future__ import annotations

import pytest
import torch

from gptcli.model.build import build_model, preset, reinit_after


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
