"""The CPU attention kernel's paths compute SDPA's function; its table picks the measured one
(gptcli/model/kernels/attention.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compiled_helpers import assert_runs_eagerly_between_graphs
from kernel_helpers import applied

import gptcli.model.kernels.attention as attention
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.kernels.attention import PATHS, attention_path, causal_attention

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 8 queries: the chunked path runs several, ragged ones at these test lengths (37 → 9, 9, 9, 10)."""
    monkeypatch.setattr(attention, "CHUNK_ROWS", 8)


@pytest.fixture(params=["compiled", "pytorch"])
def softmax_backward(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """The two ways the written-out backward takes the softmax's gradient: the compiled pass (softmax.cpp, where
    built with AVX-512) and PyTorch's ops (everywhere else)."""
    if request.param == "pytorch":
        monkeypatch.setattr(attention, "_softmax_library", lambda x: None)
    return request.param


def _fused_or_skip() -> None:
    if attention._fused_library("cpu", torch.float32) is None:
        pytest.skip("the fused path needs the compiled library with AVX-512 or AVX2 and a BLAS sgemm")


def _qkv(t: int, dtype: torch.dtype = torch.float32, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, t, d, generator=g).to(dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", [1, 3, 5, 37])
def test_every_path_is_sdpa_without_dropout_fp32(path: str, t: int) -> None:
    """Outputs and gradients, including lengths shorter than one block."""
    if path == "fused":
        _fused_or_skip()
    q, k, v = _qkv(t)
    ref = causal_attention(q, k, v, 0.0, path="sdpa")
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    out = causal_attention(q, k, v, 0.0, path=path)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", [p for p in PATHS if p != "fused"])  # fused: fp32 only (FUSED_DTYPES)
def test_every_path_is_sdpa_without_dropout_bf16(path: str) -> None:
    q, k, v = _qkv(64, torch.bfloat16, d=16)
    ref = causal_attention(q, k, v, 0.0, path="sdpa").float()
    torch.testing.assert_close(causal_attention(q, k, v, 0.0, path=path).float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("path", PATHS)
def test_dropout_acts_on_the_probabilities(path: str) -> None:
    """With v the identity (d = T), the output IS the dropped-out probability matrix: nothing above the diagonal,
    a share p of the visible entries zeroed, the rest the softmax scaled by 1/(1 - p) — the paper's attention dropout,
    on every path."""
    if path == "fused":
        _fused_or_skip()
    t, p = 64, 0.25
    q, k, _ = _qkv(t, d=t)
    v = torch.eye(t).expand(2, 3, t, t)
    with torch.no_grad():
        probs = causal_attention(q, k, v, 0.0, path="sdpa")
        torch.manual_seed(0)
        out = causal_attention(q, k, v, p, path=path)
    visible = torch.ones(t, t, dtype=torch.bool).tril().expand_as(out)
    assert not out[~visible].any()
    kept = out[visible] != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.02  # 12,480 visible entries: the std of the share is 0.004
    torch.testing.assert_close(out[visible][kept], probs[visible][kept] / (1 - p))


def test_dispatch_table() -> None:
    assert attention_path("cuda", torch.bfloat16, 0.1, 512) == "sdpa"  # flash kernels fuse the dropout
    assert attention_path("cuda", torch.float32, 0.0, 512) == "sdpa"
    assert attention_path("cpu", torch.float16, 0.1, 512) == "sdpa"  # not measured: the library's default
    long, short = attention.CHUNK_MIN_LEN, attention.CHUNK_MIN_LEN - 1
    fused = attention._fused_library("cpu", torch.float32) is not None
    for (dtype, dropout), path in attention.CPU_PATHS.items():
        assert path in PATHS
        if fused and dtype in attention.FUSED_DTYPES:  # every length, with or without dropout
            path = short_path = "fused"
        else:
            short_path = "plain"  # measured: never slower
        assert attention_path("cpu", dtype, 0.1 if dropout else 0.0, long) == path
        assert attention_path("cpu", dtype, 0.1 if dropout else 0.0, short) == short_path
    with pytest.raises(ValueError, match="unknown attention path"):
        causal_attention(*_qkv(4), 0.0, path="nope")


def test_the_model_takes_the_dispatched_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPT's training forward goes through the dispatch (what the benchmark measured is what runs)."""
    from gptcli.model.kernels import set_kernels

    set_kernels("auto")
    seen: list[tuple[str, torch.dtype, float, int]] = []

    def spy(device_type: str, dtype: torch.dtype, dropout: float, seq_len: int) -> str:
        seen.append((device_type, dtype, dropout, seq_len))
        return "chunked"

    monkeypatch.setattr(attention, "attention_path", spy)
    model = applied(GPT(ModelConfig(vocab_size=50, n_ctx=16, n_embd=16, n_layer=2, n_head=2, n_inner=32)).train())
    model(torch.randint(0, 50, (2, 16)))
    assert seen == [("cpu", torch.float32, 0.1, 16)] * 2


def test_one_mask_serves_every_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """Masks are slices of one per-device, per-dtype mask as long as the longest sequence (not one per length),
    where PyTorch's softmax runs (the compiled one applies the causal mask itself)."""
    monkeypatch.setattr(attention, "_softmax_library", lambda x: None)
    attention._CAUSAL_BIASES.clear()
    for t in (5, 300, 17, 300, 2):
        causal_attention(*_qkv(t), 0.0, path="plain")
    assert [m.size(0) for m in attention._CAUSAL_BIASES.values()] == [300]
    want = torch.zeros(17, 17).masked_fill(torch.ones(17, 17, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(attention._causal_bias(17, torch.device("cpu"), torch.float32), want)


def test_bf16_autocast_uses_a_bf16_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "_softmax_library", lambda x: None)
    attention._CAUSAL_BIASES.clear()
    q, k, v = _qkv(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = causal_attention(q, k, v, 0.0, path="chunked")
    assert out.dtype == torch.bfloat16
    assert [key[1] for key in attention._CAUSAL_BIASES] == [torch.bfloat16]


def _reference(q, k, v, p: float, blocks: list[tuple[int, int]]) -> torch.Tensor:
    """The written-out attention by autograd over plain ops, drawing its dropout masks as the model does (same
    shapes, same order): the reference for the hand-written backward."""
    B, H, t, d = q.shape
    q, k, v = (x.reshape(B * H, t, d) for x in (q, k, v))
    outs = []
    for a, b in blocks:
        s = q[:, a:b] @ k[:, :b].transpose(1, 2) / d**0.5
        s = s.masked_fill(torch.ones(b - a, b, dtype=torch.bool).triu(a + 1), float("-inf"))
        probs = torch.softmax(s, dim=-1)
        if p:
            probs = probs * attention.Mask(probs.shape, p, probs.device, probs.dtype).dense() / (1 - p)
        outs.append(probs @ v[:, :b])
    return torch.cat(outs, dim=1).view(B, H, t, d)


@pytest.mark.parametrize("path", ["plain", "chunked"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_written_out_gradients_are_autograds(softmax_backward, path: str, p: float) -> None:
    """The written-out paths' hand-written backward (per-block accumulation into the key and value gradients,
    dropout masks reused) gives autograd's gradients of the same computation, dropout included."""
    t = 37
    blocks = [(0, 9), (9, 18), (18, 27), (27, 37)] if path == "chunked" else [(0, t)]
    q, k, v = _qkv(t, seed=2)
    upstream = torch.randn(2, 3, t, 8)
    torch.manual_seed(5)
    out = causal_attention(q, k, v, p, path=path)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    torch.manual_seed(5)
    ref = _reference(q, k, v, p, blocks)
    grads_ref = torch.autograd.grad((ref * upstream).sum(), (q, k, v))
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("path", ["plain", "chunked"])
def test_bf16_written_out_gradients_with_dropout_are_autograds(softmax_backward, path: str) -> None:
    """bf16 takes another backward through the dropout than fp32 (the mask applied to dp, then the softmax's own
    backward): against autograd over the same bf16 ops and masks, to bf16 rounding."""
    t, p = 37, 0.3
    blocks = [(0, 9), (9, 18), (18, 27), (27, 37)] if path == "chunked" else [(0, t)]
    q, k, v = _qkv(t, torch.bfloat16, seed=6)
    upstream = torch.randn(2, 3, t, 8).to(torch.bfloat16)
    torch.manual_seed(7)
    out = causal_attention(q, k, v, p, path=path)
    grads = torch.autograd.grad((out.float() * upstream.float()).sum(), (q, k, v))
    torch.manual_seed(7)
    ref = _reference(q, k, v, p, blocks)
    grads_ref = torch.autograd.grad((ref.float() * upstream.float()).sum(), (q, k, v))
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def test_written_out_backward_passes_gradcheck() -> None:
    """Finite differences in float64 (no dropout: gradcheck calls the function many times)."""
    q, k, v = (x.detach().double().requires_grad_() for x in _qkv(19, d=4, seed=3))
    assert torch.autograd.gradcheck(lambda q, k, v: causal_attention(q, k, v, 0.0, path="chunked"), (q, k, v))


def test_bf16_gradients_match_sdpa(softmax_backward) -> None:
    q, k, v = _qkv(40, torch.bfloat16, d=16, seed=4)
    upstream = torch.randn(2, 3, 40, 16).to(torch.bfloat16)
    want = torch.autograd.grad((causal_attention(q, k, v, 0.0, path="sdpa") * upstream).sum(), (q, k, v))
    got = torch.autograd.grad((causal_attention(q, k, v, 0.0, path="chunked") * upstream).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), atol=6e-2, rtol=6e-2)


# --- the dense per-block layout of bf16 (oneDNN's products: _DenseBlockedAttention) ---------------------------------


def _projection(t: int, dtype: torch.dtype, seed: int, heads: int = 3, d: int = 8) -> torch.Tensor:
    """A fused q, k, v projection (2, t, 3·heads·d), a leaf: what the model's attention reads its inputs from."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, t, 3 * heads * d, generator=g).to(dtype).requires_grad_()


def _stacked(qkv: torch.Tensor, heads: int = 3) -> torch.Tensor:
    """q, k, v as (3, B, H, T, d) strided views of ``qkv``, as the model passes them."""
    B, T, C3 = qkv.shape
    return qkv.view(B, T, 3, heads, C3 // 3 // heads).permute(2, 0, 3, 1, 4)


@pytest.mark.parametrize("path", ["plain", "chunked"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_bf16_dense_layout_computes_the_strided_layouts_attention(softmax_backward, path: str, p: float) -> None:
    """The dense per-block layout (bf16) against _BlockedAttention over the same bf16 inputs and dropout masks: the
    output bit for bit (the same products on the same values), the gradients to bf16 rounding (the key and value
    gradients are summed from fresh per-block products instead of accumulated in place)."""
    qkv = _projection(37, torch.bfloat16, seed=9)
    upstream = torch.randn(2, 3, 37, 8).to(torch.bfloat16)
    torch.manual_seed(3)
    out = attention.stacked_causal_attention(_stacked(qkv), p, path=path)
    grad = torch.autograd.grad((out.float() * upstream.float()).sum(), qkv)[0]
    torch.manual_seed(3)
    bounds = (0, 9, 18, 27, 37) if path == "chunked" else (0, 37)
    q, k, v = (x.reshape(6, 37, 8) for x in _stacked(qkv).unbind(0))
    ref = attention._BlockedAttention.apply(q, k, v, attention._causal_bias(37, q.device, q.dtype), p, bounds)
    grad_ref = torch.autograd.grad((ref.view(2, 3, 37, 8).float() * upstream.float()).sum(), qkv)[0]
    assert torch.equal(out, ref.view(2, 3, 37, 8))
    torch.testing.assert_close(grad.float(), grad_ref.float(), atol=3e-2, rtol=3e-2)


def test_dense_layout_gradient_lands_in_the_projections_layout() -> None:
    """The input gradient comes back with the strides of the fused projection's view: autograd then hands it to
    the projection as it is, with no transpose or concatenation copied (the point of the layout)."""
    qkv = _projection(37, torch.bfloat16, seed=10)
    x = _stacked(qkv)
    strides = []
    x.register_hook(lambda g: strides.append(g.stride()))
    attention.stacked_causal_attention(x, 0.1, path="chunked").float().sum().backward()
    assert strides == [x.stride()]
    assert qkv.grad.is_contiguous()


@pytest.mark.parametrize("path", ["plain", "chunked"])
def test_dense_layout_passes_gradcheck(path: str) -> None:
    """Finite differences in float64, which takes the dense layout too (every dtype but fp32 does), from the
    projection's strided views."""
    qkv = _projection(19, torch.float64, seed=11, d=4)
    assert torch.autograd.gradcheck(lambda y: attention.stacked_causal_attention(_stacked(y), 0.0, path=path), (qkv,))


def test_model_attention_reads_the_projection_in_place() -> None:
    """gptcli.model.attention.causal_self_attention (the model's call) equals SDPA over the split projection, in
    outputs and the projection's gradient, kernels on (dense layout in bf16) and off."""
    from gptcli.model import attention as model_attention

    qkv = _projection(37, torch.bfloat16, seed=12)
    upstream = torch.randn(2, 37, 24).to(torch.bfloat16)
    out = model_attention.causal_self_attention(qkv, 3)
    grad = torch.autograd.grad((out.float() * upstream.float()).sum(), qkv)[0]
    q, k, v = (x.view(2, 37, 3, 8).transpose(1, 2) for x in qkv.split(24, dim=2))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 37, 24)
    grad_want = torch.autograd.grad((want.float() * upstream.float()).sum(), qkv)[0]
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(grad.float(), grad_want.float(), atol=6e-2, rtol=6e-2)


# --- the fused path (fp32: fused_attention.cpp) ---------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 64), (2, 3, 37, 8), (1, 2, 130, 32), (2, 2, 200, 64)])
def test_fused_is_float64_sdpa(monkeypatch: pytest.MonkeyPatch, rows: int, shape: tuple[int, ...]) -> None:
    """Outputs and the projection's gradient against SDPA in float64, at ragged lengths and query blocks of one row,
    an odd count and the default: fp32 roundoff (the products are the BLAS's, the exponential vexp.h's)."""
    _fused_or_skip()
    monkeypatch.setattr(attention, "FUSED_ROWS", rows)
    B, H, T, d = shape
    qkv = _projection(T, torch.float32, seed=T + rows, heads=H, d=d)[:B]
    upstream = torch.randn(B, H, T, d)
    out = attention.stacked_causal_attention(_stacked(qkv, H), 0.0, path="fused")
    grad = torch.autograd.grad((out * upstream).sum(), qkv)[0]
    x64 = qkv.detach().double().requires_grad_()
    want = F.scaled_dot_product_attention(*_stacked(x64, H).unbind(0), is_causal=True)
    grad_want = torch.autograd.grad((want * upstream.double()).sum(), x64)[0]
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), grad_want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t", [37, 128])
def test_fused_dropout_is_a_dense_masks(monkeypatch: pytest.MonkeyPatch, t: int) -> None:
    """With dropout, the fused path computes the attention under the mask a (B·H, T, T) :class:`Mask` of the same
    seed draws (the bits of ``mask_bits.h`` at each probability's flat index), scaled by 1/(1 − p): outputs and
    gradients against autograd over that dense mask, in float64. Query blocks of 16 rows: several per length."""
    _fused_or_skip()
    from gptcli.model.kernels.dropout import Mask

    monkeypatch.setattr(attention, "FUSED_ROWS", 16)
    p, H, d = 0.3, 3, 8
    qkv = _projection(t, torch.float32, seed=t)
    upstream = torch.randn(2, H, t, d)
    torch.manual_seed(4)
    out = attention.stacked_causal_attention(_stacked(qkv), p, path="fused")
    grad = torch.autograd.grad((out * upstream).sum(), qkv)[0]
    torch.manual_seed(4)
    keep = Mask((2 * H, t, t), p, "cpu", torch.float32).dense().double().view(2, H, t, t)
    x64 = qkv.detach().double().requires_grad_()
    q, k, v = _stacked(x64).unbind(0)
    scores = (q @ k.transpose(-1, -2)) / d**0.5 + torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    want = (torch.softmax(scores, -1) * keep / (1 - p)) @ v
    grad_want = torch.autograd.grad((want * upstream.double()).sum(), x64)[0]
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), grad_want, atol=1e-5, rtol=1e-5)
    visible = keep[torch.ones(t, t, dtype=torch.bool).tril().expand_as(keep)]
    assert abs(1 - visible.mean().item() - p) < 0.05  # the mask drops a share p of what the queries see


def test_fused_gradient_lands_in_the_projections_layout() -> None:
    """As the dense layout's: the input gradient in the fused projection's strides, no copy to assemble it."""
    _fused_or_skip()
    qkv = _projection(37, torch.float32, seed=13)
    x = _stacked(qkv)
    strides = []
    x.register_hook(lambda g: strides.append(g.stride()))
    attention.stacked_causal_attention(x, 0.1, path="fused").sum().backward()
    assert strides == [x.stride()]
    assert qkv.grad.is_contiguous()


def test_fused_is_fp32_causal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 and a grid's own mask never take the fused path (its mask is the causal one, its products sgemm);
    without the library fp32 takes the written-out blocks again."""
    _fused_or_skip()
    qkv = _projection(16, torch.bfloat16, seed=14)
    with pytest.raises(ValueError, match="fused attention path"):
        attention.stacked_causal_attention(_stacked(qkv), 0.0, path="fused")
    calls = []
    monkeypatch.setattr(attention._FusedAttention, "apply", lambda *a: calls.append(a))
    x = _stacked(_projection(16, torch.float32, seed=15))
    bias = torch.zeros(6, 16, 16).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    attention.masked_attention(x, bias, 0.0)
    assert calls == []
    monkeypatch.setattr(attention, "_fused_library", lambda device_type, dtype: None)
    assert attention_path("cpu", torch.float32, 0.1, 512) == attention.CPU_PATHS[(torch.float32, True)]


def test_under_torch_compile_the_fused_path_runs_eagerly_between_graphs() -> None:
    """``--compile``: the fused kernel is an opaque pybind call, marked to run eagerly (as the other kernels)."""
    _fused_or_skip()

    def step(y: torch.Tensor) -> torch.Tensor:
        return attention.stacked_causal_attention(_stacked(y * 2.0), 0.1, path="fused").square().sum()

    assert_runs_eagerly_between_graphs(step, _projection(37, torch.float32, seed=16))


def test_the_fp32_model_trains_through_the_fused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPT's fp32 training step goes through _FusedAttention where it is available (what was measured runs)."""
    _fused_or_skip()
    from gptcli.model.kernels import set_kernels

    set_kernels("auto")
    calls = []
    apply = attention._FusedAttention.apply
    monkeypatch.setattr(attention._FusedAttention, "apply", lambda *a: calls.append(a[1]) or apply(*a))
    model = applied(GPT(ModelConfig(vocab_size=50, n_ctx=16, n_embd=16, n_layer=2, n_head=2, n_inner=32)).train())
    model(torch.randint(0, 50, (2, 16)))[0].sum().backward()
    assert calls == [0.1, 0.1]
    assert all(p.grad is not None for p in model.parameters())


# --- the shared-prefix grid's attention (``--layout shared``: masked_attention) -------------------------------------


def _grid():
    """A shared-prefix grid (gptcli/model/packed.py) of two examples: a 20-token prefix with answers of 9 and 8,
    a 10-token prefix with one of 7 — 37 columns, the second row padded."""
    from gptcli.model.packed import SharedGrid

    return SharedGrid.of([20, 9, 8, 10, 7], [-1, 0, 0, -1, 3])


@pytest.fixture(params=["plain", "chunked"])
def grid_path(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """The path masked_attention takes for the 37-column grid: one block, or (the threshold lowered) blocks of 8."""
    if request.param == "chunked":
        monkeypatch.setattr(attention, "CHUNK_MIN_LEN", 16)
    assert attention.written_out_path("cpu", torch.float32, 0.1, 37) == request.param
    return request.param


def test_masked_attention_is_sdpa_with_the_grids_mask(grid_path: str) -> None:
    g = _grid()
    q, k, v = _qkv(37, seed=6)
    upstream = torch.randn(2, 3, 37, 8)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=g.mask)
    grads_want = torch.autograd.grad((want * upstream).sum(), (q, k, v))
    got = attention.masked_attention(torch.stack((q, k, v)), g.bias(3, torch.float32))
    grads = torch.autograd.grad((got * upstream).sum(), (q, k, v))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, grads_want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_masked_attention_with_dropout_has_autograds_gradients(softmax_backward, grid_path: str) -> None:
    """The hand-written backward with dropout, against autograd over the same ops and the same masks."""
    g, p = _grid(), 0.3
    bias = g.bias(3, torch.float32)
    blocks = [(0, 9), (9, 18), (18, 27), (27, 37)] if grid_path == "chunked" else [(0, 37)]
    q, k, v = _qkv(37, seed=7)
    upstream = torch.randn(2, 3, 37, 8)
    torch.manual_seed(5)
    out = attention.masked_attention(torch.stack((q, k, v)), bias, p)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    torch.manual_seed(5)
    qs, ks, vs = (x.reshape(6, 37, 8) for x in (q, k, v))
    parts = []
    for a, b in blocks:
        probs = torch.softmax(qs[:, a:b] @ ks[:, :b].transpose(1, 2) / 8**0.5 + bias[:, a:b, :b], dim=-1)
        probs = probs * attention.Mask(probs.shape, p, probs.device, probs.dtype).dense() / (1 - p)
        parts.append(probs @ vs[:, :b])
    ref = torch.cat(parts, dim=1).view(2, 3, 37, 8)
    grads_ref = torch.autograd.grad((ref * upstream).sum(), (q, k, v))
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


def test_masked_attention_drops_only_what_a_query_sees() -> None:
    """v the identity: the output is the dropped-out probabilities — zero wherever the grid's mask is (another
    answer, a later position), a share p of the rest zeroed and the others scaled by 1/(1 − p)."""
    g, p = _grid(), 0.25
    q, k, _ = _qkv(37, d=37, seed=8)
    v = torch.eye(37).expand(2, 3, 37, 37)
    with torch.no_grad():
        probs = attention.masked_attention(torch.stack((q, k, v)), g.bias(3, torch.float32))
        torch.manual_seed(0)
        out = attention.masked_attention(torch.stack((q, k, v)), g.bias(3, torch.float32), p)
    visible = g.mask.expand_as(out)
    assert not out[~visible].any()
    kept = out[visible] != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.03
    torch.testing.assert_close(out[visible][kept], probs[visible][kept] / (1 - p))


def test_masked_attention_leaves_unmeasured_dtypes_to_sdpa() -> None:
    q, k, v = _qkv(37, torch.float16)
    assert attention.masked_attention(torch.stack((q, k, v)), _grid().bias(3, torch.float16), 0.1) is None
