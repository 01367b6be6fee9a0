"""The LSTM baseline (Table 5): shapes, the tied output layer, the GPT interface (hidden states, special tokens,
heads), zero state per window, incremental state = full forward, initialisation, generation with the carried state,
and that it learns a tiny corpus through the real pretraining loop."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gptcli.model.build import PRESETS, arch_of, build_model, new_cache, preset
from gptcli.model.classifier import FinetuneModel
from gptcli.model.generate import SamplingConfig, generate
from gptcli.model.gpt import GPT
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.model.losses import lm_loss_per_sequence
from gptcli.model.lstm import LSTMLM, LSTMConfig, LSTMState

pytestmark = pytest.mark.usefixtures("one_thread")

V = 50


def small(**kw) -> LSTMLM:
    torch.manual_seed(3)
    cfg = dict(vocab_size=V, n_ctx=32, n_embd=16, n_hidden=24, embd_pdrop=0.0, out_pdrop=0.0)
    return LSTMLM(LSTMConfig(**{**cfg, **kw})).eval()


def test_presets_pick_the_architecture_and_their_sizes():
    with torch.device("meta"):  # counting needs no memory
        paper = build_model(PRESETS["lstm"])
        matched = build_model(dataclasses.replace(PRESETS["lstm"], n_embd=2048))
        gpt1 = build_model(PRESETS["gpt1"])
        lstm_tiny, tiny = build_model(PRESETS["lstm-tiny"]), build_model(PRESETS["tiny"])
    assert isinstance(paper, LSTMLM) and isinstance(gpt1, GPT) and arch_of(paper) == "lstm"
    assert paper.lstm.hidden_size == 2048 and paper.lstm.num_layers == 1 and paper.proj is not None
    assert paper.num_params() == 55_745_792  # the figure docs/pretrain.md and the module docstring give
    assert matched.proj is None and abs(matched.num_params() / gpt1.num_params() - 1) < 1e-3  # 116.5 M each
    assert abs(lstm_tiny.num_params() / tiny.num_params() - 1) < 0.02
    # The experiment's CPU pair: 4 × 192 Transformer and a 560-unit LSTM over 4,096 ids, 128 context.
    with torch.device("meta"):
        cpu_t = build_model(preset("tiny", vocab_size=4096, n_layer=4, n_embd=192, n_head=4, n_inner=768, n_ctx=128))
        cpu_l = build_model(preset("lstm-tiny", vocab_size=4096, n_embd=192, n_hidden=560, n_ctx=128))
    assert (cpu_t.num_params(), cpu_l.num_params()) == (2_590_464, 2_583_104)
    with pytest.raises(ValueError, match="n_head for the lstm preset"):
        preset("lstm", n_head=4)


def test_shapes_and_tied_output_layer():
    m = small()
    x = torch.randint(0, V, (3, 7))
    h = m(x)
    assert h.shape == (3, 7, 16)
    logits = m.lm_logits(h)
    assert logits.shape == (3, 7, V)
    torch.testing.assert_close(logits, h @ m.tok_emb.weight.T)
    # No separate output matrix: the embedding is the only (V, d) tensor, and the LM loss trains it from both ends.
    assert [n for n, p in m.named_parameters() if p.shape[0] == V] == ["tok_emb.weight"]
    m.train()
    m.lm_loss(x, torch.randint(0, V, (3, 7))).backward()
    assert m.tok_emb.weight.grad.abs().sum() > 0
    no_proj = small(n_hidden=16)
    assert no_proj.proj is None and no_proj(x).shape == (3, 7, 16)


def test_causal_and_every_call_starts_from_a_zero_state():
    m = small()
    x = torch.randint(0, V, (2, 12))
    h = m(x)
    y = x.clone()
    y[:, 6] = (y[:, 6] + 1) % V
    h2 = m(y)
    torch.testing.assert_close(h2[:, :6], h[:, :6])  # the past does not see the future
    assert not torch.allclose(h2[:, 6:], h[:, 6:])
    torch.testing.assert_close(m(x), h)  # no state carried from one window to the next


def test_incremental_state_equals_the_full_forward():
    m = small(n_layer=2)
    x = torch.randint(0, V, (2, 15))
    full = m(x)
    state = new_cache(m, 2)
    assert isinstance(state, LSTMState) and state.pos == 0 and state.h is None
    parts = [m(x[:, a:b], state) for a, b in ((0, 5), (5, 6), (6, 15))]
    assert state.pos == 15 and state.h.shape == (2, 2, 24)
    torch.testing.assert_close(torch.cat(parts, 1), full)
    # One context continued by several rows (what scoring does with a shared RACE document).
    one = new_cache(m, 1)
    m(x[:1, :5], one)
    many = one.repeat(3)
    cont = torch.randint(0, V, (3, 4))
    got = m(cont, many)
    for r in range(3):
        torch.testing.assert_close(got[r], m(torch.cat([x[0, :5], cont[r]])[None])[0, 5:])
    with pytest.raises(ValueError, match="exceeds the context of 32"):
        m(torch.zeros(1, 20, dtype=torch.long), state)


def test_dropout_only_in_training_and_only_where_configured():
    m = small(embd_pdrop=0.3, out_pdrop=0.3, n_layer=2)
    assert m.lstm.dropout == 0.3  # between stacked layers too
    x = torch.randint(0, V, (2, 9))
    m.train()
    assert not torch.allclose(m(x), m(x))
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    assert small(n_layer=1, out_pdrop=0.3).lstm.dropout == 0.0  # nn.LSTM would warn about a 1-layer dropout


def test_initialisation_and_layer_reinitialisation():
    m = small(n_layer=2, n_hidden=24)
    H = 24
    for layer in range(2):
        b_ih, b_hh = getattr(m.lstm, f"bias_ih_l{layer}"), getattr(m.lstm, f"bias_hh_l{layer}")
        assert torch.all(b_ih[H : 2 * H] == 1) and torch.all(b_ih[:H] == 0) and torch.all(b_ih[2 * H :] == 0)
        assert torch.all(b_hh == 0)
        assert getattr(m.lstm, f"weight_hh_l{layer}").abs().max() <= H**-0.5
    assert abs(float(m.tok_emb.weight.detach().std()) - 0.02) < 0.005
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.reinit_layers(2)  # keep every layer: nothing changes
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    m.reinit_layers(1)  # keep layer 0 and the embedding; layer 1 and the projection are drawn again
    after = m.state_dict()
    same = {k for k in after if torch.equal(before[k], after[k])}
    assert {"tok_emb.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0"} <= same
    assert "lstm.weight_ih_l1" not in same and "proj.weight" not in same


def test_special_tokens_and_a_head_on_the_extract_state():
    m = small()
    old = m.tok_emb.weight.detach().clone()
    m.add_special_tokens(3)
    assert m.config.n_special == 3 and m.config.total_vocab == V + 3
    assert torch.equal(m.tok_emb.weight[:V], old) and m.tok_emb.weight.shape == (V + 3, 16)
    extract = V + 2
    head = TaskHead(HeadConfig(kind="classification", n_embd=m.config.n_embd, n_labels=2, extract_id=extract))
    model = FinetuneModel(m, head).eval()
    ids = torch.tensor([[V, 4, 5, 6, extract, 0, 0], [V, 7, 8, extract, 0, 0, 0]])
    out, hidden = model(ids, 1)
    assert out.shape == (2, 2)
    # The extract representation is the hidden state (after the projection) at the extract token.
    torch.testing.assert_close(head.pooled(hidden, ids), torch.stack([hidden[0, 4], hidden[1, 3]]))
    torch.testing.assert_close(hidden[1, :4], m(ids[1:, :4])[0])  # right padding changes nothing before it
    mask = (ids > 0).float()
    aux = lm_loss_per_sequence(hidden, ids, mask, m.lm_logits)  # the auxiliary LM loss of fine-tuning
    assert aux.shape == (2,) and torch.isfinite(aux).all()


def test_greedy_generation_with_the_carried_state_equals_recomputing():
    m = small(n_ctx=40)
    with torch.no_grad():  # larger weights than the init: the greedy sequence then varies
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    prompt = [3, 9, 14, 2]
    cached = generate(m, prompt, SamplingConfig(max_new_tokens=20, greedy=True))
    uncached = generate(m, prompt, SamplingConfig(max_new_tokens=20, greedy=True, use_cache=False))
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(20):
            seq.append(int(m.lm_logits(m(torch.tensor([seq])))[0, -1].argmax()))
    assert cached == uncached == seq[len(prompt) :]
    assert len(set(cached)) > 1
    sampled = [generate(m, prompt, SamplingConfig(max_new_tokens=12, seed=5, use_cache=c)) for c in (True, False)]
    assert sampled[0] == sampled[1]
    assert len(generate(m, prompt, SamplingConfig(max_new_tokens=100, greedy=True))) == 40 - len(prompt)


def test_bf16_autocast_trains():
    m = small()
    m.train()
    x = torch.randint(0, V, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m.lm_loss(x, x)
    loss.backward()
    assert torch.isfinite(loss) and m.lstm.weight_ih_l0.grad.dtype == torch.float32


def test_learns_a_tiny_corpus_well_below_the_unigram_loss(tmp_path):
    """The real pretraining loop (trainer, schedule, validation, checkpoint) with an LSTM preset: sentences from a
    small grammar, byte by byte, are learned far past their letter frequencies within seconds."""
    from corpus_helpers import write_corpus

    from gptcli.checkpoint import load_checkpoint, read_header
    from gptcli.train.pretrain import PretrainConfig, pretrain
    from gptcli.train.pretrain_job import unigram_loss

    rng = np.random.default_rng(0)
    words = ["the cat", "a dog", "my bird", "one fish"]
    verbs = ["sees", "likes", "eats", "hears"]

    def text(n: int) -> np.ndarray:
        s = " ".join(f"{rng.choice(words)} {rng.choice(verbs)} {rng.choice(words)}." for _ in range(n))
        return np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int64)

    train, val = text(600), text(60)
    corpus = write_corpus(tmp_path / "corpus", {"train": [[train]], "val": [[val]]})
    cfg = PretrainConfig(
        data=corpus,
        out=tmp_path / "run",
        preset="lstm-tiny",
        model={
            "n_embd": 32,
            "n_hidden": 64,
            "n_ctx": 64,
            "embd_pdrop": 0.0,
            "out_pdrop": 0.0,
            "init_std": 0.3,
        },  # a wider init learns a 32-wide model faster
        seq_len=64,
        batch_size=8,
        lr=1e-2,
        warmup_steps=5,
        max_steps=80,
        eval_every=0,
        save_every=0,
        log_every=20,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    result = pretrain(cfg)
    unigram = unigram_loss([train], [val], 256)
    assert result.final_val_loss < unigram - 1.0, (result.final_val_loss, unigram)
    assert read_header(result.last_checkpoint).arch == "lstm"
    assert isinstance(load_checkpoint(tmp_path / "run").model, LSTMLM)
