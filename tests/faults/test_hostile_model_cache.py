"""A poisoned converted-model cache (gptcli/interop/hub.py): another model written where a Hub id's conversion
lives must never be presented as that model. Online it is converted again; offline it is refused in one line.

The Hub is the local stand-in of tests/helpers/hub_standin.py (read with ``HF_HUB_OFFLINE`` set)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_lines import assert_one_line_error
from hub_standin import MODEL_COMMIT, use_cache, write_gpt1_repo

from tests.faults.conftest import gpt1

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, shared_data) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    write_gpt1_repo(cache, shared_data / "openai-gpt-bpe")
    return cache


@pytest.fixture
def converted(hub_cache, monkeypatch) -> Path:
    """The stand-in's ``openai-gpt`` converted into this test's (empty) model cache."""
    from gptcli.interop.hub import pretrained

    use_cache(monkeypatch, hub_cache)
    return pretrained("openai-gpt")


def _poison(target: Path) -> None:
    """Another (smaller) model written over the conversion, as another process could."""
    import torch

    from gptcli.checkpoint import load_checkpoint, save_checkpoint
    from gptcli.model.build import build_model
    from gptcli.model.gpt import ModelConfig

    tokenizer = load_checkpoint(target).tokenizer
    torch.manual_seed(0)
    small = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, n_ctx=16, n_embd=8, n_layer=1, n_head=1))
    save_checkpoint(target, small, tokenizer, kind="lm", meta={"note": "not openai-gpt"})


def test_another_model_at_the_cache_path_is_converted_again(converted):
    from gptcli.checkpoint import read_header
    from gptcli.interop.hub import fetch_model, parse_hub_id
    from gptcli.progress import RecordingProgress

    source = read_header(converted).meta["source"]
    assert source["commit"] == MODEL_COMMIT and set(source["files"]) >= {"config.json", "model.safetensors"}
    _poison(converted)
    rec = RecordingProgress()
    model = fetch_model(parse_hub_id("openai-gpt"), progress=rec)
    warns = [n["message"] for n in rec.of("note") if n["level"] == "warn"]
    assert not model.cached and len(warns) == 1 and "records no conversion of openai-community/openai-gpt" in warns[0]
    assert read_header(model.path).model["n_layer"] == 2 and read_header(model.path).meta["source"] == source


def test_a_conversion_of_other_source_files_is_converted_again(converted):
    from gptcli.checkpoint import read_header
    from gptcli.interop.hub import fetch_model, parse_hub_id

    config = converted / "config.json"
    doc = json.loads(config.read_text())
    doc["meta"]["source"]["files"]["model.safetensors"] = "0" * 64
    doc.pop("config_sha256")  # a consistent record (a checkpoint may have none), only of other files
    config.write_text(json.dumps(doc))
    model = fetch_model(parse_hub_id("openai-gpt"))
    assert not model.cached and read_header(model.path).meta["source"]["files"]["model.safetensors"] != "0" * 64
    assert fetch_model(parse_hub_id("openai-gpt")).cached  # and then it is the conversion again


def test_offline_another_model_is_refused_in_one_line(converted, tmp_path, capsys, monkeypatch):
    _poison(converted)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))  # the Hub out of reach
    res = gpt1(["generate", "--checkpoint", "openai-gpt", "--prompt", "hello", "--device", "cpu"], capsys)
    assert_one_line_error(res, str(converted), "records no conversion of openai-community/openai-gpt", "network")
    assert "OpenAI" not in res.err  # never announced as the released model
