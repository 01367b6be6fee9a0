"""Scoring an LSTM: the shared-context path (its recurrent state run once, repeated for every candidate) gives
what the plain batched path gives, and both equal log-probabilities computed by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptcli.eval.scoring import Request, score
from gptcli.model.lstm import LSTMLM, LSTMConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> LSTMLM:
    torch.manual_seed(1)
    m = LSTMLM(LSTMConfig(vocab_size=40, n_ctx=48, n_embd=16, n_hidden=20, n_layer=2))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def _by_hand(m: LSTMLM, r: Request) -> float:
    ids = torch.tensor([list(r.context) + list(r.continuation)])
    with torch.no_grad():
        lp = F.log_softmax(m.lm_logits(m(ids[:, :-1])).float(), -1)[0]
    n = len(r.context)
    return float(sum(lp[n - 1 + j, t] for j, t in enumerate(r.continuation)))


@pytest.mark.parametrize("cache_min_context", [4, 10_000])
def test_shared_context_state_matches_the_plain_path(cache_min_context):
    m = _model()
    g = torch.Generator().manual_seed(2)
    doc = torch.randint(0, 40, (20,), generator=g).tolist()
    answers = [torch.randint(0, 40, (k,), generator=g).tolist() for k in (1, 3, 5, 2)]
    reqs = [Request.of(doc, a) for a in answers] + [Request.of([3, 4], [5, 6, 7])]
    got = score(m, reqs, batch_size=3, precision="fp32", cache_min_context=cache_min_context)
    for r, s in zip(reqs, got):
        assert s.count == len(r.continuation)
        assert s.logprob == pytest.approx(_by_hand(m, r), abs=1e-4)
