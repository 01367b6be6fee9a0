"""The batched scoring engine: exact sums against a hand-computed stub, every batching path, left truncation,
and parity with Hugging Face's OpenAIGPTLMHeadModel holding the same weights."""

from __future__ import annotations

import random

import pytest
import torch
from zs_toy_tokenizer import BagLM

from gptcli.eval.scoring import Request, score
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.packed import PackedAttend
from gptcli.progress import RecordingProgress

pytestmark = pytest.mark.usefixtures("one_thread")

V = 23


def _bag(n_ctx: int = 64) -> BagLM:
    g = torch.Generator().manual_seed(3)
    return BagLM(torch.randn(V, V, generator=g), n_ctx=n_ctx)


def _requests(n: int, seed: int = 0, shared: bool = True) -> list[Request]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        ctx = [rnd.randrange(V) for _ in range(rnd.randrange(0, 20))]
        k = rnd.choice([1, 2, 4]) if shared else 1
        for _ in range(k):  # several continuations of the same context (prefix sharing)
            out.append(Request.of(ctx, [rnd.randrange(V) for _ in range(rnd.choice([1, 1, 2, 5]))]))
    return out


@pytest.mark.parametrize("cache_min_context", [1, 10_000])
@pytest.mark.parametrize("batch_size", [1, 7])
def test_exact_against_hand_computed(batch_size, cache_min_context):
    model = _bag()
    reqs = _requests(15)
    got = score(model, reqs, batch_size=batch_size, precision="fp32", cache_min_context=cache_min_context)
    for r, s in zip(reqs, got):
        want, n = model.reference(r.context, r.continuation)
        assert s.count == n
        assert s.logprob == pytest.approx(want, abs=1e-4)
        assert not s.truncated


def test_single_token_continuations_share_one_row():
    # SST-2's shape: N contexts x 2 single-token words -> N rows, not 2N.
    model = _bag()
    reqs = [Request.of([1, 2, 3 + i], [w]) for i in range(6) for w in (7, 8)]
    got = score(model, reqs, batch_size=64, precision="fp32")
    assert model.forward_rows == 6
    for r, s in zip(reqs, got):
        assert s.logprob == pytest.approx(model.reference(r.context, r.continuation)[0], abs=1e-5) and s.count == 1


def test_shared_long_context_runs_once():
    model = _bag()
    ctx = list(range(20))
    reqs = [Request.of(ctx, [1, 2, 3]), Request.of(ctx, [4]), Request.of(ctx, [5, 6])]
    got = score(model, reqs, precision="fp32", cache_min_context=8)
    assert model.forward_rows == 1 + 3  # the context once (batch 1), then the three candidates together
    for r, s in zip(reqs, got):
        want, n = model.reference(r.context, r.continuation)
        assert s.count == n and s.logprob == pytest.approx(want, abs=1e-5)


def test_empty_context_skips_first_token():
    model = _bag()
    (s,) = score(model, [Request.of([], [4, 5, 6])], precision="fp32")
    assert s.count == 2
    assert s.logprob == pytest.approx(model.reference([], [4, 5, 6])[0], abs=1e-5)
    (one,) = score(model, [Request.of([], [4])], precision="fp32")
    assert one.count == 0 and one.mean != one.mean  # nan: nothing to score


def test_left_truncation_keeps_the_end_of_the_context():
    model = _bag(n_ctx=8)
    ctx, cont = list(range(1, 21)), [3, 4, 5]
    (s,) = score(model, [Request.of(ctx, cont)], precision="fp32")
    # n_ctx + 1 = 9 tokens fit: the continuation (3) and the LAST 6 context tokens.
    want, n = model.reference(ctx[-6:], cont)
    assert s.truncated and s.count == 3 and s.logprob == pytest.approx(want, abs=1e-5)


def test_shared_context_truncated_by_the_longest_candidate():
    model = _bag(n_ctx=8)
    ctx = list(range(1, 21))
    reqs = [Request.of(ctx, [3]), Request.of(ctx, [3, 4, 5, 6])]
    for cmc in (1, 1000):
        got = score(model, reqs, precision="fp32", cache_min_context=cmc)
        # Budget set by the 4-token candidate: both see the same last 5 context tokens.
        for r, s in zip(reqs, got):
            want, _ = model.reference(ctx[-5:], r.continuation)
            assert s.truncated and s.logprob == pytest.approx(want, abs=1e-5)


def test_overlong_continuation_is_cut_and_flagged():
    model = _bag(n_ctx=8)
    (s,) = score(model, [Request.of([1, 2], list(range(3, 15)))], precision="fp32")
    assert s.truncated and s.count == 8  # one context token, then the first n_ctx continuation tokens


def test_gpt_paths_agree_and_eval_mode():
    cfg = ModelConfig(vocab_size=50, n_ctx=24, n_embd=32, n_layer=2, n_head=2, n_inner=64)
    model = GPT(cfg).train()  # the scorer must switch dropout off (and restore the mode)
    rnd = random.Random(1)
    reqs = []
    for _ in range(12):
        ctx = [rnd.randrange(50) for _ in range(rnd.randrange(1, 30))]
        for _ in range(3):
            reqs.append(Request.of(ctx, [rnd.randrange(50) for _ in range(rnd.randrange(1, 5))]))
    a = score(model, reqs, batch_size=4, precision="fp32", cache_min_context=1)
    b = score(model, reqs, batch_size=64, precision="fp32", cache_min_context=10_000)
    assert model.training
    for x, y in zip(a, b):
        assert x.count == y.count and x.truncated == y.truncated
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)


def test_gpt_packs_shared_contexts_with_their_candidates_as_a_kv_cache_continues_them(monkeypatch):
    # Story Cloze's and RACE's zero-shot shape: one context, several multi-token candidates. A GPT packs the
    # contexts of many groups into one row, each once, its candidates attending to it.
    from gptcli.eval import scoring

    cfg = ModelConfig(vocab_size=50, n_ctx=32, n_embd=32, n_layer=2, n_head=2, n_inner=64)
    model = GPT(cfg).eval()
    rnd = random.Random(7)
    reqs = []
    for _ in range(9):
        ctx = [rnd.randrange(50) for _ in range(rnd.randrange(1, 26))]
        reqs += [
            Request.of(ctx, [rnd.randrange(50) for _ in range(rnd.randrange(1, 6))]) for _ in range(rnd.choice([2, 4]))
        ]
    calls = []  # how the first block attends, once per forward pass
    hook = model.blocks[0].register_forward_hook(lambda m, args, out: calls.append(args[1]))
    packed = score(model, reqs, batch_size=64, precision="fp32")
    hook.remove()
    assert len(calls) == 1 and isinstance(calls[0], PackedAttend)  # every group in one packed row
    plain = score(model, reqs, batch_size=64, precision="fp32", cache_min_context=10_000)
    monkeypatch.setattr(scoring, "_packs", lambda m: False)
    cached = score(model, reqs, batch_size=64, precision="fp32", cache_min_context=1)  # the KV-cache path
    for a, b, c in zip(packed, plain, cached):
        assert a.count == b.count == c.count and a.greedy == b.greedy == c.greedy
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5) and a.logprob == pytest.approx(c.logprob, abs=1e-5)


def test_bf16_close_to_fp32():
    cfg = ModelConfig(vocab_size=50, n_ctx=32, n_embd=32, n_layer=2, n_head=2, n_inner=64)
    model = GPT(cfg)
    reqs = [Request.of([1, 2, 3, 4], [5, 6]), Request.of([7, 8], [9])]
    a = score(model, reqs, precision="fp32")
    b = score(model, reqs, precision="bf16")
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=0.05)


@pytest.mark.parametrize("cache_min_context", [1, 10_000])
def test_progress_is_one_stage_advanced_to_its_total(cache_min_context):
    model = _bag()
    reqs = _requests(10) + [Request.of([], [4])]  # the last has no token to score: counted at the end
    rec = RecordingProgress()
    got = score(
        model,
        reqs,
        batch_size=3,
        precision="fp32",
        cache_min_context=cache_min_context,
        progress=rec,
        stage="scoring x",
    )
    assert rec.events[0] == ("stage", {"name": "scoring x", "total": len(reqs), "unit": "", "done": 0})
    assert len(rec.of("stage")) == 1 and rec.events[-1] == ("end", {"summary": ""})
    assert all(kind == "advance" for kind, _ in rec.events[1:-1]) and sum(a["n"] for a in rec.of("advance")) == len(
        reqs
    )
    assert [(s.logprob, s.count) for s in got] == [
        (s.logprob, s.count)
        for s in score(model, reqs, batch_size=3, precision="fp32", cache_min_context=cache_min_context)
    ]
    assert score(model, [], progress=rec) == [] and len(rec.of("stage")) == 1  # nothing to score: no stage


# --- parity with the reference implementation -------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def test_parity_with_hugging_face():
    from gptcli.interop.hf import config_to_hf, state_dict_to_hf

    cfg = ModelConfig(vocab_size=60, n_ctx=16, n_embd=32, n_layer=2, n_head=2, n_inner=128)  # HF: 4·d
    ours = GPT(cfg).eval()
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
    )
    hf = transformers.OpenAIGPTLMHeadModel(hf_cfg).eval()
    hf.load_state_dict(state_dict_to_hf(ours.state_dict(), cfg.n_layer))
    rnd = random.Random(5)
    reqs = [
        Request.of(
            [rnd.randrange(60) for _ in range(rnd.randrange(0, 25))],
            [rnd.randrange(60) for _ in range(rnd.randrange(1, 4))],
        )
        for _ in range(10)
    ]
    got = score(ours, reqs, batch_size=3, precision="fp32", cache_min_context=1)
    for r, s in zip(reqs, got):
        # The reference: Hugging Face on the same left-truncated ids, one sequence at a time, no padding.
        budget = cfg.n_ctx + 1 - len(r.continuation)
        ctx = list(r.context)[-budget:] if len(r.context) > budget else list(r.context)
        seq = ctx + list(r.continuation)
        if len(seq) < 2:  # one token and no context: nothing is predicted
            assert s.count == 0
            continue
        with torch.no_grad():
            logits = hf(torch.tensor([seq[:-1]])).logits[0]
        lp = torch.log_softmax(logits.double(), -1)
        first = max(len(ctx), 1)
        want = sum(float(lp[j - 1, seq[j]]) for j in range(first, len(seq)))
        assert s.count == len(seq) - first
        assert s.logprob == pytest.approx(want, abs=1e-4)


def test_a_group_of_many_long_candidates_is_split_within_the_token_budget():
    # One context, forty 20-token candidates: packed as one group they were one pass of 800+ tokens, whatever
    # max_tokens said. Every pass stays within the budget, and the numbers are those of the plain rows.
    cfg = ModelConfig(vocab_size=50, n_ctx=32, n_embd=32, n_layer=2, n_head=2, n_inner=64)
    model = GPT(cfg).eval()
    rnd = random.Random(3)
    ctx = [rnd.randrange(50) for _ in range(5)]
    reqs = [Request.of(ctx, [rnd.randrange(50) for _ in range(20)]) for _ in range(40)]
    sizes: list[int] = []  # tokens of each forward pass, as its first block takes them (B, T, d)
    hook = model.blocks[0].register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[:2].numel()))
    packed = score(model, reqs, batch_size=64, max_tokens=100, precision="fp32")
    hook.remove()
    assert len(sizes) > 1 and max(sizes) <= 100, sizes
    plain = score(model, reqs, batch_size=64, precision="fp32", cache_min_context=10_000)
    for a, b in zip(packed, plain):
        assert a.count == b.count == 20 and a.logprob == pytest.approx(b.logprob, abs=1e-5)
