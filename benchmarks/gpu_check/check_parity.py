"""KV-cache parity: cached decoding and scoring against full forward passes, in fp32 and bf16."""

from __future__ import annotations

from typing import Any

from .context import Ctx, Failed
from .models import build
from .registry import check


@check("kv_cache_parity", 120, "generation and scoring with the KV cache against without, fp32 and bf16")
def check_kv_cache_parity(ctx: Ctx) -> str:
    from gptcli.system.runtime import autocast

    model = build(ctx).eval()
    tol = {"fp32": 2e-3, "bf16": 6e-2}  # logits relative to their largest magnitude; log-probabilities per token
    out: dict[str, Any] = {}
    for precision in ("fp32", "bf16"):
        with autocast(ctx.device, precision):  # type: ignore[arg-type]
            out[precision] = {**logit_parity(ctx, model), **generate_parity(ctx, model)}
        out[precision].update(scoring_parity(ctx, model, precision))
        ctx.record(**out, tolerance=tol)
    bad = [
        f"{p} {k} {v[k]:.2e}"
        for p, v in out.items()
        for k in ("logits_rel_diff", "score_diff_per_token")
        if v[k] > tol[p]
    ]
    if bad:
        raise Failed(f"cached and uncached paths disagree beyond the tolerance: {', '.join(bad)}")
    return ", ".join(
        f"{p}: logits {v['logits_rel_diff']:.1e}, scores {v['score_diff_per_token']:.1e}/token, "
        f"greedy tokens {'equal' if v['greedy_equal'] else 'differ'}"
        for p, v in out.items()
    )


def logit_parity(ctx: Ctx, model) -> dict[str, Any]:
    """Logits at every new position, decoded one token at a time with the cache against one full forward pass."""
    import torch

    from gptcli.model.build import new_cache

    prompt, steps = 16, 24
    ids = torch.randint(0, model.config.vocab_size, (1, prompt + steps), generator=torch.Generator().manual_seed(1))
    ids = ids.to(ctx.device)
    with torch.no_grad():
        dtype = torch.get_autocast_dtype(ctx.device.type) if torch.is_autocast_enabled(ctx.device.type) else None
        cache = new_cache(model, 1, device=ctx.device, dtype=dtype or torch.float32, length=prompt + steps)
        cached = [model.lm_logits(model(ids[:, :prompt], cache)[:, -1:])]
        for i in range(prompt, prompt + steps - 1):
            cached.append(model.lm_logits(model(ids[:, i : i + 1], cache)))
        full = model.lm_logits(model(ids))[:, prompt - 1 : prompt + steps - 1]
    c = torch.cat(cached, dim=1).float()
    f = full.float()
    return {"logits_rel_diff": float((c - f).abs().max() / f.abs().max()), "positions": steps}


def generate_parity(ctx: Ctx, model) -> dict[str, Any]:
    from gptcli.model.generate import SamplingConfig, generate

    prompt = list(range(1, 17))
    runs = {
        use: generate(model, prompt, SamplingConfig(max_new_tokens=24, greedy=True, use_cache=use))
        for use in (True, False)
    }
    first = next((i for i, (a, b) in enumerate(zip(runs[True], runs[False])) if a != b), None)
    # Random weights give near-tied logits, so a greedy token may flip on a rounding difference; the logits above
    # are the test, this is a figure.
    return {"greedy_equal": runs[True] == runs[False], "greedy_first_difference": first}


def scoring_parity(ctx: Ctx, model, precision: str) -> dict[str, Any]:
    """score() through its cached path (a shared 80-token context) against the same requests as plain rows."""
    import torch

    from gptcli.eval.scoring import Request, score

    g = torch.Generator().manual_seed(2)
    vocab = model.config.vocab_size
    context = torch.randint(0, vocab, (80,), generator=g).tolist()
    reqs = [Request.of(context, torch.randint(0, vocab, (5,), generator=g).tolist()) for _ in range(4)]
    cached = score(model, reqs, precision=precision, cache_min_context=8)  # type: ignore[arg-type]
    plain = score(model, reqs, precision=precision, cache_min_context=10**9)  # type: ignore[arg-type]
    diff = max(abs(a.logprob - b.logprob) / max(a.count, 1) for a, b in zip(cached, plain))
    return {
        "score_diff_per_token": diff,
        "scores_cached": [round(s.logprob, 4) for s in cached],
        "scores_plain": [round(s.logprob, 4) for s in plain],
    }
