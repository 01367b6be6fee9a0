"""The fine-tuned model (body + head as one module) and batched prediction in the examples' own order."""

from __future__ import annotations

import pytest
import torch

from gptcli.data.batching import iterate
from gptcli.data.transforms import Encoded
from gptcli.model.classifier import FinetuneModel, predict
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.progress import RecordingProgress

CFG = ModelConfig(vocab_size=40, n_special=3, n_ctx=32, n_embd=32, n_layer=2, n_head=2, n_inner=64)
S, D, E = 40, 41, 42


def _model(kind: str = "classification", n_labels: int = 3) -> FinetuneModel:
    torch.manual_seed(0)
    return FinetuneModel(GPT(CFG), TaskHead(HeadConfig(kind, CFG.n_embd, n_labels=n_labels, extract_id=E))).eval()


def _examples(n: int) -> list[Encoded]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        body = torch.randint(0, 40, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
        out.append(Encoded([[S, *body, E]], label=i % 3, index=i))
    return out


def test_one_state_dict_for_body_and_head():
    keys = _model().state_dict().keys()
    assert any(k.startswith("gpt.") for k in keys) and {"head.linear.weight", "head.linear.bias"} <= set(keys)


def test_predict_restores_order_and_matches_one_by_one():
    model, enc = _model(), _examples(11)
    rec = RecordingProgress()
    preds, outs = predict(model, iterate(enc, 4, shuffle=False), torch.device("cpu"), progress=rec)
    assert len(preds) == len(outs) == 11 and all(len(o) == 3 for o in outs)
    assert [a["n"] for a in rec.of("advance")] == [4, 4, 3]
    for e in enc:  # batched with padding and sorted by length == each example alone
        p, o = predict(model, iterate([Encoded(e.seqs, e.label, 0)], 1, shuffle=False), torch.device("cpu"))
        assert p[0] == preds[e.index] and o[0] == pytest.approx(outs[e.index], abs=1e-5)


def test_regression_outputs_are_one_column_scores_in_range():
    model = _model("regression", 1)
    enc = [Encoded([e.seqs[0], e.seqs[0]], 2.5, e.index) for e in _examples(5)]  # both orders, as STS-B
    preds, outs = predict(model, iterate(enc, 2, shuffle=False, regression=True), torch.device("cpu"))
    assert all(0.0 <= p <= 5.0 for p in preds) and all(len(o) == 1 for o in outs)


def test_one_autocast_region_for_every_batch_computes_what_one_per_batch_does():
    # predict keeps autocast's bf16 copies of the weights from the first batch to the last: the same casts, once.
    from gptcli.system.runtime import autocast

    model, enc = _model(), _examples(11)
    cpu = torch.device("cpu")
    _, outs = predict(model, iterate(enc, 4, shuffle=False), cpu, precision="bf16")
    for batch in iterate(enc, 4, shuffle=False):
        with torch.no_grad(), autocast(cpu, "bf16"):
            out, _ = model(batch.ids, batch.n_seqs)
        for k, i in enumerate(batch.index.tolist()):
            assert outs[i] == [round(v, 6) for v in out.float()[k].tolist()]
