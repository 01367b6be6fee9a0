"""The fast CPU kernels (gptcli/model/kernels/) applied to the plain-PyTorch reference model by ``kernels.apply``.

An applied model computes the same function as the reference, in either mode: outputs and gradients agree to fp32
rounding (dropout off: the two draw different masks for one seed; each kernel's law and its agreement with the
reference op are tested beside it, in test_attention.py, test_dropout.py, test_losses.py and test_tied.py).
``reference`` never imports a kernel module, and ``apply`` leaves the model as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import applied

from gptcli.errors import GPT1Error
from gptcli.model import kernels
from gptcli.model.dropout import Dropout, dropout
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.system import runtime

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]


def _loss_and_grads(mode: str, model: GPT, ids: torch.Tensor, autocast: bool = False) -> tuple[torch.Tensor, dict]:
    kernels.set_kernels(mode)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model.lm_loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("t", [24, 300])  # the kernels' one-block and several-block attention (CHUNK_MIN_LEN 256)
def test_the_model_is_the_same_function_both_ways_fp32(monkeypatch: pytest.MonkeyPatch, t: int) -> None:
    """A training step's loss and every gradient, through every kernel: the blocked attention, the blocked loss
    (several row blocks) and the padded output product (101 rows, padded to 128)."""
    from gptcli.model.kernels import losses, tied

    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(tied, "PAD_MIN_POSITIONS", 8)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=101,
        n_ctx=t + 1,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_inner=32,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = applied(GPT(cfg).train())
    ids = torch.randint(0, 101, (2, t + 1))
    ref_loss, ref_grads = _loss_and_grads("reference", model, ids)
    loss, grads = _loss_and_grads("auto", model, ids)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-6, rtol=1e-5, msg=name)
    kernels.set_kernels("reference")
    h_ref = model.eval()(ids)
    logits_ref = model.lm_logits(h_ref)
    kernels.set_kernels("auto")
    torch.testing.assert_close(model(ids), h_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(model.lm_logits(h_ref), logits_ref, atol=1e-6, rtol=1e-6)


def test_the_model_is_the_same_function_both_ways_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    from gptcli.model.kernels import tied

    monkeypatch.setattr(tied, "PAD_MIN_POSITIONS", 8)
    torch.manual_seed(1)
    cfg = ModelConfig(
        vocab_size=101,
        n_ctx=33,
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_inner=64,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = applied(GPT(cfg).train())
    ids = torch.randint(0, 101, (2, 33))
    ref_loss, ref_grads = _loss_and_grads("reference", model, ids, autocast=True)
    loss, grads = _loss_and_grads("auto", model, ids, autocast=True)
    torch.testing.assert_close(loss, ref_loss, atol=2e-2, rtol=2e-2)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=5e-2, rtol=5e-2, msg=name)


def test_apply_swaps_the_seams_only_and_only_under_auto_on_cpu() -> None:
    """``apply`` keeps the parameters and the state dict, leaves a head's and the LSTM's linear layers alone,
    changes nothing applied twice, and under ``reference`` (or off the CPU) leaves the model plain PyTorch."""
    from gptcli.model.kernels import layers

    cfg = ModelConfig(vocab_size=50, n_ctx=8, n_embd=8, n_layer=1, n_head=2, n_inner=16)
    model = GPT(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with kernels.use_kernels("reference"):
        assert kernels.apply(model, "cpu") is model
    with kernels.use_kernels("auto"):
        assert kernels.apply(model, "meta") is model
    assert type(model.blocks[0].mlp.fc) is torch.nn.Linear and type(model.blocks[0].mlp.act) is torch.nn.GELU
    applied(model)
    applied(model)
    assert type(model.blocks[0].attn.qkv) is layers.Linear and type(model.blocks[0].mlp.act) is layers.GELU
    assert type(model.drop) is layers.Dropout and isinstance(model.tied, layers.TiedKernels)
    assert not isinstance(model.tied.reference, layers.TiedKernels)
    assert isinstance(model.blocks[0].attn.attention, layers.WrittenOutAttention)
    assert not isinstance(model.blocks[0].attn.attention.reference, layers.WrittenOutAttention)
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())


def test_apply_leaves_a_model_that_is_not_gpt1s_alone() -> None:
    """Another library's model handed to a ``Trainer`` (a benchmark's Hugging Face arm, say) keeps its own layers: the
    kernels replace only the seams of a gpt1 language model, so a comparison against it measures that library."""
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(approximate="tanh"), torch.nn.Dropout(0.1))
    with kernels.use_kernels("auto"):
        assert kernels.apply(other, "cpu") is other
    assert [type(m) for m in other] == [torch.nn.Linear, torch.nn.GELU, torch.nn.Dropout]


def test_reference_dropout_is_f_dropout_and_the_kernel_draws_its_own_masks() -> None:
    x = torch.randn(64, 50)
    torch.manual_seed(3)
    got = dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(got, F.dropout(x, 0.3, True))
    torch.manual_seed(3)
    assert torch.equal(Dropout(0.3).train()(x), got)
    layer = applied(Dropout(0.3).train())
    for mode, same in (("reference", True), ("auto", False)):
        kernels.set_kernels(mode)
        torch.manual_seed(3)
        assert torch.equal(layer(x), got) is same  # byte-drawn masks under auto: the same law, other units


@pytest.mark.parametrize("mode", kernels.MODES)
def test_a_broadcast_mask_is_shared_along_its_unit_dimensions(mode: str) -> None:
    """The multiple-choice head's dropout: one mask per example, shared by its answers, scaled by 1/(1 - p)."""
    layer = applied(Dropout(0.25).train())
    kernels.set_kernels(mode)
    x = torch.rand(4, 3, 200) + 1.0
    y = layer(x, noise_shape=(4, 1, 200))
    kept = y != 0
    assert torch.equal(kept, kept[:, :1].expand_as(kept))
    assert 0.6 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    assert torch.equal(layer.eval()(x, noise_shape=(4, 1, 200)), x)
    assert torch.equal(dropout(x, 0.25, training=False, noise_shape=(4, 1, 200)), x)


def test_the_kernels_broadcast_mask_is_the_heads_former_one() -> None:
    """``auto`` keeps the numbers: the multiple-choice head's mask as it was drawn before the switch."""
    from gptcli.model.kernels.dropout import keep_mask

    layer = applied(Dropout(0.1).train())
    kernels.set_kernels("auto")
    x = torch.randn(4, 3, 16)
    torch.manual_seed(9)
    got = layer(x, noise_shape=(4, 1, 16))
    torch.manual_seed(9)
    assert torch.equal(got, x * keep_mask((4, 1, 16), 0.1, x.device, x.dtype) / (1 - 0.1))


def _imported_kernels(env: dict[str, str], code: str = "") -> list[str]:
    script = (
        "import sys, torch\n"
        "from gptcli.model.gpt import GPT, ModelConfig\n"
        "from gptcli.model.heads import HeadConfig, TaskHead\n"
        "from gptcli.model.kernels import apply\n"
        f"{code}\n"
        "m = GPT(ModelConfig(vocab_size=70, n_ctx=300, n_embd=16, n_layer=1, n_head=2, n_inner=32)).train()\n"
        "m = apply(m, 'cpu')\n"
        "ids = torch.randint(0, 70, (4, 300))\n"
        "m.lm_loss(ids[:, :-1], ids[:, 1:]).backward()\n"
        "head = apply(TaskHead(HeadConfig('multiple_choice', 16, extract_id=3)).train(), 'cpu')\n"
        "ids[:, 5] = 3\n"
        "head(m(ids), ids, 2).sum().backward()\n"
        "print(sorted(k for k in sys.modules if k.startswith('gptcli.model.kernels.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return eval(out.stdout.strip().splitlines()[-1])


def test_reference_imports_no_kernel_module() -> None:
    """Training steps of the LM and a head: with GPT1_KERNELS=reference (or set_kernels), not one module of
    gptcli/model/kernels/ is imported; with auto, the kernels and the compiled library's loader are, the linear
    layers' forms on every CPU (the float32 column sums as well as the AMX bf16 form: this test expected ``linear``
    on AMX CPUs only and failed on an AMD Zen 5 after the float32 form came in), with their oneDNN products."""
    assert _imported_kernels({"GPT1_KERNELS": "reference"}) == []
    assert (
        _imported_kernels(
            {"GPT1_KERNELS": ""}, "from gptcli.model.kernels import set_kernels; set_kernels('reference')"
        )
        == []
    )
    # The paths CUDA takes with the kernels off, the padded output product and the blockwise loss (named here for the
    # CPU): plain PyTorch too, which used to import kernels/tied.py for its padding helper.
    assert (
        _imported_kernels(
            {"GPT1_KERNELS": "reference"},
            "from gptcli.model import chunked_nll, tied; tied.PADDED_HEAD_DEVICES = ('cpu',)",
        )
        == []
    )
    assert (
        _imported_kernels(
            {"GPT1_KERNELS": "reference"},
            "from gptcli.model import chunked_nll, tied; chunked_nll.CHUNKED_LOSS_DEVICES = ('cpu',)",
        )
        == []
    )
    assert _imported_kernels({"GPT1_KERNELS": "auto"}) == [
        "gptcli.model.kernels.attention",
        "gptcli.model.kernels.casts",
        "gptcli.model.kernels.cpu",
        "gptcli.model.kernels.dropout",
        "gptcli.model.kernels.gelu",
        "gptcli.model.kernels.layers",
        "gptcli.model.kernels.linear",
        "gptcli.model.kernels.losses",
        "gptcli.model.kernels.native",
        "gptcli.model.kernels.onednn",
        "gptcli.model.kernels.tied",
        "gptcli.model.kernels.tied_lookup",
        "gptcli.model.kernels.transpose",
    ]


def test_the_mode_comes_from_set_kernels_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert kernels.mode() == "auto" and kernels.enabled("cpu") and kernels.enabled(torch.device("cpu"))
    assert not kernels.enabled("cuda") and not kernels.enabled(torch.device("meta"))
    monkeypatch.setenv(kernels.ENV, "reference")
    assert kernels.mode() == "reference" and not kernels.enabled("cpu")
    kernels.set_kernels("auto")  # wins over the environment
    assert kernels.mode() == "auto"
    kernels.set_kernels(None)
    assert kernels.mode() == "reference"


def test_an_unknown_mode_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GPT1Error, match=r"^--kernels: expected one of auto, reference, got 'fast'$"):
        kernels.set_kernels("fast")
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(GPT1Error, match=r"^GPT1_KERNELS: expected one of auto, reference, got 'fast'$"):
        kernels.enabled("cpu")


def test_a_run_block_gives_the_callers_mode_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """``use_kernels``, around every library run: the mode holds inside, and the one before (a set_kernels choice,
    or the environment's) is back after a return or an exception; an unknown mode changes nothing."""
    monkeypatch.setenv(kernels.ENV, "reference")
    with kernels.use_kernels("auto") as inside:
        assert inside == kernels.mode() == "auto"
    assert kernels.mode() == "reference" and runtime._chosen is None  # the environment's again, not a copy of it
    kernels.set_kernels("auto")
    with pytest.raises(RuntimeError, match="boom"), kernels.use_kernels("reference"):
        assert kernels.mode() == "reference"
        raise RuntimeError("boom")
    assert kernels.mode() == "auto"
    with kernels.use_kernels(None) as inside:  # None: the mode in force
        assert inside == "auto"
    with pytest.raises(GPT1Error, match="^--kernels: expected one of auto, reference, got 'fast'$"):
        with kernels.use_kernels("fast"):
            pass
    assert kernels.mode() == "auto"


def test_a_config_made_without_the_setting_takes_the_mode_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT1_KERNELS (and set_kernels) reach a library run: every config's ``kernels`` defaults to the mode in force
    when it is made, as ``--kernels`` defaults to the variable. A misspelt variable is refused when a run starts, not
    when a config (or ``gpt1 --help``) is made."""
    from gptcli.eval.tasks import EvalConfig
    from gptcli.eval.zeroshot_config import ZeroShotConfig
    from gptcli.model.generate import GenerateConfig
    from gptcli.pipelines.quickstart import QuickstartConfig
    from gptcli.train.finetune_config import FinetuneConfig
    from gptcli.train.pretrain_config import PretrainConfig

    configs = (EvalConfig, ZeroShotConfig, GenerateConfig, QuickstartConfig, FinetuneConfig, PretrainConfig)
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert {cls().kernels for cls in configs} == {"auto"}
    monkeypatch.setenv(kernels.ENV, "reference")
    assert {cls().kernels for cls in configs} == {"reference"}
    assert {cls(kernels="auto").kernels for cls in configs} == {"auto"}  # a setting given wins
    kernels.set_kernels("auto")
    assert {cls().kernels for cls in configs} == {"auto"}
    kernels.set_kernels(None)
    monkeypatch.setenv(kernels.ENV, "fast")
    assert EvalConfig().kernels == "fast"
    with pytest.raises(GPT1Error, match="^--kernels: expected one of auto, reference, got 'fast'$"):
        kernels.use_kernels(EvalConfig().kernels).__enter__()


def test_the_amx_forms_follow_the_cpu_flag_unless_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernels.amx()`` is the CPU's ``amx_bf16`` flag, read from /proc/cpuinfo, never a timing; tests force it."""
    from gptcli.system import runtime

    monkeypatch.setattr(runtime, "cpu_flags", lambda: "flags\t: avx512f avx512_bf16 amx_bf16 amx_tile")
    assert kernels.amx() and runtime.cpu_has_bf16()
    monkeypatch.setattr(runtime, "cpu_flags", lambda: "flags\t: avx512f avx512_bf16")  # Zen 4: bf16, no AMX
    assert not kernels.amx() and runtime.cpu_has_bf16()
    kernels.force_amx(True)
    assert kernels.amx()
    kernels.force_amx(None)
    assert not kernels.amx()


@pytest.mark.parametrize("mode", kernels.MODES)
def test_runs_apply_the_kernels_where_they_compute_with_a_model(pretrained, mode: str) -> None:
    """``load_checkpoint`` returns the reference model; what computes with one gives it the kernels under ``auto``
    on CPU (a scoring run's ``open_model``, the ``Trainer`` of pretraining and fine-tuning) and leaves it plain
    PyTorch under ``reference``."""
    from gptcli.checkpoint import load_checkpoint
    from gptcli.eval.zeroshot import open_model
    from gptcli.model.kernels.layers import TiedKernels, WrittenOutAttention
    from gptcli.train.trainer import Trainer

    with kernels.use_kernels(mode):
        loaded = load_checkpoint(pretrained).model
        scored = open_model(pretrained, device="cpu")[0]
        built = GPT(ModelConfig(vocab_size=50, n_ctx=8, n_embd=8, n_layer=1, n_head=2, n_inner=16))
        opt = torch.optim.SGD(built.parameters(), lr=0.1)
        Trainer(built, opt, lambda m, b: m.lm_loss(b[:, :-1], b[:, 1:]), lambda s: 0.1, device=torch.device("cpu"))
    assert not isinstance(loaded.tied, TiedKernels)
    assert not isinstance(loaded.blocks[0].attn.attention, WrittenOutAttention)
    for model in (scored, built):
        assert isinstance(model.tied, TiedKernels) is (mode == "auto")
        assert isinstance(model.blocks[0].attn.attention, WrittenOutAttention) is (mode == "auto")
