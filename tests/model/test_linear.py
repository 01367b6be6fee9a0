"""The linear layers' AMX bf16 training form (gptcli/model/kernels/linear.py, applied as kernels/layers.py's
Linear): autocast's forward and input gradient bit for bit, the weight gradient from a dense transposed operand
within one bf16 rounding of autocast's, taken only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compiled_helpers import assert_runs_eagerly_between_graphs, built_library
from kernel_helpers import applied

from gptcli.model import kernels
from gptcli.model.kernels import linear as amx
from gptcli.model.kernels import native
from gptcli.model.kernels.layers import Linear


@pytest.fixture
def lib():
    return built_library()


@pytest.fixture
def avx512(lib):
    """The AMX form as the model takes it: forced on (``kernels.force_amx``), on a library built with AVX-512."""
    if lib.vector_isa() != "avx512":
        pytest.skip("the library here is not built with AVX-512: the AMX form never runs (autocast's does)")
    kernels.force_amx(True)
    return lib


def _autocast_grads(f, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, g: torch.Tensor):
    """(y, dx, dw, db) of ``f(x, w, b)`` under bf16 autocast against output gradient ``g``."""
    leaves = [t for t in (x, w, b) if t is not None]
    for t in leaves:
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = f(x, w, b)
    y.backward(g)
    return y.detach(), x.grad, w.grad, None if b is None else b.grad


def _ulp_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Within one bf16 rounding of each other, elementwise (the same fp32 sums, each rounded to bf16)."""
    torch.testing.assert_close(a, b, rtol=2.0**-7, atol=1e-6)


@pytest.mark.parametrize(
    "features", [(768, 2304), (96, 40), (40, 96), (64, 64)], ids=["qkv", "narrow", "wide", "square"]
)
@pytest.mark.parametrize("bias", [True, False])
def test_the_amx_form_is_autocasts_linear(avx512, features: tuple[int, int], bias: bool) -> None:
    """Every shape class of ``weight_grad`` (in < out: the input transposed, out < in: the gradient, square:
    autograd's form), a position count no tile divides, a 3-D float32 input as the model hands it over."""
    fan_in, fan_out = features
    torch.manual_seed(0)
    x = torch.randn(3, 101, fan_in, requires_grad=True)
    w = (torch.randn(fan_out, fan_in) * 0.05).requires_grad_()
    b = torch.randn(fan_out).requires_grad_() if bias else None
    g = torch.randn(3, 101, fan_out).bfloat16()

    def ours(x, w, b):
        with torch.autocast("cpu", enabled=False):
            return amx._AmxLinear.apply(x.to(torch.bfloat16), w, b)

    ref = _autocast_grads(F.linear, x, w, b, g)
    got = _autocast_grads(ours, x, w, b, g)
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], ref[0])
    assert torch.equal(got[1], ref[1])
    assert got[2].dtype == torch.float32 and got[2].is_contiguous()
    _ulp_close(got[2], ref[2])
    if bias:  # float32 column sums: autocast's bf16-rounded sum within its rounding, the exact one within fp32's
        assert got[3].dtype == torch.float32
        _ulp_close(got[3], ref[3])
        exact = g.double().reshape(-1, fan_out).sum(0)
        torch.testing.assert_close(got[3].double(), exact, rtol=1e-5, atol=1e-4)
        assert (got[3].double() - exact).abs().max() < (ref[3].double() - exact).abs().max()


def test_the_weight_gradient_is_the_float64_product_to_bf16_rounding(lib) -> None:
    torch.manual_seed(1)
    for fan_in, fan_out in [(32, 80), (80, 32), (48, 48)]:
        g = torch.randn(257, fan_out).bfloat16()
        x = torch.randn(257, fan_in).bfloat16()
        exact = g.double().t() @ x.double()
        for dtype in (torch.float32, torch.bfloat16):
            dw = amx.weight_grad(g, x, dtype)
            assert dw.shape == (fan_out, fan_in) and dw.dtype == dtype and dw.is_contiguous()
            torch.testing.assert_close(dw.double(), exact, rtol=2.0**-7, atol=1e-4)


def test_the_model_s_linear_takes_the_amx_form_only_where_it_applies(avx512) -> None:
    layer = Linear(64, 192)
    x = torch.randn(4, amx.MIN_POSITIONS // 4, 64)

    def grad_fn(x: torch.Tensor, **autocast) -> str:
        with torch.autocast("cpu", **autocast):
            y = layer(x)
        return type(y.grad_fn).__name__

    assert grad_fn(x, dtype=torch.bfloat16) == "_AmxLinearBackward"
    assert grad_fn(x[:, :-1], dtype=torch.bfloat16) != "_AmxLinearBackward"  # too few positions: autocast's
    assert grad_fn(x, dtype=torch.bfloat16, enabled=False) != "_AmxLinearBackward"  # float32: F.linear
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).grad_fn is None
    kernels.force_amx(False)
    assert grad_fn(x, dtype=torch.bfloat16) != "_AmxLinearBackward"
    kernels.force_amx(True)
    kernels.set_kernels("reference")
    try:
        assert grad_fn(x, dtype=torch.bfloat16) != "_AmxLinearBackward"
    finally:
        kernels.set_kernels(None)


def test_a_model_trains_alike_in_either_form(avx512) -> None:
    """The tiny GPT's bf16 loss and gradients with the AMX form against autocast's (the form off: a position
    minimum no batch reaches): the same loss and input gradients, so every parameter's gradient is within one
    bf16 rounding of the other's (the weights' differ by their own products' rounding only)."""
    from gptcli.model.gpt import GPT, preset

    torch.manual_seed(0)
    model = applied(GPT(preset("tiny")).train())
    assert isinstance(model.blocks[0].mlp.fc, Linear)
    idx = torch.randint(0, model.config.vocab_size, (4, 129))

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(2)  # the same dropout masks
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.lm_loss(idx[:, :-1], idx[:, 1:])
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = run()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(amx, "MIN_POSITIONS", 1 << 62)
        ref_loss, ref_grads = run()
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        _ulp_close(grad, ref_grads[name])


def test_the_transposed_helper_returns_a_fresh_tensor_with_or_without_the_library(lib, monkeypatch) -> None:
    """``transposed`` never hands back a view (autograd then adds the embedding's gradient into the AMX head's in
    place), and computes the same copy where the library is not built."""
    x = torch.randn(33, 50).bfloat16()
    for library in (True, False):
        if not library:
            monkeypatch.setattr(native, "library_for", lambda *a: None)
        out = amx.transposed(x, torch.float32, columns=41)
        assert out._base is None and out.is_contiguous() and torch.equal(out, x[:, :41].t().float())
        assert torch.equal(amx.transposed(x), x.t())


def test_under_torch_compile_the_graph_keeps_autocasts_form(avx512) -> None:
    """``--compile``: dynamo traces autocast's ``F.linear`` (``applies`` is false while compiling) and computes
    what the eager AMX form computes."""
    layer = Linear(64, 192)
    x = torch.randn(4, amx.MIN_POSITIONS // 4, 64, requires_grad=True)

    def step(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return layer(x).float().square().mean()

    assert_runs_eagerly_between_graphs(step, x)


@pytest.mark.parametrize("features", [(768, 2304), (96, 40), (64, 64)], ids=["qkv", "narrow", "square"])
def test_the_float32_form_is_autograds_linear_with_column_sums(lib, features: tuple[int, int]) -> None:
    """``_Fp32Linear``: autograd's products bit for bit (output, input and weight gradients), the bias gradient the
    float32 column sums (within float32 rounding of PyTorch's sum); and the model's ``Linear`` takes it in float32
    training only."""
    if lib.vector_isa() != "avx512":
        pytest.skip("the library here is not built with AVX-512: the float32 form never runs")
    fan_in, fan_out = features
    torch.manual_seed(0)
    x = torch.randn(3, 101, fan_in, requires_grad=True)
    layer = Linear(fan_in, fan_out)
    g = torch.randn(3, 101, fan_out)
    grads = []
    for form in (F.linear, amx._Fp32Linear.apply):
        x.grad = layer.weight.grad = layer.bias.grad = None
        y = form(x, layer.weight, layer.bias)
        y.backward(g)
        grads.append((y.detach(), x.grad, layer.weight.grad, layer.bias.grad))
    (y0, dx0, dw0, db0), (y1, dx1, dw1, db1) = grads
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0) and torch.equal(dw1, dw0)
    exact = g.double().reshape(-1, fan_out).sum(0)  # both sums within float32 rounding of the exact one
    for db in (db0, db1):
        torch.testing.assert_close(db.double(), exact, rtol=1e-5, atol=1e-4)
    kernels.set_kernels("auto")
    assert amx.fp32_linear(x, layer.weight, layer.bias) is not None
    with torch.no_grad():
        assert amx.fp32_linear(x, layer.weight, layer.bias) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert amx.fp32_linear(x, layer.weight, layer.bias) is None
    assert amx.fp32_linear(x[:, :1], layer.weight, layer.bias) is None  # 3 positions: autograd's own
