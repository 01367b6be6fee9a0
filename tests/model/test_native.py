"""The compiled CPU kernels (gptcli/model/kernels/native.py and its .cpp files): GELU equals ``F.gelu``'s tanh form
to float rounding, the seeded dropout has ``F.dropout``'s law, and where the library cannot be built the model
computes the reference instead."""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from compiled_helpers import assert_runs_eagerly_between_graphs, built_library

from gptcli.errors import GPT1Error
from gptcli.model import kernels
from gptcli.model.kernels import native
from gptcli.model.kernels.dropout import Mask, dropout, threshold
from gptcli.model.kernels.gelu import gelu as compiled_gelu
from gptcli.model.kernels.layers import GELU
from gptcli.progress import RecordingProgress

gelu = GELU(approximate="tanh")
"""The model's activation with the kernels applied (``kernels.apply`` swaps ``nn.GELU`` for this class)."""


@pytest.fixture(scope="module")
def lib():
    return built_library()


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "library", lambda: None)


# --- GELU -----------------------------------------------------------------------------------------------------


def _grid() -> torch.Tensor:
    return torch.cat([torch.linspace(-12, 12, 200_001), torch.randn(10_000) * 3, torch.tensor([0.0, -0.0, 1e-30])])


def test_gelu_is_the_tanh_gelu_to_fp32_rounding(lib) -> None:
    x = _grid()
    ref = F.gelu(x.double(), approximate="tanh")
    got, torch_own = lib.gelu_forward(x).double(), F.gelu(x, approximate="tanh").double()
    # PyTorch's own fp32 kernel is 4.3e-7 from the exact value on this grid; the compiled one 8.5e-7.
    assert (got - ref).abs().max().item() < 2e-6
    assert (got - ref).abs().max().item() < 4 * max((torch_own - ref).abs().max().item(), 1e-7)


def test_gelu_gradient_is_the_tanh_gelus(lib) -> None:
    x = _grid()
    g = torch.randn_like(x)
    ref = torch.ops.aten.gelu_backward(g.double(), x.double(), approximate="tanh")
    got = lib.gelu_backward(g, x).double()
    torch.testing.assert_close(got, ref, atol=3e-5, rtol=1e-5)


def test_gelu_bf16_is_within_one_bf16_rounding(lib) -> None:
    x = _grid().bfloat16()
    g = torch.randn_like(x)
    # Below x ≈ −4 the slope is ~1e-6 and both kernels lose it to the cancellation in 1 + tanh(u) (PyTorch's is
    # 20 % from the exact value at x = −5): the backward's absolute tolerance covers that tail.
    for got, ref, atol in (
        (lib.gelu_forward(x), F.gelu(x, approximate="tanh"), 1e-6),
        (lib.gelu_backward(g, x), torch.ops.aten.gelu_backward(g, x, approximate="tanh"), 3e-5),
    ):
        assert got.dtype == torch.bfloat16
        got, ref = got.float(), ref.float()
        assert (got == ref).float().mean().item() > 0.9  # most round to the same bf16 value
        torch.testing.assert_close(got, ref, atol=atol, rtol=2**-7)  # the rest one bf16 ulp apart


def test_gelu_special_values_and_layouts(lib) -> None:
    x = torch.tensor([float("nan"), float("inf"), 0.0, -0.0, -20.0, 20.0])
    got, ref = lib.gelu_forward(x), F.gelu(x, approximate="tanh")
    assert torch.isnan(got[0]) and torch.equal(got[1:], ref[1:])
    assert torch.isnan(lib.gelu_forward(x.bfloat16())[0])
    t = torch.randn(6, 5, 4).transpose(0, 2)  # not contiguous
    torch.testing.assert_close(lib.gelu_forward(t), F.gelu(t, approximate="tanh"), atol=2e-6, rtol=2e-6)
    assert lib.gelu_forward(torch.empty(0, 3)).shape == (0, 3)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        lib.gelu_forward(torch.randn(3).double())


def test_the_model_s_gelu_takes_the_compiled_kernel_with_autograd(lib) -> None:
    kernels.set_kernels("auto")  # conftest resets the mode after every test
    x = torch.randn(7, 33, requires_grad=True)
    y = gelu(x)
    assert type(y.grad_fn).__name__ == "_GeluBackward"  # the compiled kernel's Function, not GeluBackward0
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    xr = x.detach().clone().requires_grad_()
    (dr,) = torch.autograd.grad(F.gelu(xr, approximate="tanh"), xr, g)
    torch.testing.assert_close(y, F.gelu(x, approximate="tanh"), atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(dx, dr, atol=3e-5, rtol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.nn.functional.linear(x, torch.randn(16, 33))
        assert gelu(h).dtype == torch.bfloat16


def test_without_the_library_or_for_other_dtypes_the_reference_computes(no_library) -> None:
    x = torch.randn(5, 9)
    assert compiled_gelu(x) is None
    kernels.set_kernels("auto")
    assert torch.equal(gelu(x), F.gelu(x, approximate="tanh"))


def test_other_dtypes_take_the_reference(lib) -> None:
    assert compiled_gelu(torch.randn(4).double()) is None
    assert compiled_gelu(torch.randn(4).half()) is None


# --- dropout --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_seeded_mask_keeps_one_minus_p(lib, p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_003
    kept = Mask((n,), p, "cpu", torch.float32).dense().sum().item()
    assert abs(kept - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p))


def test_seeded_mask_threshold_is_exact_to_32_bits(lib) -> None:
    """p = 0.5 + 2⁻⁹: a threshold inside a byte (keep_mask's hard case), met by the 32-bit comparison."""
    torch.manual_seed(2)
    n, p = 4_000_000, 0.5 + 2**-9
    rate = Mask((n,), p, "cpu", torch.bfloat16).dense().float().mean().item()
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert threshold(p) == round(p * 2**32)


def test_seeded_mask_units_are_independent(lib) -> None:
    torch.manual_seed(1)
    m = Mask((500_000, 4), 0.5, "cpu", torch.float32).dense()
    for i in range(3):
        both = (m[:, i] * m[:, i + 1]).mean().item()
        assert abs(both - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 500_000)
    assert not torch.equal(
        Mask((1000,), 0.5, "cpu", torch.float32).dense(), Mask((1000,), 0.5, "cpu", torch.float32).dense()
    )


def test_seeded_mask_is_reproducible_and_independent_of_threads(lib) -> None:
    n = torch.get_num_threads()
    try:
        masks = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            torch.manual_seed(3)
            masks.append(Mask((3, 70_000), 0.1, "cpu", torch.float32).dense())
        assert torch.equal(masks[0], masks[1])
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_multiplies_by_the_dense_mask_in_and_out_of_place(lib, dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    m = Mask((40, 31), 0.3, "cpu", dtype)
    x = torch.randn(40, 31).to(dtype)
    want = (x * m.dense()) * 2.0
    assert torch.equal(m.apply(x, 2.0), want)
    y = x.clone()
    assert m.apply(y, 2.0, inplace=True).data_ptr() == y.data_ptr() and torch.equal(y, want)
    assert torch.equal(m.apply(x.t().contiguous().t()), x * m.dense())  # a strided input is read in row order


def test_without_the_library_dropout_draws_keep_mask(no_library) -> None:
    from gptcli.model.kernels.dropout import keep_mask

    x = torch.randn(50, 8)
    torch.manual_seed(6)
    got = dropout(x, 0.2)
    torch.manual_seed(6)
    assert torch.equal(got, (x * keep_mask(x.shape, 0.2, x.device, x.dtype)).mul_(1 / 0.8))
    m = Mask((5,), 0.2, "cpu", torch.float32)
    assert m.seed is None and m.tensor is not None


# --- the build ------------------------------------------------------------------------------------------------


def test_without_a_compiler_nothing_is_built_and_the_reason_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-gpt1")
    native.library.cache_clear()
    try:
        assert native.library() is None
        assert "no C++ compiler" in native.unavailable() and "no-such-compiler-gpt1" in native.unavailable()
    finally:
        monkeypatch.delenv("CXX")
        native.library.cache_clear()


def test_the_build_name_changes_with_what_the_code_depends_on(monkeypatch: pytest.MonkeyPatch) -> None:
    name = native.build_name()
    assert name.startswith("gpt1_cpu_kernels_") and name == native.build_name()
    monkeypatch.setattr(native, "_cpu_identity", lambda: "another CPU")
    assert native.build_name() != name
    monkeypatch.undo()
    monkeypatch.setattr(native, "flags", lambda: ["-O2"])
    assert native.build_name() != name


def _cpu_has(*flags: str) -> bool:
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return set(flags) <= words


_X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_the_library_is_built_for_the_instructions_asked(lib) -> None:
    """``vector_isa()`` is what ``GPT1_KERNEL_ISA`` and the CPU allow: AVX-512 where the CPU has F, BW and DQ unless
    ``avx2`` was asked, else AVX2 with FMA — so the subprocess below really tests the AVX2 forms."""
    if not _X86 or not Path("/proc/cpuinfo").is_file():
        pytest.skip("the vector forms are x86's; their choice is read from Linux's /proc/cpuinfo")
    avx2 = _cpu_has("avx2", "fma")
    if native.isa() == "native" and _cpu_has("avx512f", "avx512bw", "avx512dq"):
        assert lib.vector_isa() == "avx512"
    else:
        assert lib.vector_isa() == ("avx2" if avx2 else "")
    assert lib.vectorised() == (lib.vector_isa() != "")


def test_the_instruction_set_setting_is_checked_and_names_its_own_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    name = native.build_name()
    monkeypatch.setenv(native.ISA_ENV, "sse2")
    with pytest.raises(GPT1Error, match="GPT1_KERNEL_ISA: expected one of native, avx2, got 'sse2'"):
        native.build_name()
    if _X86:
        monkeypatch.setenv(native.ISA_ENV, "avx2")
        assert "-mno-avx512f" in native.flags() and native.build_name() != name
    monkeypatch.setenv(native.ISA_ENV, "")
    assert native.isa() == "native" and native.build_name() == name


@pytest.mark.slow
def test_the_avx2_forms_pass_these_tests_on_an_avx512_cpu() -> None:
    """An AVX-512 machine (most CI and development machines) builds the AVX2 forms only when asked: this file's
    tests run again in a subprocess against a library built with ``GPT1_KERNEL_ISA=avx2`` — the loss, the softmax's
    backward and dropout's vector loop as AMD Zen 1-3 run them. One more build (about a minute on 2 cores, cached)."""
    if not _X86 or not _cpu_has("avx512f", "avx512bw", "avx512dq", "avx2", "fma"):
        pytest.skip("no AVX-512 here: the library built for this CPU is the AVX2 (or scalar) one, tested above")
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    if native.isa() == "avx2":
        pytest.skip("this run is the AVX2 one")
    env = {**os.environ, native.ISA_ENV: "avx2"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", __file__, "-k", "not avx2_forms_pass"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "built without AVX-512 or AVX2" not in out and " passed" in out, out[-4000:]


def test_float_comparisons_may_be_vectorised_without_masked_instructions() -> None:
    # Without -fno-trapping-math GCC kept GELU's clamp and the dropout's keep test as branches on an AVX2-only CPU
    # (AMD Zen 3, no masked vector instructions): the loops stayed scalar and the compiled GELU ran at half PyTorch's
    # speed (docs/performance.md). -ffast-math would change values: none of its other parts may come in.
    flags = native.flags()
    assert "-fno-trapping-math" in flags
    assert not {
        "-ffast-math",
        "-Ofast",
        "-ffinite-math-only",
        "-fassociative-math",
        "-funsafe-math-optimizations",
    } & set(flags)


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "k"))
    assert native.cache_root() == tmp_path / "k"
    monkeypatch.delenv(native.CACHE_ENV)
    assert native.cache_root().parts[-3:] == (".cache", "gpt1", "kernels")


# --- before a run -----------------------------------------------------------------------------------------------


def _prepare_events(mode: str, device: str = "cpu") -> list:
    """What ``kernels.prepare`` reports under ``mode`` (conftest resets the mode after each test)."""
    rec = RecordingProgress()
    kernels.set_kernels(mode)
    kernels.prepare(device, rec)
    return rec.events


def test_prepare_does_nothing_under_reference_or_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse():
        raise AssertionError("the library was asked for")

    monkeypatch.setattr(native, "library", refuse)
    assert _prepare_events("reference") == [] and _prepare_events("auto", "meta") == []


def test_prepare_builds_as_a_stage_and_warns_when_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "is_built", lambda: False)
    monkeypatch.setenv("CXX", "no-such-compiler-gpt1")
    native.library.cache_clear()
    try:
        events = _prepare_events("auto")
    finally:
        monkeypatch.delenv("CXX")
        native.library.cache_clear()
    assert [kind for kind, _ in events][:2] == ["stage", "end"] and "compile the CPU kernels" in str(events[0][1])
    notes = [payload for kind, payload in events if kind == "note"]
    assert len(notes) == 1 and "no C++ compiler" in notes[0]["message"] and notes[0]["level"] == "warn"


def test_prepare_only_loads_a_built_library(lib) -> None:
    assert native.is_built() and _prepare_events("auto") == []


def test_a_built_library_is_imported_directly_and_a_broken_one_left_to_the_builder(lib, tmp_path) -> None:
    name = native.build_name()
    assert native._import_built(native.cache_root() / name, name).gelu_forward is not None
    assert native._import_built(tmp_path, name) is None  # nothing built there
    (tmp_path / f"{name}.so").write_bytes(b"cut short")
    assert native._import_built(tmp_path, name) is None


def test_under_torch_compile_the_kernels_run_eagerly_between_graphs(lib) -> None:
    """``--compile`` traces the model with dynamo: the compiled kernels are opaque pybind calls, so they are marked
    to run eagerly (``torch.compiler.disable``) instead of making dynamo warn and guess at every call."""

    def step(x: torch.Tensor) -> torch.Tensor:
        return dropout(gelu(x * 2.0), 0.1).sum()

    kernels.set_kernels("auto")
    assert_runs_eagerly_between_graphs(step, torch.randn(8, 16, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_vector_loop_draws_the_scalar_loops_bits(lib, dtype: torch.dtype) -> None:
    """With AVX-512 or AVX2 the mask is drawn 16 units at a time; the scalar loop (other CPUs, and every tail) must
    make the very same decisions and values, NaN, ±0 and ±∞ included, whatever the length and threshold."""
    if not lib.vectorised():
        pytest.skip("built without AVX-512 or AVX2: only the scalar loop exists here")
    as_int = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for n in (1, 15, 16, 17, 33, 1000, 65_537, 300_001):
        x = torch.randn(n).to(dtype)
        x[n // 2] = float("nan")
        x[n // 3], x[n // 5], x[(2 * n) // 3] = -0.0, float("inf"), float("-inf")
        for p in (0.0, 0.5, 0.999):  # the threshold's top bit set and not: the unsigned comparison
            vector = lib.dropout_apply(x, -1234567890123456789, threshold(p), 1.5, torch.empty_like(x), True)
            scalar = lib.dropout_apply(x, -1234567890123456789, threshold(p), 1.5, torch.empty_like(x), False)
            assert torch.equal(vector.view(as_int), scalar.view(as_int)), (n, p)


# --- the loss (loss.cpp) ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loss_lib(lib):
    if not lib.vectorised():
        pytest.skip(
            "built without AVX-512 or AVX2: kernels/losses.py computes with PyTorch's ops (tests/model/test_losses.py)"
        )
    return lib


def _exp_by_the_loss_kernel(lib, x: torch.Tensor) -> torch.Tensor:
    """exp(x) as the loss's backward computes it: weight 1, log-sum-exp 0, no target in range (no one-hot term)."""
    out = torch.empty(1, x.numel())
    return lib.nll_backward(x.view(1, -1), torch.tensor([-1]), torch.zeros(1), torch.ones(1), x.numel(), out)[0]


def test_the_loss_kernels_exp_is_within_two_float_ulps(loss_lib) -> None:
    x = torch.cat([torch.linspace(-87.3, 88.7, 1_000_001), torch.randn(10_000) * 20, torch.tensor([0.0, -0.0])])
    x = x.clamp(-87.3, 88.7)
    got, want = _exp_by_the_loss_kernel(loss_lib, x).double(), torch.exp(x.double())
    assert ((got - want).abs() / want).max() <= 2 * 2**-23
    # Subnormal results, total underflow, infinities and NaN.
    tiny = torch.linspace(-103.0, -87.4, 10_001)
    assert (_exp_by_the_loss_kernel(loss_lib, tiny).double() - torch.exp(tiny.double())).abs().max() <= 2**-148
    edge = _exp_by_the_loss_kernel(loss_lib, torch.tensor([-200.0, float("-inf"), float("nan"), 0.0]))
    assert edge[0] == 0 and edge[1] == 0 and edge[2].isnan() and edge[3] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_kernel_is_cross_entropy_on_vocabulary_wide_padded_rows(loss_lib, dtype: torch.dtype) -> None:
    """GPT-1's fine-tuning vocabulary (40,481 classes, a width no vector divides) in rows padded to 40,512, as the
    padded output product gives them: the loss, the log-sum-exp, and the gradient for upstream weights of either
    sign and zero, against F.cross_entropy of the float32 logits; the padding columns get 0."""
    torch.manual_seed(0)
    classes, width = 40_481, 40_512
    logits = (4 * torch.randn(7, width)).to(dtype)
    targets = torch.tensor([0, 40_480, 17, -100, 5_000, 33, 40_479])
    nll, lse = loss_lib.nll_forward(logits, targets, classes, -100)
    ref = logits[:, :classes].float().requires_grad_()
    want = F.cross_entropy(ref, targets, ignore_index=-100, reduction="none")
    torch.testing.assert_close(nll, want)
    torch.testing.assert_close(lse, torch.logsumexp(ref.detach(), dim=-1))
    weight = torch.tensor([0.5, -0.25, 0.0, 0.0, 1.0, 2.0, 1e-3])
    (grad_want,) = torch.autograd.grad((want * weight).sum(), ref)
    out = loss_lib.nll_backward(logits, targets.clamp_min(0), lse, weight, classes, torch.empty_like(logits))
    assert not out[:, classes:].any()
    if dtype == torch.float32:
        torch.testing.assert_close(out[:, :classes], grad_want)
    else:  # one rounding to bf16 of (nearly) the same float
        torch.testing.assert_close(out[:, :classes].float(), grad_want.to(dtype).float(), atol=1e-6, rtol=8e-3)


def test_the_loss_kernel_keeps_nan_and_checks_its_targets(loss_lib) -> None:
    logits = torch.randn(3, 40)
    logits[1, 7] = float("nan")
    nll, _ = loss_lib.nll_forward(logits, torch.tensor([1, 2, 3]), 40, -100)
    assert nll[1].isnan() and not nll[0].isnan() and not nll[2].isnan()
    with pytest.raises(RuntimeError, match="out of range"):
        loss_lib.nll_forward(logits, torch.tensor([1, 40, 3]), 40, -100)


# --- the attention softmax's backward (softmax.cpp) -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_softmax_backward_is_pytorchs_through_the_dropout_mask(lib, dtype: torch.dtype) -> None:
    """ds = d ⊙ dp − p·Σ(d ⊙ dp) with d = p ⊙ mask is the softmax's backward of mask ⊙ dp, for rows of every
    length a vector splits (tails included), with and without dropout (d = p)."""
    if not lib.vectorised():
        pytest.skip("built without AVX-512 or AVX2: attention.py keeps PyTorch's ops")
    torch.manual_seed(0)
    for n in (1, 15, 16, 17, 33, 70, 128, 512):
        p = torch.softmax(3 * torch.randn(6, 5, n), dim=-1).to(dtype)
        dp = torch.randn(6, 5, n).to(dtype)
        for mask in (None, (torch.rand(6, 5, n) > 0.2).to(dtype)):
            d = p if mask is None else p * mask
            want = torch._softmax_backward_data(
                dp.float() * (1 if mask is None else mask.float()), p.float(), -1, torch.float32
            )
            got = lib.softmax_backward(dp.clone(), d, p)
            tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
            torch.testing.assert_close(got.float(), want.to(dtype).float(), **tol, msg=f"n={n}")


# --- the attention softmax's forward with its dropout (softmax.cpp) -------------------------------------------------


def _softmax_reference(s: torch.Tensor, offset: int) -> torch.Tensor:
    """torch.softmax of float32 scores under the additive causal mask from ``offset`` (row i sees j ≤ offset + i;
    offset < 0: no mask)."""
    s = s.float()
    if offset >= 0:
        rows, n = s.shape[-2:]
        s = s.masked_fill(torch.ones(rows, n, dtype=torch.bool).triu(offset + 1), float("-inf"))
    return torch.softmax(s, dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_softmax_forward_is_pytorchs_with_the_causal_mask_and_dropout(lib, dtype: torch.dtype) -> None:
    """p over the scores is the softmax under the causal mask (or none), for rows of every length a vector splits
    (tails, and rows that start off a 16-element boundary of the mask's blocks); d is exactly dropout_apply(p)'s
    bits for the same seed: the mask the backward and the tests reproduce."""
    if not lib.vectorised():
        pytest.skip("built without AVX-512 or AVX2: attention.py keeps PyTorch's ops")
    torch.manual_seed(0)
    for n, rows, offset in [
        (1, 1, 0),
        (15, 15, 0),
        (17, 9, 8),
        (37, 9, 28),
        (70, 5, -1),
        (128, 128, 0),
        (512, 128, 384),
        (33, 33, -1),
    ]:
        s = (3 * torch.randn(4, rows, n)).to(dtype)
        want = _softmax_reference(s, offset)
        for p_drop in (0.0, 0.3):
            x = s.clone()
            d = torch.empty_like(x) if p_drop else None
            got = lib.softmax_forward(x, d, 987654321, threshold(p_drop), offset)
            assert got.data_ptr() == x.data_ptr()  # in place over the scores
            tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=4e-3, rtol=8e-3)
            torch.testing.assert_close(got.float(), want, **tol, msg=f"n={n} rows={rows} offset={offset}")
            if offset >= 0:
                assert not got[..., torch.ones(rows, n, dtype=torch.bool).triu(offset + 1)].any()
            if d is not None:
                assert torch.equal(d, lib.dropout_apply(got, 987654321, threshold(p_drop), 1.0, torch.empty_like(got)))


def test_the_softmax_forward_keeps_nan_and_checks_its_arguments(lib) -> None:
    if not lib.vectorised():
        pytest.skip("built without AVX-512 or AVX2")
    s = torch.randn(3, 20)
    s[1, 4] = float("nan")
    p = lib.softmax_forward(s, None, 0, 0, -1)
    assert p[1].isnan().all() and not p[0].isnan().any() and not p[2].isnan().any()
    # An additive mask's −∞ (the shared-prefix grid's) gives exactly 0 (the kernel skips exp's subnormal range).
    s = torch.randn(4, 40).masked_fill(torch.rand(4, 40) < 0.5, float("-inf"))
    s[:, 0] = 0.0
    want = torch.softmax(s, dim=-1)
    got = lib.softmax_forward(s.clone(), None, 0, 0, -1)
    torch.testing.assert_close(got, want)
    assert torch.equal(got == 0, want == 0)
    with pytest.raises(RuntimeError, match="contiguous"):
        lib.softmax_forward(torch.randn(20, 3).t(), None, 0, 0, -1)
    with pytest.raises(RuntimeError, match="dtype and shape"):
        lib.softmax_forward(torch.randn(3, 20), torch.empty(3, 21), 0, 0, -1)


@pytest.fixture
def fused_lib(lib):
    if not lib.fused_attention_available():
        pytest.skip("built without AVX-512 or AVX2, or no BLAS sgemm_ to call: the written-out attention runs instead")
    return lib


@pytest.mark.parametrize("rows", [16, 64])
def test_the_fused_attention_is_float64_attention_under_the_dense_mask(fused_lib, rows: int) -> None:
    """fused_attention.cpp's forward and backward called directly (so the AVX2 re-run below covers its AVX2 rows),
    at a length and head size that are not multiples of 8 or 16, with dropout: outputs, log-sum-exps and the three
    gradients against autograd in float64 under the (B·H, T, T) mask of the same seed (dropout_mask's bits)."""
    B, H, T, d, p = 2, 2, 45, 24, 0.2
    g = torch.Generator().manual_seed(3)
    q, k, v, grad = (torch.randn(B, H, T, d, generator=g) for _ in range(4))
    seed, limit, scale = 123456789, threshold(p), 1.0 / (1.0 - p)
    out, lse = torch.empty(B, H, T, d), torch.empty(B, H, T)
    fused_lib.fused_attention_forward(q, k, v, out, lse, seed, limit, scale, rows)
    dq, dk, dv = (torch.empty(B, H, T, d) for _ in range(3))
    fused_lib.fused_attention_backward(q, k, v, out, grad, lse, dq, dk, dv, seed, limit, scale, rows)
    keep = fused_lib.dropout_mask(torch.empty(B * H, T, T), seed, limit).double().view(B, H, T, T)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    want = (torch.softmax(scores, -1) * keep * scale) @ v64
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1).detach(), atol=1e-5, rtol=1e-5)
    for got, ref in zip((dq, dk, dv), torch.autograd.grad((want * grad.double()).sum(), (q64, k64, v64))):
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)


def test_the_fused_attention_checks_its_arguments(fused_lib) -> None:
    q = torch.randn(1, 2, 8, 4)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 8)
    with pytest.raises(RuntimeError, match="float32 CPU tensor"):
        fused_lib.fused_attention_forward(q.bfloat16(), q, q, out, lse, 0, 0, 1.0, 4)
    with pytest.raises(RuntimeError, match="rows must be contiguous"):
        fused_lib.fused_attention_forward(q.transpose(2, 3), q, q, out, lse, 0, 0, 1.0, 4)
    with pytest.raises(RuntimeError, match="q's shape"):
        fused_lib.fused_attention_forward(q, q[:, :, :4], q, out, lse, 0, 0, 1.0, 4)
    with pytest.raises(RuntimeError, match="lse must be"):
        fused_lib.fused_attention_forward(q, q, q, out, torch.empty(1, 2, 7), 0, 0, 1.0, 4)
    with pytest.raises(RuntimeError, match="threshold"):
        fused_lib.fused_attention_forward(q, q, q, out, lse, 0, 2**32, 1.0, 4)
    with pytest.raises(RuntimeError, match="rows must be positive"):
        fused_lib.fused_attention_forward(q, q, q, out, lse, 0, 0, 1.0, 0)


def test_the_fused_attention_takes_empty_sequences(fused_lib) -> None:
    """T = 0 (an empty batch row): nothing to compute, and no BLAS call with a zero leading dimension."""
    q = torch.randn(1, 2, 0, 8)
    out, lse, dx = torch.empty_like(q), torch.empty(1, 2, 0), torch.empty_like(q)
    fused_lib.fused_attention_forward(q, q, q, out, lse, 1, 0, 1.0, 64)
    fused_lib.fused_attention_backward(q, q, q, out, q, lse, dx, dx, dx, 1, 0, 1.0, 64)


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (16, 16), (17, 33), (48, 32), (300, 768)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_the_transposed_copy_is_exact_at_every_shape(lib, shape: tuple[int, int], out_dtype: torch.dtype) -> None:
    """``transpose.cpp``: AVX-512 tiles of 16 × 16 and a scalar loop for the tails (and the whole copy elsewhere,
    so the AVX2 re-run tests that form) write the same exact transpose, in bf16 or widened to float32."""
    x = torch.randn(*shape).mul_(1e30).bfloat16()
    special = torch.tensor([float("nan"), float("inf"), -0.0])[: x.numel()]
    x.view(-1)[: special.numel()] = special
    out = torch.full((shape[1], shape[0]), 7.0, dtype=out_dtype)
    assert lib.transpose_bf16(x, out) is not None
    assert torch.equal(
        out.view(torch.int32 if out_dtype == torch.float32 else torch.int16),
        x.t().to(out_dtype).view(torch.int32 if out_dtype == torch.float32 else torch.int16),
    )


@pytest.mark.parametrize("rows", [40, 64])  # 64: whole float32 lines, written with streaming stores
def test_the_transposed_copy_may_keep_the_first_columns_only(lib, rows: int) -> None:
    x = torch.randn(rows, 101).bfloat16()
    for used in (0, 1, 16, 33, 64, 100):
        out = torch.empty(used, rows)
        lib.transpose_bf16(x, out)
        assert torch.equal(out, x[:, :used].t().float())


def test_the_transposed_copy_checks_its_arguments(lib) -> None:
    x = torch.zeros(4, 6, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="transposed shape"):
        lib.transpose_bf16(x, torch.empty(7, 4, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="transposed shape"):
        lib.transpose_bf16(x, torch.empty(6, 5, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="contiguous 2-D bfloat16"):
        lib.transpose_bf16(x.float(), torch.empty(6, 4))
    with pytest.raises(RuntimeError, match="contiguous 2-D bfloat16"):
        lib.transpose_bf16(x.t(), torch.empty(4, 6, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        lib.transpose_bf16(x, torch.empty(6, 4, dtype=torch.float64))


def test_the_column_sums_are_each_column_summed_in_row_order(lib) -> None:
    """``column_sums.cpp`` (the AMX linear layer's bias gradient): each column's float32 sum in row order, the bits
    of a float32 running sum, at widths no band or vector divides (full AVX-512 bands of 256 columns, the scalar
    loop for the rest and for the whole in the AVX2 re-run), from bf16 and float32."""
    torch.manual_seed(2)
    for cols in (1, 15, 16, 17, 255, 256, 257, 700):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(37, cols).to(dtype)
            running = torch.zeros(cols)
            for row in x.float():
                running = running + row
            sums = lib.column_sums(x, torch.empty(cols))
            assert sums.dtype == torch.float32 and torch.equal(sums, running), (cols, dtype)
    with pytest.raises(RuntimeError, match="contiguous"):
        lib.column_sums(torch.randn(8, 4).t(), torch.empty(8))
    with pytest.raises(RuntimeError, match="float32 vector"):
        lib.column_sums(torch.randn(4, 8), torch.empty(7))
