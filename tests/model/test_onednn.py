"""Float32 products by oneDNN (gptcli/model/kernels/onednn.py): taken on an AMD Zen 5 only (a flag read, forced in
tests on any CPU), within float32 rounding of MKL's in every place the model takes them — the linear layers in
training and without gradients, the tied output layer linked to the token lookup — and never under autocast, for a
decoding step's few rows or under ``--kernels reference``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compiled_helpers import built_library
from kernel_helpers import applied

from gptcli.model import kernels
from gptcli.model.gpt import GPT, ModelConfig, preset
from gptcli.model.kernels import cpu as kernel_cpu
from gptcli.model.kernels import linear as kernel_linear
from gptcli.model.kernels import onednn
from gptcli.model.kernels import tied as kernel_tied
from gptcli.model.kernels.layers import Linear
from gptcli.system import runtime

ZEN5 = "vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
ZEN4 = ZEN5.replace(": 26", ": 25")
XEON = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nflags\t\t: avx512f avx512_bf16 amx_bf16\n"
ZEN3 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nflags\t\t: avx2 fma\n"

pytestmark = pytest.mark.skipif(not onednn.available(), reason="this PyTorch build has no oneDNN")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The oneDNN products run, by name (``linear``, ``input_grad``, ``weight_grad``), oneDNN forced on."""
    seen: list[str] = []
    for name in ("linear", "input_grad", "weight_grad"):
        real = getattr(onednn, name)
        monkeypatch.setattr(onednn, name, lambda *a, _real=real, _name=name: seen.append(_name) or _real(*a))
    kernels.force_onednn_fp32(True)
    kernels.set_kernels("auto")
    return seen


@pytest.fixture
def training_calls(calls: list[str]) -> list[str]:
    """``calls`` where the float32 training form runs: on a library built with AVX-512, which every CPU that takes
    oneDNN (full-width AVX-512) builds. Elsewhere the products of training stay autograd's, forced or not."""
    if built_library().vector_isa() != "avx512":
        pytest.skip("the library here is not built with AVX-512: the float32 training form never runs")
    return calls


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Within float32 rounding of each other, relative to the tensor's scale (sums in another order)."""
    scale = b.abs().max().item() or 1.0
    assert a.shape == b.shape and a.dtype == b.dtype
    assert (a - b).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize(
    "cpu, takes",
    [(ZEN5, True), (ZEN4, False), (XEON, False), (ZEN3, False), ("", False)],
    ids=["zen5", "zen4", "xeon", "zen3", "unknown"],
)
def test_only_a_zen5_takes_onednn_a_flag_read_that_tests_can_force(monkeypatch, cpu: str, takes: bool) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda: cpu)
    assert kernel_cpu.cpu_has_full_width_avx512() is takes and kernels.onednn_fp32() is takes
    kernels.force_onednn_fp32(not takes)
    assert kernels.onednn_fp32() is not takes
    kernels.force_onednn_fp32(None)
    assert kernels.onednn_fp32() is takes


def test_the_products_are_float32_products_of_any_layout() -> None:
    """``linear`` of a 3-D input with and without bias, ``mm`` of transposed views (the weight gradient's layout):
    the float64 products to float32 rounding, in fresh row-major results."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 101, 96), torch.randn(40, 96), torch.randn(40)
    exact = x.double() @ w.double().t() + b.double()
    _close(onednn.linear(x, w, b).double(), exact)
    _close(onednn.linear(x, w).double(), exact - b.double())
    g = torch.randn(303, 40)
    flat = x.reshape(-1, 96)
    dw = onednn.weight_grad(g, flat)
    assert dw.is_contiguous() and dw._base is None
    _close(dw.double(), g.double().t() @ flat.double())
    _close(onednn.input_grad(g, w).double(), g.double() @ w.double())
    _close(onednn.input_grad(g[:, :33], w[:33]).double(), g[:, :33].double() @ w[:33].double())  # a strided g


@pytest.mark.parametrize("library", [True, False], ids=["compiled", "pytorch"])
def test_the_transposed_copy_is_exact_and_fresh(monkeypatch, library: bool) -> None:
    """``transpose.cpp``'s float32 tiles (shapes no tile divides, the tails by the scalar loop; NaN, ±0, ±∞ and
    subnormals moved as bits) and PyTorch's copy where the library is not built."""
    from gptcli.model.kernels import native

    if not library:
        monkeypatch.setattr(native, "library_for", lambda *a: None)
    torch.manual_seed(0)
    for rows, cols in [(1, 1), (16, 16), (33, 50), (64, 40512 // 64), (257, 129)]:
        x = torch.randn(rows, cols)
        x.view(-1)[: min(6, x.numel())] = torch.tensor(
            [float("nan"), -0.0, float("inf"), -float("inf"), 1e-40, -1e-42]
        )[: min(6, x.numel())]
        t = onednn.transposed(x)
        assert t.shape == (cols, rows) and t.is_contiguous() and t._base is None
        assert torch.equal(t.view(torch.int32), x.t().contiguous().view(torch.int32))
    strided = torch.randn(40, 30)[:, 3:20]
    assert torch.equal(onednn.transposed(strided), strided.t())


def test_the_float32_linear_on_onednn_is_autograds_within_float32_rounding(training_calls) -> None:
    torch.manual_seed(0)
    layer = Linear(96, 288)
    x = torch.randn(3, kernel_linear.MIN_POSITIONS // 3 + 1, 96, requires_grad=True)
    g = torch.randn(*x.shape[:-1], 288)
    grads = []
    for mode in ("reference", "auto"):
        kernels.set_kernels(mode)
        x.grad = layer.weight.grad = layer.bias.grad = None
        y = layer(x)
        y.backward(g)
        grads.append((y.detach(), x.grad, layer.weight.grad, layer.bias.grad))
    assert training_calls == ["linear", "input_grad", "weight_grad"]  # the forward product, dx and dw: all on oneDNN
    for got, want in zip(grads[1], grads[0]):
        _close(got, want)
    assert grads[1][2].is_contiguous()


def test_without_gradients_large_batches_take_onednn_and_decoding_steps_keep_mkl(calls) -> None:
    layer = Linear(64, 80)
    big = torch.randn(2, kernel_linear.MIN_POSITIONS // 2, 64)
    with torch.no_grad():
        _close(layer(big), F.linear(big, layer.weight, layer.bias))
        assert calls == ["linear"]
        layer(big[:, :3])  # a decoding step's rows
        assert calls == ["linear"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(big)  # bf16: oneDNN's either way, through autocast
        assert calls == ["linear"]
        kernels.set_kernels("reference")
        layer(big)
        assert calls == ["linear"]
    kernels.set_kernels("auto")
    kernels.force_onednn_fp32(False)
    with torch.no_grad():
        layer(big)
    assert calls == ["linear"]


@pytest.mark.parametrize("pad", [False, True], ids=["plain", "padded"])
def test_the_tied_output_layer_linked_on_onednn_gives_mkls_loss_and_gradients(monkeypatch, calls, pad: bool) -> None:
    """The fp32 ``_LinkedProduct`` (lookup linked, padded or not) and the evaluation logits, oneDNN against MKL."""
    kernels.force_amx(False)
    monkeypatch.setattr(kernel_tied, "PAD_MIN_POSITIONS", 8 if pad else 10**9)
    torch.manual_seed(0)
    model = applied(GPT(ModelConfig(vocab_size=101, n_ctx=16, n_embd=32, n_layer=1, n_head=2, n_inner=64)).eval())
    ids = torch.randint(0, 101, (4, 16))

    def run(dnn: bool):
        kernels.force_onednn_fp32(dnn)
        model.zero_grad(set_to_none=True)
        loss = model.lm_nll(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        with torch.no_grad():
            logits = model.lm_logits(model(ids))
        return [loss.detach(), logits] + [p.grad.clone() for p in model.parameters()]

    want = run(False)
    assert calls == []
    got = run(True)
    assert calls.count("input_grad") == calls.count("weight_grad") == 1
    assert calls.count("linear") == (2 if pad else 1)  # evaluation: from PAD_MIN_POSITIONS
    for a, b in zip(got, want):
        _close(a, b)


def test_a_gpt1_block_trains_alike_on_either_library(training_calls) -> None:
    """The paper's widths (one block), a fine-tuning micro-batch's positions: every gradient within float32
    rounding, so a run's losses stay those of MKL's products to the digits a log shows."""
    config = preset("gpt1")
    torch.manual_seed(0)
    model = applied(
        GPT(
            ModelConfig(
                vocab_size=503, n_ctx=300, n_embd=config.n_embd, n_layer=1, n_head=config.n_head, n_inner=config.n_inner
            )
        ).train()
    )
    ids = torch.randint(0, 503, (1, 300))

    def run(dnn: bool):
        kernels.force_onednn_fp32(dnn)
        torch.manual_seed(2)  # the same dropout masks
        model.zero_grad(set_to_none=True)
        loss = model.lm_loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    want, got = run(False), run(True)
    assert training_calls.count("linear") == 4 + 1  # the block's four layers, the tied output layer
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    for name, grad in want[1].items():
        scale = grad.abs().max().item() or 1.0
        assert (got[1][name] - grad).abs().max().item() <= 1e-4 * scale, name


def test_the_float32_peak_is_the_faster_librarys(monkeypatch) -> None:
    """``measure_cpu_peak`` in float32 times MKL's product and oneDNN's and reports the faster (the timings faked:
    no test asserts on wall-clock time); bf16 times one product."""
    timed: list[float] = []
    fake = iter([2.0, 1.0, 3.0])
    monkeypatch.setattr(runtime, "_median_time", lambda product, seconds: timed.append(seconds) or next(fake))
    assert runtime.measure_cpu_peak("fp32", n=256, seconds=0.5) == 2.0 * 256**3 / 1.0
    assert timed == [0.25, 0.25]  # the time asked for, split between the two
    assert runtime.measure_cpu_peak("bf16", n=256, seconds=0.5) == 2.0 * 256**3 / 3.0
