"""Packed fine-tuning batches compute what padded ones do, on the real tokens only (gptcli/model/packed.py).

Real task files encoded as fine-tuning encodes them: RTE, SST-2, STS-B (both orders) and Story Cloze (one sequence
per answer), a batch of one very long and many short examples, and a batch whose examples are all cut to n_ctx.
Head outputs, per-sequence LM losses, every real position's hidden state and every gradient agree in fp32 to 1e-5.
At evaluation, shared prefixes (one attention call for every answer of every example) score what the padded batch
does on real Story Cloze rows and on RACE in its official format, through ``predict`` as ``gpt1 eval`` runs it.
Training with shared prefixes (``--layout shared``) computes, with dropout off, what the packed row computes (head
outputs, per-sequence LM losses, hidden states, gradients: 1e-5) under both kernel modes; with dropout on it trains,
and its answers share the prefix's dropout masks — the deviation the layout makes, stated by a test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kernel_helpers import applied

from gptcli.data.batching import (
    FILL_TOKENS,
    collate,
    collate_packed,
    collate_shared,
    filled_batches,
    iterate,
    shared_tokens,
)
from gptcli.model.classifier import FinetuneModel, predict
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.model.losses import lm_loss_per_sequence, lm_loss_per_sequence_packed
from gptcli.model.packed import Packing, SharedGrid
from gptcli.model.packed_eval import final_states_at
from gptcli.tasks import get_task
from gptcli.train.finetune_setup import build_body, encode_task_data, read_task_data

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = dict(rtol=1e-5, atol=1e-5)
TASKS = {"rte": "glue/RTE", "sst2": "glue/SST-2", "stsb": "glue/STS-B", "storycloze": "storycloze"}
RACE = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "RACE"
"""RACE in its official layout (hand-written: RACE has no real file here)."""


def _encoded(task_name, pretrained, shared_data, n_ctx=None, n=24, data_dir=None):
    data_dir = data_dir or shared_data / TASKS[task_name]
    task = get_task(task_name)
    gpt, tok, _ = build_body(str(pretrained))
    data = read_task_data(task, str(data_dir), ("train", ""), max_train=n, seed=3)
    train, _ = encode_task_data(task, data, tok, n_ctx or gpt.config.n_ctx, cache=False, workers=1)
    head = TaskHead(
        HeadConfig(
            kind=task.kind,
            n_embd=gpt.config.n_embd,
            n_labels=max(1, len(task.labels)),
            extract_id=tok.extract_id,
            pdrop=0.0,
            init_std=0.02,
        )
    )
    for m in gpt.modules():  # no dropout: the two layouts draw different masks
        for name in ("p", "attn_pdrop"):
            if hasattr(m, name) and isinstance(getattr(m, name), float):
                setattr(m, name, 0.0)
    torch.manual_seed(0)
    return applied(FinetuneModel(gpt, head).train()), train, tok.extract_id, task.kind == "regression"


def _run(model, batch, packed: bool):
    """(head output, per-sequence LM losses, real positions' hidden states, gradients) of one forward/backward."""
    model.zero_grad(set_to_none=True)
    out, hidden = model(batch.ids, batch.n_seqs, batch.packing)
    if packed:
        lm = lm_loss_per_sequence_packed(hidden, batch.ids, batch.packing, model.gpt.lm_token_nll)
        real = hidden[0]
    else:
        lm = lm_loss_per_sequence(hidden, batch.ids, batch.mask, model.gpt.lm_logits)
        real = hidden[batch.mask > 0]
    loss = (model.head.loss(out, batch.labels) + 0.5 * lm.mean()) if batch.labels is not None else lm.mean()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return out.detach(), lm.detach(), real.detach(), grads


def _assert_same(model, items, extract_id, regression):
    padded = _run(model, collate(items, regression), packed=False)
    packed = _run(model, collate_packed(items, extract_id, regression), packed=True)
    for a, b in zip(padded[:3], packed[:3]):
        torch.testing.assert_close(b, a, **TOL)
    assert padded[3].keys() == packed[3].keys()
    for k in padded[3]:
        torch.testing.assert_close(packed[3][k], padded[3][k], **TOL, msg=k)


@pytest.mark.parametrize("kernel_mode", ["auto", "reference"])
@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_a_packed_batch_of_real_examples_equals_the_padded_one(task_name, kernel_mode, pretrained, shared_data):
    """Both attention paths over the packed grid (a permuted view of whole gathered token rows): the CPU kernels,
    and the reference's SDPA, which is what CUDA runs."""
    from gptcli.model import kernels

    model, enc, extract_id, regression = _encoded(task_name, pretrained, shared_data)
    kernels.set_kernels(kernel_mode)
    assert len({len(s) for e in enc[:8] for s in e.seqs}) > 1  # ragged: there is padding to skip
    _assert_same(model, enc[:8], extract_id, regression)


def _jagged_sdpa_on_cpu(seen: list):
    """``F.scaled_dot_product_attention`` that computes jagged nested inputs one sequence at a time by the plain
    causal SDPA (PyTorch's CPU has no causal kernel for jagged tensors; CUDA's flash varlen kernel computes the same
    function), recording each call's lengths as the nested tensors carry them; dense inputs go to the real one."""
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, *args, **kwargs):
        if not q.is_nested:
            return real(q, k, v, *args, **kwargs)
        assert kwargs.get("is_causal") and kwargs.get("dropout_p") == 0.0
        # The lengths the path handed over from the host: reading them back from a GPU would wait on it.
        seen.append((q.offsets().tolist(), q._maybe_min_seqlen, q._maybe_max_seqlen))
        outs = [real(a, b, c, is_causal=True).transpose(0, 1) for a, b, c in zip(q.unbind(), k.unbind(), v.unbind())]
        return torch.nested.nested_tensor_from_jagged(torch.cat(outs), q.offsets()).transpose(1, 2)

    return sdpa


@pytest.mark.parametrize("task_name", ["rte", "storycloze"])
def test_the_jagged_attention_path_equals_the_padded_batch(task_name, pretrained, shared_data, monkeypatch):
    """``packed.JAGGED_DEVICES`` (what CUDA may take once measured): the row's sequences attend as jagged nested
    tensors over the packing's offsets, with no grid; every output and gradient is the padded batch's. Its
    kernels are CUDA's, so here SDPA over the nested tensors is computed per sequence (``_jagged_sdpa_on_cpu``):
    what this checks is the path's layout, offsets and gradients, and that it ran."""
    import torch.nn.functional as F

    from gptcli.model import kernels, packed

    model, enc, extract_id, regression = _encoded(task_name, pretrained, shared_data, n=60)
    by_length = sorted(enc, key=lambda e: e.length)
    seen: list = []
    monkeypatch.setattr(packed, "JAGGED_DEVICES", ("cpu",))
    monkeypatch.setattr(F, "scaled_dot_product_attention", _jagged_sdpa_on_cpu(seen))
    kernels.set_kernels("reference")  # the device's kernels off, as on CUDA
    items = [by_length[-1], *by_length[:7]]  # one long example and many short ones
    _assert_same(model, items, extract_id, regression)
    lengths = collate_packed(items, extract_id, regression).packing.lengths
    offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert seen and all(call == (offsets, min(lengths), max(lengths)) for call in seen)
    assert len(seen) == model.gpt.config.n_layer  # every layer of the packed batch's one forward pass
    kernels.set_kernels("auto")  # with the CPU kernels on, the grid and the written-out kernel run instead
    seen.clear()
    _assert_same(model, items, extract_id, regression)
    assert not seen


def test_one_long_and_many_short_examples(pretrained, shared_data):
    model, enc, extract_id, regression = _encoded("rte", pretrained, shared_data, n=60)
    by_length = sorted(enc, key=lambda e: e.length)
    items = [by_length[-1], *by_length[:7]]
    assert items[0].length > 3 * items[1].length
    _assert_same(model, items, extract_id, regression)


def test_examples_all_cut_to_n_ctx(pretrained, shared_data):
    model, enc, extract_id, regression = _encoded("rte", pretrained, shared_data, n_ctx=16)
    cut = [e for e in enc if all(len(s) == 16 for s in e.seqs)][:6]
    assert len(cut) == 6  # RTE premises are long: nearly every example is cut
    _assert_same(model, cut, extract_id, regression)


def test_packing_indices():
    p = Packing.of([[5, 1, 9], [7, 9], [2, 3, 4, 9]], extract_id=9)
    assert p.lengths == [3, 2, 4] and p.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert p.extract.tolist() == [2, 4, 8]
    assert p.lm_inputs.tolist() == [0, 1, 3, 5, 6, 7] and p.lm_rows.tolist() == [0, 0, 1, 2, 2, 2]
    assert p.lm_counts.tolist() == [2.0, 1.0, 3.0]


def test_a_packed_row_refuses_what_it_cannot_hold(pretrained, shared_data):
    model, enc, extract_id, regression = _encoded("sst2", pretrained, shared_data)
    b = collate_packed(enc[:3], extract_id, regression)
    wrong = dataclasses.replace(b.packing, lengths=[*b.packing.lengths[:-1], b.packing.lengths[-1] + 1])
    with pytest.raises(ValueError, match="packed row"):
        model.gpt(b.ids, packing=wrong)


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_shared_prefixes_score_what_full_sequences_do(task_name, pretrained, shared_data):
    # Evaluation: each example's common prefix (Story Cloze: the story before the endings) runs once.
    model, enc, extract_id, regression = _encoded(task_name, pretrained, shared_data)
    model.eval()
    with torch.no_grad():
        padded = collate(enc[:8], regression)
        want, _ = model(padded.ids, padded.n_seqs)
        shared = collate_shared(enc[:8], extract_id, regression)
        got, _ = model(shared.ids, shared.n_seqs, shared.packing)
    torch.testing.assert_close(got, want, **TOL)
    assert torch.equal(model.head.predict(got), model.head.predict(want))
    if task_name == "storycloze":  # the story is read once, not once per ending
        assert shared.packing.tokens < 0.75 * padded.mask.sum()


def _shared_equals_padded(model, items, extract_id, regression):
    """Head outputs of the shared-prefix row equal the padded batch's (fp32, 1e-5), and so do the predictions."""
    model.eval()
    with torch.no_grad():
        padded = collate(items, regression)
        want, _ = model(padded.ids, padded.n_seqs)
        shared = collate_shared(items, extract_id, regression)
        got, _ = model(shared.ids, shared.n_seqs, shared.packing)
    torch.testing.assert_close(got, want, **TOL)
    assert torch.equal(model.head.predict(got), model.head.predict(want))
    return padded, shared


def test_race_passages_are_read_once_and_score_what_full_sequences_do(pretrained):
    # RACE's passage and question are the same for the four answers: one copy of them in the row, every answer
    # attending to it in the same call.
    model, enc, extract_id, regression = _encoded("race", pretrained, None, data_dir=RACE)
    assert len(enc) >= 4 and all(len(e.seqs) == 4 for e in enc)
    padded, shared = _shared_equals_padded(model, enc, extract_id, regression)
    assert shared.packing.tokens < 0.6 * padded.mask.sum()


def test_predict_on_real_story_cloze_rows_equals_the_padded_reference(pretrained, shared_data):
    # What `gpt1 eval` and the per-epoch dev scoring run: length-sorted batches, packed with shared stories and
    # filled to the padded batch's positions, through predict; against the padded layout, batch by batch.
    model, enc, extract_id, regression = _encoded("storycloze", pretrained, shared_data, n=40)
    preds, outs = predict(model, iterate(enc, 4, shuffle=False, shared_extract=extract_id), torch.device("cpu"))
    ref_preds, ref_outs = predict(model, iterate(enc, 4, shuffle=False), torch.device("cpu"))
    assert preds == ref_preds
    torch.testing.assert_close(torch.tensor(outs), torch.tensor(ref_outs), **TOL)
    assert len(filled_batches(enc, 4)) < len(enc) / 4  # filled: fewer, fuller batches than four examples each


def test_filled_batches_cover_every_example_once_within_the_padded_positions(pretrained, shared_data):
    _, enc, _, _ = _encoded("storycloze", pretrained, shared_data, n=60)
    batches = filled_batches(enc, 4)
    assert sorted(i for b in batches for i in b) == list(range(len(enc)))
    order = [i for b in batches for i in b]
    assert [enc[i].length for i in order] == sorted((e.length for e in enc), reverse=True)
    for b in batches[:-1]:
        first = enc[b[0]]
        tokens = sum(shared_tokens(enc[i]) for i in b)
        assert len(b) >= 4 and (len(b) == 4 or tokens <= min(4 * len(first.seqs) * first.length, FILL_TOKENS))


def test_shared_grid_mask_is_a_kv_cache_continuation_per_answer():
    # Two examples: prefix [10, 11] with answers [12] and [13, 14]; prefix [20] with answer [21, 22].
    ids, packing = Packing.shared([[10, 11], [20]], [[[12], [13, 14]], [[21, 22]]], extract_id=99)
    assert ids == [10, 11, 12, 13, 14, 20, 21, 22]
    g = SharedGrid.of(packing.lengths, packing.parents)
    assert g.cells.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 5, 5]]
    m = g.mask[:, 0].int().tolist()
    assert m[0] == [
        [1, 0, 0, 0, 0],  # prefix: causal within itself
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # answer [12]: the prefix and itself
        [1, 1, 0, 1, 0],  # answer [13, 14]: the prefix, not [12], and causally itself
        [1, 1, 0, 1, 1],
    ]
    assert m[1][:3] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert all(row[i] == 1 for i, row in enumerate(m[1]))  # pads see themselves: no empty softmax row
    flat = g.cells.view(-1)[g.back]
    assert flat.tolist() == list(range(len(ids)))  # the way back puts every token where it came from


def test_the_last_block_computes_only_the_rows_read(pretrained, shared_data):
    model, enc, extract_id, regression = _encoded("storycloze", pretrained, shared_data)
    model.eval()
    b = collate_shared(enc[:6], extract_id, regression)
    with torch.no_grad():
        full = model.gpt(b.ids, packing=b.packing)
        some = final_states_at(model.gpt, b.ids, b.packing, b.packing.extract)
    torch.testing.assert_close(some[0], full[0].index_select(0, b.packing.extract), **TOL)


# --------------------------------------------------------------------------------------------- shared-prefix training


def _full_rows(packing: Packing) -> torch.Tensor:
    """Row indices of every full sequence (its prefix, then its answer) of a shared-prefix row, end to end: where
    the packed row of the same sequences holds each of its tokens."""
    starts = [0]
    for n in packing.lengths[:-1]:
        starts.append(starts[-1] + n)
    return torch.tensor(
        [starts[seg] + j for pair in packing.sequences.tolist() for seg in pair for j in range(packing.lengths[seg])]
    )


def _assert_shared_trains_as_packed(model, items, extract_id, regression, kernel_mode, monkeypatch):
    """With dropout off, a shared-prefix training row computes what the packed row computes: head outputs,
    per-sequence LM losses (so the total loss), every full sequence's hidden states and every gradient."""
    from gptcli.model import kernels
    from gptcli.model.kernels import attention as written_out

    kernels.set_kernels(kernel_mode)
    calls = []
    real = written_out.masked_attention
    monkeypatch.setattr(written_out, "masked_attention", lambda *a: calls.append(1) or real(*a))
    packed = _run(model, collate_packed(items, extract_id, regression), packed=True)
    batch = collate_shared(items, extract_id, regression)
    shared = _run(model, batch, packed=True)
    # The kernel path is what --kernels auto trains with; reference is SDPA with the grid's mask.
    assert bool(calls) == (kernel_mode == "auto")
    torch.testing.assert_close(shared[0], packed[0], **TOL)
    torch.testing.assert_close(shared[1], packed[1], **TOL)
    torch.testing.assert_close(shared[2].index_select(0, _full_rows(batch.packing)), packed[2], **TOL)
    assert shared[3].keys() == packed[3].keys()
    for k in packed[3]:
        torch.testing.assert_close(shared[3][k], packed[3][k], **TOL, msg=k)
    return batch


@pytest.mark.parametrize("kernel_mode", ["auto", "reference"])
def test_a_shared_prefix_training_row_of_real_story_cloze_rows_equals_the_packed_one(
    kernel_mode, pretrained, shared_data, monkeypatch
):
    model, enc, extract_id, regression = _encoded("storycloze", pretrained, shared_data)
    batch = _assert_shared_trains_as_packed(model, enc[:8], extract_id, regression, kernel_mode, monkeypatch)
    assert batch.packing.tokens < 0.75 * sum(len(s) for e in enc[:8] for s in e.seqs)  # the stories run once


@pytest.mark.parametrize("kernel_mode", ["auto", "reference"])
@pytest.mark.parametrize("n_ctx", [None, 40], ids=["whole", "cut-to-n_ctx"])
def test_a_shared_prefix_training_row_of_race_equals_the_packed_one(kernel_mode, n_ctx, pretrained, monkeypatch):
    # Four answers per example behind a passage and a question; at n_ctx 40 the longest examples are cut (the
    # passage's tail goes) so that their longest answer's sequence holds exactly n_ctx tokens.
    model, enc, extract_id, regression = _encoded("race", pretrained, None, data_dir=RACE, n_ctx=n_ctx)
    if n_ctx is not None:
        assert sum(max(len(s) for s in e.seqs) == n_ctx for e in enc) >= 2
    batch = _assert_shared_trains_as_packed(model, enc, extract_id, regression, kernel_mode, monkeypatch)
    assert batch.packing.span == max(e.length for e in enc)


def test_shared_training_targets_are_every_full_sequences():
    # Prefix [10, 11] with answers [12] and [13, 14]; prefix [20] with answer [21, 22]. Row: 10 11 12 13 14 20 21 22.
    _, p = Packing.shared([[10, 11], [20]], [[[12], [13, 14]], [[21, 22]]], extract_id=99)
    pairs = sorted(zip(p.lm_inputs.tolist(), p.lm_targets.tolist(), p.lm_rows.tolist()))
    # The prefix's own target once (segment 0); its last token once per answer, predicting that answer's first.
    assert pairs == [(0, 1, 0), (1, 2, 1), (1, 3, 2), (3, 4, 2), (5, 6, 4), (6, 7, 4)]
    assert p.sequences.tolist() == [[0, 1], [0, 2], [3, 4]]  # (prefix segment, answer segment) per full sequence
    assert p.lm_counts.tolist() == [2.0, 3.0, 2.0]  # 10 11 12 → 2 targets; 10 11 13 14 → 3; 20 21 22 → 2
    moved = p.to("cpu")
    assert torch.equal(moved.lm_targets, p.lm_targets) and torch.equal(moved.sequences, p.sequences)


def test_with_dropout_the_answers_share_the_prefixs_masks(pretrained, shared_data):
    # The deviation --layout shared makes: the prefix runs once, so with dropout on every answer's sequence sees the
    # same dropped units on the prefix's positions (here: identical prefix states for both endings), where the
    # packed layout draws each sequence's own.
    model, enc, extract_id, regression = _encoded("storycloze", pretrained, shared_data)
    for m in model.gpt.modules():
        for name in ("p", "attn_pdrop"):
            if hasattr(m, name) and isinstance(getattr(m, name), float):
                setattr(m, name, 0.3)
    items = enc[:2]
    shared = collate_shared(items, extract_id, regression)
    packed = collate_packed(items, extract_id, regression)
    cut = shared.packing.lengths[0]  # the first example's prefix
    h_shared = model.gpt(shared.ids, packing=shared.packing)[0].index_select(0, _full_rows(shared.packing))
    h_packed = model.gpt(packed.ids, packing=packed.packing)[0]
    n0, n1 = (len(s) for s in items[0].seqs)
    for h, same in ((h_shared, True), (h_packed, False)):
        first, second = h[:cut], h[n0 : n0 + cut]
        assert torch.equal(first, second) is same
    model.eval()  # without dropout the packed prefixes agree too: the difference above is the masks
    with torch.no_grad():
        h = model.gpt(packed.ids, packing=packed.packing)[0]
    torch.testing.assert_close(h[:cut], h[n0 : n0 + cut], **TOL)


@pytest.mark.parametrize("kernel_mode", ["auto", "reference"])
def test_shared_training_with_dropout_learns(kernel_mode, pretrained, shared_data):
    # Dropout on, the task loss plus λ·LM: a few steps on one Story Cloze batch lower the loss, through the
    # written-out attention's dropout (auto) and SDPA's with the grid's mask (reference).
    from gptcli.model import kernels
    from gptcli.train.finetune_job import TaskLoss

    kernels.set_kernels(kernel_mode)
    model, enc, extract_id, regression = _encoded("storycloze", pretrained, shared_data)
    for m in model.gpt.modules():
        for name in ("p", "attn_pdrop"):
            if hasattr(m, name) and isinstance(getattr(m, name), float):
                setattr(m, name, 0.1)
    model.head.drop_p = 0.1
    batch, loss_fn = collate_shared(enc[:8], extract_id, regression), TaskLoss(0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grid_gathers_whole_token_rows_and_back_exactly(dtype):
    """_ToGrid and _FromGrid (whole-row gathers, the grid a permuted view) give the values and gradients of plain
    indexing per head, the pad cells' gradient zero as attention leaves it (Grid's docstring)."""
    from gptcli.model.packed import Grid, _FromGrid, _ToGrid

    torch.manual_seed(0)
    lengths, H, hd = [5, 1, 9, 3], 2, 4
    g = Grid.of(lengths)
    G, W = g.cells.shape
    N = sum(lengths)
    real = torch.zeros(G * W, dtype=torch.bool)
    real[g.back] = True
    x = torch.randn(N, 3, H, hd).to(dtype).requires_grad_()
    grid = _ToGrid.apply(x, g.cells, g.back)
    expected = x[g.cells].permute(2, 0, 3, 1, 4)  # (3, G, H, W, hd)
    assert grid.shape == expected.shape and torch.equal(grid, expected)
    upstream = torch.randn(expected.shape).to(dtype) * real.view(1, G, 1, W, 1)  # zero at pad cells
    (dx,) = torch.autograd.grad(grid, x, upstream)
    (dx_ref,) = torch.autograd.grad(expected, x, upstream)
    assert torch.equal(dx, dx_ref)

    y = torch.randn(G, H, W, hd).to(dtype).requires_grad_()
    rows = _FromGrid.apply(y, g.back)
    expected = y.transpose(1, 2).reshape(G * W, H, hd)[g.back]
    assert torch.equal(rows, expected)
    upstream = torch.randn(N, H, hd).to(dtype)
    (dy,) = torch.autograd.grad(rows, y, upstream)
    (dy_ref,) = torch.autograd.grad(expected, y, upstream)
    assert torch.equal(dy, dy_ref)
