"""Dynamic padding, length bucketing, the released code's LM-loss mask, and the task head's extract read."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from gptcli.data.batching import PAD_ID, bucketed_batches, collate, iterate, num_batches, random_batches, train_batches
from gptcli.data.transforms import Encoded
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.heads import HeadConfig, TaskHead, first_extract_positions
from gptcli.model.losses import lm_loss_per_sequence

S, D, E = 50, 51, 52


def test_collate_pads_to_the_longest_sequence_only():
    items = [Encoded([[S, 1, 2, E]], 0, 0), Encoded([[S, 1, 2, 3, 4, D, 5, E]], 1, 1)]
    b = collate(items)
    assert b.ids.shape == (2, 8) and b.n_seqs == 1
    assert b.ids[0].tolist() == [S, 1, 2, E, PAD_ID, PAD_ID, PAD_ID, PAD_ID]
    assert b.mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0] and b.mask[1].sum() == 8
    assert b.labels.tolist() == [0, 1] and b.index.tolist() == [0, 1] and b.tokens == 12


def test_collate_flattens_sequences_per_example():
    items = [Encoded([[S, 1, E], [S, 2, 3, E]], 2, 0), Encoded([[S, 4, E], [S, 5, E]], 0, 1)]
    b = collate(items)
    assert b.ids.shape == (4, 4) and b.n_seqs == 2
    assert b.ids[1].tolist() == [S, 2, 3, E] and b.ids[2].tolist() == [S, 4, E, PAD_ID]
    # Regression labels are floats; unlabeled examples give no labels.
    assert collate([Encoded([[S, E]], 2.5, 0)], regression=True).labels.dtype == torch.float32
    assert collate([Encoded([[S, E]], None, 0)]).labels is None


def test_bucketed_batches_cover_every_example_once_and_group_lengths():
    rng = random.Random(0)
    lengths = [rng.randint(3, 500) for _ in range(1000)]
    batches = bucketed_batches(lengths, 32, shuffle=True, rng=random.Random(1), pool=10)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1000))
    assert len(batches) == num_batches(1000, 32, pool=10)

    # Padding waste: far less than with random batches.
    def waste(bs):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)

    order = list(range(1000))
    random.Random(2).shuffle(order)
    random_batches = [order[i : i + 32] for i in range(0, 1000, 32)]
    assert waste(batches) < 0.2 * waste(random_batches)
    # Different epochs (rng states) give different batches.
    again = bucketed_batches(lengths, 32, shuffle=True, rng=random.Random(2), pool=10)
    assert again != batches


def test_eval_batches_sorted_and_order_restorable():
    lengths = [5, 9, 2, 7, 7, 1]
    batches = bucketed_batches(lengths, 4, shuffle=False)
    assert batches == [[1, 3, 4, 0], [2, 5]]
    enc = [Encoded([[S] + [1] * (n - 2) + [E]] if n >= 2 else [[E]], 0, i) for i, n in enumerate(lengths)]
    seen = [i for b in iterate(enc, 4, shuffle=False) for i in b.index.tolist()]
    assert sorted(seen) == list(range(6))


@pytest.mark.parametrize("batch_size", [0, -1])
def test_every_batching_refuses_a_batch_size_below_one(batch_size):
    """A batch size of 0 gave evaluation's filled batches a budget of 0 that never advanced: empty batches without
    end, the memory growing. Every batching refuses it at once (the settings' check names the option earlier)."""
    import signal

    from gptcli.data.batching import filled_batches

    enc = [Encoded([[S, 1, 2, E]], 0, i) for i in range(4)]

    def hung(*_):
        raise TimeoutError("filled_batches did not return")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # without the check it never returns: fail, not hang
    try:
        with pytest.raises(ValueError, match="batch_size must be at least 1"):
            filled_batches(enc, batch_size)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        list(iterate(enc, batch_size, shuffle=False, shared_extract=E))
    for batches in (
        lambda: bucketed_batches([4] * 4, batch_size, shuffle=False),
        lambda: bucketed_batches([4] * 4, batch_size, shuffle=True),
        lambda: random_batches(4, batch_size, random.Random(0)),
    ):
        with pytest.raises(ValueError, match="batch_size must be at least 1"):
            batches()


def test_lm_loss_mask_is_the_released_one():
    torch.manual_seed(0)
    V, T = 60, 7
    ids = torch.tensor([[S, 3, 4, D, 5, E, PAD_ID], [S, 6, E, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
    mask = (torch.arange(T) < torch.tensor([[6], [3]])).float()
    hidden = torch.randn(2, T, 8)
    W = torch.randn(V, 8)
    got = lm_loss_per_sequence(hidden, ids, mask, lambda h: h @ W.T)
    logits = hidden @ W.T
    # Released: lm_losses = sum(CE(logits[:, :-1], X[:, 1:]) * M[:, 1:], 1) / sum(M[:, 1:], 1)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none").view(2, T - 1)
    want = (ce * mask[:, 1:]).sum(1) / mask[:, 1:].sum(1)
    torch.testing.assert_close(got, want)
    # Targets are tokens 1..len-1: the delimiter and the extract token are predicted, the start token is not.
    row0 = [ce[0, t].item() for t in range(5)]  # targets 3, 4, D, 5, E
    assert got[0].item() == pytest.approx(sum(row0) / 5, rel=1e-5)
    assert got[1].item() == pytest.approx((ce[1, 0] + ce[1, 1]).item() / 2, rel=1e-5)  # targets 6, E


def test_padding_changes_neither_extract_state_nor_lm_loss():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, n_special=3, n_ctx=32, n_embd=32, n_layer=2, n_head=2, n_inner=64)).eval()
    seq = [S, 3, 4, D, 5, E]
    short = collate([Encoded([seq], 0, 0)])
    padded = collate([Encoded([seq], 0, 0), Encoded([[S] + [7] * 12 + [E]], 0, 1)])
    h1, h2 = model(short.ids), model(padded.ids)
    torch.testing.assert_close(h1[0, 5], h2[0, 5])
    l1 = lm_loss_per_sequence(h1, short.ids, short.mask, model.lm_logits)
    l2 = lm_loss_per_sequence(h2, padded.ids, padded.mask, model.lm_logits)
    torch.testing.assert_close(l1[0], l2[0])


def test_head_reads_the_first_extract_position():
    ids = torch.tensor([[S, 3, E, 4, E, PAD_ID], [S, 3, 4, 5, 6, E]])
    assert first_extract_positions(ids, E).tolist() == [2, 5]
    with pytest.raises(ValueError):
        first_extract_positions(torch.tensor([[S, 3, 4]]), E)
    head = TaskHead(HeadConfig("classification", n_embd=4, n_labels=3, extract_id=E, pdrop=0.0)).eval()
    hidden = torch.zeros(2, 6, 4)
    hidden[0, 2] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    hidden[0, 4] = 100.0  # a later extract token must not be read
    hidden[1, 5] = torch.tensor([-1.0, 0.0, 1.0, 0.5])
    out = head(hidden, ids, 1)
    torch.testing.assert_close(out, head.linear(torch.stack([hidden[0, 2], hidden[1, 5]])))


def test_similarity_sums_both_orders_and_multiple_choice_scores_each_answer():
    torch.manual_seed(0)
    ids = torch.tensor([[S, 1, D, 2, E], [S, 2, D, 1, E], [S, 3, D, 4, E], [S, 4, D, 3, E]])
    hidden = torch.randn(4, 5, 6)
    sim = TaskHead(HeadConfig("similarity", 6, 2, extract_id=E, pdrop=0.0)).eval()
    want = sim.linear(torch.stack([hidden[0, 4] + hidden[1, 4], hidden[2, 4] + hidden[3, 4]]))
    torch.testing.assert_close(sim(hidden, ids, 2), want)
    mc = TaskHead(HeadConfig("multiple_choice", 6, extract_id=E, pdrop=0.0)).eval()
    scores = mc(hidden, ids, 4)
    assert scores.shape == (1, 4)
    torch.testing.assert_close(scores[0], mc.linear(hidden[:, 4]).squeeze(-1))
    reg = TaskHead(HeadConfig("regression", 6, extract_id=E, pdrop=0.0)).eval()
    r = reg(hidden, ids, 2)
    assert r.shape == (2,)
    assert reg.predict(torch.tensor([-0.5, 0.3, 2.0])).tolist() == pytest.approx([0.0, 1.5, 5.0])
    assert reg.loss(torch.tensor([0.2]), torch.tensor([1.0])).item() == pytest.approx(0.0, abs=1e-7)


def test_multiple_choice_dropout_mask_is_shared_by_the_answers():
    torch.manual_seed(0)
    head = TaskHead(HeadConfig("multiple_choice", 64, extract_id=E, pdrop=0.5)).train()
    with torch.no_grad():
        head.linear.weight.fill_(1.0)
        head.linear.bias.zero_()
    ids = torch.tensor([[S, E]] * 4)
    hidden = torch.ones(4, 2, 64)  # identical answers → identical scores only if the mask is shared
    s = head(hidden, ids, 4)
    assert torch.allclose(s, s[0, 0].expand_as(s))
    assert s[0, 0].item() != pytest.approx(64.0)  # dropout did act


def test_multiple_choice_head_and_lm_loss_match_transformers_double_heads():
    """Independent reference: Hugging Face's OpenAIGPTDoubleHeadsModel (cls_index summary = our W_y at <e>)."""
    transformers = pytest.importorskip("transformers")
    from gptcli.interop.hf import config_to_hf, state_dict_from_hf

    cfg = ModelConfig(vocab_size=50, n_special=3, n_ctx=16, n_embd=32, n_layer=2, n_head=2, n_inner=128)  # HF: 4·d
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")},
        num_labels=1,
        summary_type="cls_index",
        summary_use_proj=True,
        summary_proj_to_labels=True,
        summary_activation=None,
        summary_first_dropout=0.1,
    )
    torch.manual_seed(3)
    hf = transformers.OpenAIGPTDoubleHeadsModel(hf_cfg).eval()
    body = {k: v for k, v in hf.state_dict().items() if not k.startswith(("multiple_choice_head", "lm_head"))}
    ours = GPT(cfg).eval()
    ours.load_state_dict(state_dict_from_hf(body, cfg.n_layer))
    head = TaskHead(HeadConfig("multiple_choice", 32, extract_id=E, pdrop=0.1)).eval()
    head.linear.load_state_dict(hf.multiple_choice_head.summary.state_dict())

    choices = [[S, 3, 4, 5, D, 6, E], [S, 3, 4, 5, D, 7, 8, 9, E], [S, 3, 4, 5, D, 10, E]]
    b = collate([Encoded(choices, 1, 0)])
    scores = head(ours(b.ids), b.ids, b.n_seqs)
    mc_ids = first_extract_positions(b.ids, E).view(1, 3)
    out = hf(b.ids.view(1, 3, -1), mc_token_ids=mc_ids)
    torch.testing.assert_close(scores, out.mc_logits, atol=1e-5, rtol=1e-5)

    per_seq = lm_loss_per_sequence(ours(b.ids), b.ids, b.mask, ours.lm_logits)
    for r in range(3):
        ids = b.ids[r : r + 1]
        labels = ids.masked_fill(b.mask[r : r + 1] == 0, -100)
        ref = hf(ids.view(1, 1, -1), mc_token_ids=mc_ids[:, r : r + 1], labels=labels.view(1, 1, -1)).loss
        torch.testing.assert_close(per_seq[r], ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------- random vs length


def _label_tied_to_length(n: int = 2000, seed: int = 0) -> tuple[list[int], list[int]]:
    """A split where a third of the examples are positive and positives are longer (as on tasks where the label
    shows in the length): length-bucketed batches then carry skewed label mixes, i.i.d. batches do not."""
    rng = random.Random(seed)
    labels = [int(rng.random() < 1 / 3) for _ in range(n)]
    lengths = [rng.randint(20, 60) + 40 * y for y in labels]
    return labels, lengths


def _label_mix(batches: list[list[int]], labels: list[int]) -> tuple[float, float]:
    """Mean of the per-batch positive proportions, and their variance relative to drawing each batch at random
    without replacement from the split (hypergeometric: p(1 − p)/B · (N − B)/(N − 1)); ≈ 1 for i.i.d. batches."""
    n, p = len(labels), sum(labels) / len(labels)
    full = [b for b in batches if len(b) == len(batches[0])]
    props = [sum(labels[i] for i in b) / len(b) for b in full]
    mean = sum(props) / len(props)
    var = sum((q - mean) ** 2 for q in props) / (len(props) - 1)
    B = len(full[0])
    return mean, var / (p * (1 - p) / B * (n - B) / (n - 1))


def test_random_batches_carry_the_training_splits_label_mix_and_are_not_sorted():
    labels, lengths = _label_tied_to_length()
    p = sum(labels) / len(labels)
    for epoch in range(3):
        batches = train_batches(lengths, 32, "random", random.Random(epoch))
        assert sorted(i for b in batches for i in b) == list(range(len(labels)))
        assert len(batches) == num_batches(len(labels), 32, batching="random") == 63
        mean, spread = _label_mix(batches, labels)
        assert abs(mean - p) < 0.02 and 0.6 < spread < 1.6, (mean, spread)
        # Not sorted by length: within a batch, or along the epoch.
        assert sum(b == sorted(b, key=lambda i: lengths[i]) for b in batches) == 0
        firsts = [sum(lengths[i] for i in b) / len(b) for b in batches]
        assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True)
        # A batch's lengths span the split's: mean within-batch range close to the whole split's.
        ranges = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
        assert sum(ranges) / len(ranges) > 0.8 * (max(lengths) - min(lengths))
    # The same check tells length-bucketed batches apart (it can fail): their label mix is far from i.i.d.
    _, spread = _label_mix(train_batches(lengths, 32, "length", random.Random(0)), labels)
    assert spread > 5


def test_random_batches_are_a_fresh_permutation_per_rng_state_and_the_same_for_the_same_state():
    a = random_batches(100, 8, random.Random(3))
    assert a == random_batches(100, 8, random.Random(3)) and a != random_batches(100, 8, random.Random(4))
    assert [len(b) for b in a] == [8] * 12 + [4]  # the remainder is kept, not dropped
    with pytest.raises(ValueError, match="unknown batching 'sorted'"):
        train_batches([1, 2], 1, "sorted", random.Random(0))


def test_length_batching_pads_less_than_random():
    _, lengths = _label_tied_to_length()

    def pads(bs):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)

    assert pads(train_batches(lengths, 32, "length", random.Random(0))) < 0.2 * pads(
        train_batches(lengths, 32, "random", random.Random(0))
    )
