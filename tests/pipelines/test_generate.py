"""gptcli/pipelines/generate.py: a checkpoint continues a text prompt, streamed as text pieces."""

from __future__ import annotations

import pytest
import torch
from toy_tokenizer import ToyTokenizer

from gptcli.checkpoint import save_checkpoint
from gptcli.errors import GPT1Error
from gptcli.model.generate import GenerateConfig, SamplingConfig, generate
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.pipelines.generate import start_generation
from gptcli.progress import RecordingProgress

V = 97


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(4)
    model = GPT(ModelConfig(vocab_size=V, n_ctx=8, n_embd=16, n_layer=1, n_head=2, n_inner=32))
    return save_checkpoint(tmp_path / "ck", model, ToyTokenizer(V)), model.eval()


def test_stream_is_the_decoded_continuation(checkpoint):
    path, model = checkpoint
    cfg = GenerateConfig(checkpoint=path, prompt="a b c", max_new_tokens=4, greedy=True, device="cpu")
    progress = RecordingProgress()
    gen = start_generation(cfg, progress)
    tok = ToyTokenizer(V)
    assert gen.ids == tok.encode("a b c") and gen.prompt_text == tok.decode(gen.ids)
    pieces = list(gen.stream())
    expected = generate(model, gen.ids, SamplingConfig(max_new_tokens=4, greedy=True), vocab_limit=V)
    assert gen.generated == expected and len(pieces) == 4
    assert gen.prompt_text + "".join(pieces) == tok.decode(gen.ids + expected)
    assert gen.seconds > 0 and not progress.events  # nothing worth reporting


def test_long_prompt_keeps_its_end_and_warns(checkpoint):
    path, _ = checkpoint
    progress = RecordingProgress()
    gen = start_generation(GenerateConfig(checkpoint=path, prompt="a b c d e f g h i j", device="cpu"), progress)
    assert gen.ids == ToyTokenizer(V).encode("d e f g h i j")  # the last n_ctx - 1 = 7
    assert progress.of("note") == [
        {"message": "prompt has 10 tokens; keeping the last 7 of the 8-token context", "level": "warn"}
    ]
    assert len(list(gen.stream())) == 1  # 7 + 1 fills the context


def test_user_errors(checkpoint, tmp_path):
    path, _ = checkpoint
    with pytest.raises(GPT1Error, match="--checkpoint is required"):
        start_generation(GenerateConfig(prompt="a"))
    with pytest.raises(GPT1Error, match="--prompt is required"):
        start_generation(GenerateConfig(checkpoint=path))
    with pytest.raises(GPT1Error, match="temperature"):
        start_generation(GenerateConfig(checkpoint=path, prompt="a", temperature=0))
    with pytest.raises(GPT1Error, match="empty after cleaning"):
        start_generation(GenerateConfig(checkpoint=path, prompt="   ", device="cpu"))


def test_sample_texts_decodes_every_sample_as_one_batch(checkpoint):
    from gptcli.model.generate import generate_batch

    path, model = checkpoint
    cfg = GenerateConfig(checkpoint=path, prompt="a b c", max_new_tokens=3, samples=4, top_k=10, seed=5, device="cpu")
    progress = RecordingProgress()
    gen = start_generation(cfg, progress)
    texts = gen.sample_texts(progress)
    assert gen.rows == generate_batch(model, gen.ids, cfg, samples=4, vocab_limit=V)
    assert len(texts) == 4 and all(len(r) == 3 for r in gen.rows)
    tok = ToyTokenizer(V)
    assert [gen.prompt_text + t for t in texts] == [tok.decode(gen.ids + r) for r in gen.rows]
    assert progress.of("stage")[0]["name"] == "sampling 4 continuations" and len(progress.of("advance")) == 3
    assert gen.seconds > 0
    with pytest.raises(GPT1Error, match="samples"):
        start_generation(GenerateConfig(checkpoint=path, prompt="a", samples=0))


def test_samples_that_would_not_fit_are_drawn_in_several_batches(checkpoint, monkeypatch):
    """--samples 1024 of the paper's model would hold ~39 GB at once: more samples than fit the budget are drawn a
    batch at a time, said in a note; a count that fits one batch draws what it always drew."""
    from gptcli.model.generate import generate_batch
    from gptcli.pipelines import generate as pipeline

    path, model = checkpoint
    cfg = GenerateConfig(checkpoint=path, prompt="a b c", max_new_tokens=3, samples=8, top_k=10, seed=5, device="cpu")
    per_sample = pipeline.sample_bytes(1, 16, V, 6)
    monkeypatch.setattr(pipeline, "PASS_BYTES", 3 * per_sample)  # room for 3 samples per batch
    progress = RecordingProgress()
    gen = start_generation(cfg, progress)
    gen.sample_texts(progress)
    assert gen.batches == 3 and len(gen.rows) == 8 and all(len(r) == 3 for r in gen.rows)
    assert gen.rows[:3] == generate_batch(model, gen.ids, cfg, samples=3, vocab_limit=V)  # the first keeps the seed
    assert gen.rows[:3] != gen.rows[3:6]  # the next batches draw with seeds of their own
    (note,) = progress.of("note")
    assert "sampling them 3 at a time (3 batches)" in note["message"]
    assert len(progress.of("advance")) == 9


def test_the_memory_estimate_of_the_paper_s_model():
    from gptcli.pipelines.generate import sample_bytes

    gb = 1024 * sample_bytes(12, 768, 40478, 512) / 1e9
    assert 38 < gb < 41
