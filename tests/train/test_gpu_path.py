"""The CUDA paths, where their logic can be reached without a GPU (issue: "The GPU path as its users will run it").

Each test names the problem an 8-GPU trainer reading the code found: device choice per rank, the LSTM's precision
under CUDA autocast, the validation batch under DDP, where a resumed checkpoint is loaded, host reads per update,
worker threads, the LSTM's weight flattening, emulated bf16, the GPU peak table and the fused-AdamW fallback.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from corpus_helpers import random_corpus

from gptcli.errors import GPT1Error
from gptcli.model.lstm import LSTMLM, PRESETS, precision_note, recurrent_dtype
from gptcli.progress import RecordingProgress
from gptcli.system.runtime import peak_for_gpu_name, resolve_precision
from gptcli.train import distributed
from gptcli.train import pretrain as pretrain_mod
from gptcli.train.optim import make_optimizer
from gptcli.train.pretrain import PretrainConfig, PretrainSetup, pretrain
from gptcli.train.run.loop import NonFiniteLossError

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 16}


# --- 1. which GPU a rank takes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("local_rank, visible, device", [(0, 8, 0), (5, 8, 5), (0, 1, 0), (3, 1, 0), (7, 1, 0)])
def test_a_rank_takes_its_local_rank_or_the_one_gpu_it_sees(local_rank, visible, device):
    assert distributed.pick_cuda_device(local_rank, visible) == device


@pytest.mark.parametrize("local_rank, visible, words", [(3, 2, "sees 2 CUDA devices"), (1, 0, "sees no CUDA device")])
def test_an_ambiguous_or_missing_gpu_is_one_line(local_rank, visible, words):
    with pytest.raises(GPT1Error, match=words) as e:
        distributed.pick_cuda_device(local_rank, visible)
    assert "\n" not in str(e.value)


def test_a_slurm_rank_that_sees_one_gpu_joins_on_device_0(monkeypatch):
    # SLURM --gpus-per-task=1: local rank 3 of 4 sees one device. The old code refused every local rank >= 1.
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_ADDR": "x", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv(distributed.HEARTBEAT_ENV, raising=False)
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: chosen.append(kw["backend"]))
    par = distributed.join("cuda")
    assert chosen == [0, "nccl"]
    assert par.device == torch.device("cuda", 0) and par.rank == 3 and par.info.local_rank == 3


# --- 2. the LSTM's precision -------------------------------------------------------------------------------------


def test_the_lstm_under_cuda_bf16_autocast_computes_in_fp32_and_says_so():
    assert recurrent_dtype("cuda", torch.bfloat16) == torch.float32  # cuDNN's autocast would give fp16
    assert recurrent_dtype("cuda", torch.float16) == torch.float16  # asked for, with its GradScaler
    assert recurrent_dtype("cuda", None) == torch.float32
    assert "float32" in precision_note("cuda", "bf16") and "float16" in precision_note("cuda", "bf16")
    assert precision_note("cuda", "fp16") is None and precision_note("cpu", "fp32") is None


def test_the_cpu_lstm_computes_in_bf16_where_onednn_has_it_else_in_fp32_and_says_so(monkeypatch):
    from gptcli.model import lstm as lstm_mod

    monkeypatch.setattr(lstm_mod, "cpu_has_bf16_lstm", lambda: True)
    assert recurrent_dtype("cpu", torch.bfloat16) == torch.bfloat16 and precision_note("cpu", "bf16") is None
    # An AVX2-only CPU (AMD Zen 3): oneDNN cannot build a bf16 LSTM, autocast's would fail on the first step.
    monkeypatch.setattr(lstm_mod, "cpu_has_bf16_lstm", lambda: False)
    assert recurrent_dtype("cpu", torch.bfloat16) == torch.float32
    assert "float32" in precision_note("cpu", "bf16") and "oneDNN has no bf16 LSTM" in precision_note("cpu", "bf16")


def test_the_bf16_lstm_probe_leaves_the_seed_stream_and_works_under_inference_mode():
    from gptcli.model import lstm as lstm_mod

    lstm_mod.cpu_has_bf16_lstm.cache_clear()
    state = torch.get_rng_state()
    with torch.inference_mode():
        answer = lstm_mod.cpu_has_bf16_lstm()
    assert torch.equal(torch.get_rng_state(), state)
    lstm_mod.cpu_has_bf16_lstm.cache_clear()
    assert lstm_mod.cpu_has_bf16_lstm() == answer  # inference_mode did not make a capable CPU look incapable


def _gate_dtypes(model: LSTMLM, device_type: str = "cpu") -> torch.dtype:
    """The dtype of the LSTM layer's outputs (its gates compute in it) in a bf16 autocast forward."""
    seen = []
    handle = model.lstm.register_forward_hook(lambda m, args, out: seen.append(out[0].dtype))
    with torch.autocast(device_type, dtype=torch.bfloat16):
        model(torch.randint(0, 100, (2, 6)))
    handle.remove()
    return seen[0]


def test_the_lstm_layer_computes_in_the_dtype_recurrent_dtype_names(monkeypatch):
    from gptcli.model import lstm as lstm_mod

    model = LSTMLM(lstm_mod.LSTMConfig(vocab_size=100, n_embd=16, n_hidden=24, n_ctx=16))
    # CPU autocast: the dtype asked for where this CPU's oneDNN has a bf16 LSTM, else fp32 (and no crash).
    assert _gate_dtypes(model) == recurrent_dtype("cpu", torch.bfloat16)
    # Where recurrent_dtype says fp32 (CUDA bf16), the layer leaves autocast and computes in fp32.
    monkeypatch.setattr(lstm_mod, "recurrent_dtype", lambda device, dtype: torch.float32)
    assert _gate_dtypes(model) == torch.float32


def test_a_cuda_bf16_lstm_run_says_what_its_lstm_computes_in(tmp_path, monkeypatch):
    # The note comes from the run (pretrain) with the device's own rule; faked here as CUDA's rule on CPU.
    from gptcli.model import lstm as lstm_mod

    monkeypatch.setattr(pretrain_mod, "precision_note", lambda d, p: lstm_mod.precision_note("cuda", p))
    corpus = random_corpus(tmp_path / "corpus")
    report = RecordingProgress()
    pretrain(
        PretrainConfig(
            data=corpus,
            out=tmp_path / "run",
            preset="lstm-tiny",
            model={"n_embd": 16, "n_hidden": 24, "n_ctx": 16},
            seq_len=16,
            batch_size=4,
            max_steps=1,
            warmup_steps=0,
            eval_every=0,
            device="cpu",
            precision="bf16",
            peak_flops=1e11,
        ),
        progress=report,
    )
    assert any("LSTM layer computes in float32" in n["message"] for n in report.of("note"))


# --- 3. validation batch under DDP, 4. where a resumed checkpoint is loaded ---------------------------------------


@pytest.mark.parametrize("world, micro, rows", [(8, None, 8), (1, None, 64), (8, 4, 4), (3, None, 21)])
def test_validation_reads_a_ranks_share_not_the_global_batch(world, micro, rows):
    setup = SimpleNamespace(
        config=SimpleNamespace(batch_size=64, micro_batch_size=micro), par=SimpleNamespace(world_size=world)
    )
    setup.share = PretrainSetup.share.fget(setup)
    assert PretrainSetup.micro.fget(setup) == rows


def test_a_resume_loads_the_checkpoint_onto_the_cpu_then_into_the_model(tmp_path, monkeypatch):
    corpus = random_corpus(tmp_path / "corpus")
    cfg = dict(
        data=corpus,
        out=tmp_path / "run",
        preset="tiny",
        model=dict(MODEL),
        seq_len=16,
        batch_size=4,
        warmup_steps=0,
        eval_every=0,
        device="cpu",
        precision="fp32",
        peak_flops=1e11,
    )
    pretrain(PretrainConfig(**cfg, max_steps=2))
    real, where = pretrain_mod.ckpt.load_checkpoint, []

    def spy(path, **kw):
        where.append(kw.get("map_location"))
        return real(path, **kw)

    monkeypatch.setattr(pretrain_mod.ckpt, "load_checkpoint", spy)
    pretrain(PretrainConfig(**cfg, max_steps=3, resume=True))
    assert where == ["cpu"]  # "cuda" would be cuda:0 in every worker


# --- 5. the host reads tensors back only on logging updates -----------------------------------------------------

_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "nonzero")
"""Tensor methods that read a value back (``nonzero``: its size), and below, indexing by a boolean mask, whose
result's size the device must report to the host."""
GPU_KERNELS = "reference"
"""The model as a GPU computes it: the CPU kernels of gptcli/model/kernels never run there (``kernels.enabled``),
and on a CPU, where every operation is synchronous anyway, they may read a value back (the loss kernel's backward
checks its weights' sign)."""


@pytest.fixture
def host_reads(monkeypatch):
    """Every read of a tensor back to the host made by gptcli's own code: (function, module) of the reader, and the
    chain of gptcli functions above it."""
    seen: list[tuple[str, tuple[str, ...]]] = []
    for name in _READS:
        real = getattr(torch.Tensor, name)

        def wrapper(self, *a, _real=real, **kw):
            frame = sys._getframe(1)
            if frame.f_globals.get("__name__", "").startswith("gptcli"):
                chain = []
                f = frame
                while f is not None:
                    if f.f_globals.get("__name__", "").startswith("gptcli"):
                        chain.append(f.f_code.co_name)
                    f = f.f_back
                seen.append((frame.f_code.co_name, tuple(chain)))
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    real_getitem = torch.Tensor.__getitem__

    def getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            frame = sys._getframe(1)
            if frame.f_globals.get("__name__", "").startswith("gptcli"):
                chain, f = [], frame
                while f is not None:
                    if f.f_globals.get("__name__", "").startswith("gptcli"):
                        chain.append(f.f_code.co_name)
                    f = f.f_back
                seen.append((frame.f_code.co_name, tuple(chain)))
        return real_getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    return seen


def _loop_reads(seen) -> list[tuple[str, tuple[str, ...]]]:
    """The reads the update loop makes for its updates: not those of an evaluation or of the weights' check before a
    checkpoint, which the loop also runs (at the end, and on their cadences)."""
    return [
        (f, chain) for f, chain in seen if "train" in chain and "evaluate" not in chain and "check_weights" not in chain
    ]


@pytest.mark.parametrize("log_every", [1, 4])
def test_a_pretraining_update_reads_nothing_back_except_when_it_is_logged(tmp_path, host_reads, log_every):
    corpus = random_corpus(tmp_path / "corpus")
    pretrain(
        PretrainConfig(
            data=corpus,
            out=tmp_path / "run",
            preset="tiny",
            model=dict(MODEL),
            seq_len=16,
            batch_size=4,
            max_steps=12,
            warmup_steps=0,
            eval_every=0,
            save_every=0,
            log_every=log_every,
            device="cpu",
            precision="fp32",
            peak_flops=1e11,
            kernels=GPU_KERNELS,
        )
    )
    loop = _loop_reads(host_reads)
    assert loop, "the loop reads its figures somewhere"
    assert not [r for r in loop if "update" in r[1] or "step" in r[1]], loop  # queued updates never wait
    syncs = 12 // log_every
    # Per logged update: the non-finite watch and the update's (loss, grad norm), one transfer each.
    assert Counter(f for f, _ in loop) == Counter({"first": syncs, "read": syncs}), loop


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_a_finetuning_update_reads_nothing_back_except_when_it_is_logged(
    tmp_path, host_reads, pretrained, shared_data, layout
):
    """Both layouts (padded is the LSTM's, and ``--layout padded``): the padded one used to index the hidden states
    by the mask for the LM loss, two reads back per micro-batch on a GPU."""
    from gptcli.train.finetune import FinetuneConfig, finetune

    finetune(
        FinetuneConfig(
            task="sst2",
            init=str(pretrained),
            out=str(tmp_path / "ft"),
            data_dir=str(shared_data / "glue/SST-2"),
            max_train_examples=40,
            max_eval_examples=8,
            batch_size=4,
            epochs=1,
            log_every=5,
            device="cpu",
            precision="fp32",
            kernels=GPU_KERNELS,
            layout=layout,
        )
    )
    # Reads of the batch as the host builds it, before it goes to the device (the LM positions counted in
    # `collate`, not in the loss), and the head's extract-token check, on the CPU only (on a GPU it is skipped).
    loop = [
        (f, chain)
        for f, chain in _loop_reads(host_reads)
        if f != "first_extract_positions" and not (f == "lm_positions" and "collate" in chain)
    ]
    assert not [r for r in loop if "update" in r[1] or "step" in r[1]], loop
    # 10 updates, logged at 5 and 10 (the epoch's last): the non-finite watch and the updates' figures, one
    # transfer each.
    assert Counter(f for f, _ in loop) == Counter({"first": 2, "read_figures": 2}), loop


def test_a_nan_between_logged_updates_is_caught_at_the_next_and_named_exactly(tmp_path, monkeypatch):
    real, calls = pretrain_mod.lm_loss, {"n": 0}

    def poisoned(model, batch):
        calls["n"] += 1
        loss = real(model, batch)
        return loss * float("nan") if calls["n"] == 6 else loss

    monkeypatch.setattr(pretrain_mod, "lm_loss", poisoned)
    corpus = random_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as e:
        pretrain(
            PretrainConfig(
                data=corpus,
                out=run,
                preset="tiny",
                model=dict(MODEL),
                seq_len=16,
                batch_size=4,
                max_steps=20,
                warmup_steps=0,
                eval_every=0,
                save_every=4,
                log_every=8,
                device="cpu",
                precision="fp32",
                peak_flops=1e11,
            )
        )
    msg = str(e.value)
    # Read at update 8 (the save at 4 checked earlier updates only): update 6's loss, and step-4 is the good one.
    assert (
        "loss became nan at update 6" in msg
        and f"before the divergence is {run / 'checkpoints' / 'step-0000004'}" in msg
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000004"]


# --- 6. worker threads, 7. LSTM flattening ----------------------------------------------------------------------


def test_gpu_and_cpu_workers_get_a_share_of_the_cores(monkeypatch):
    assert distributed.worker_threads(8, cores=64) == 8 and distributed.worker_threads(4, cores=2) == 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = {}

    def fake_launch(config, entry):
        return lambda *args: seen.update(threads=os.environ.get("OMP_NUM_THREADS"), n=config.nproc_per_node)

    import torch.distributed.launcher.api as api

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    distributed.launch(distributed.LaunchSpec(nproc_per_node=2, use_cuda=True), ["pretrain"])
    assert seen == {"threads": str(distributed.worker_threads(2)), "n": 2}
    assert "OMP_NUM_THREADS" not in os.environ  # the launcher's own environment is restored


def test_the_lstm_flattens_its_weights_after_a_load_not_on_every_forward(monkeypatch):
    from gptcli.model import lstm as lstm_mod

    model = LSTMLM(PRESETS["lstm-tiny"].__class__(vocab_size=50, n_embd=8, n_hidden=8, n_ctx=8))
    calls = []
    monkeypatch.setattr(model.lstm, "flatten_parameters", lambda: calls.append(1))
    model(torch.randint(0, 50, (1, 4)))
    assert calls == []
    fake = SimpleNamespace(
        lstm=SimpleNamespace(
            parameters=lambda: iter([SimpleNamespace(is_cuda=True)]), flatten_parameters=lambda: calls.append(2)
        )
    )
    lstm_mod._reflatten(fake, None)
    assert calls == [2]
    model.load_state_dict(model.state_dict(), assign=True)  # the hook runs on CPU too, and does nothing there
    assert calls == [2]


# --- 8. emulated bf16, 9. the peak table, 10. the fused-AdamW fallback ------------------------------------------


def test_auto_precision_takes_fp16_where_bf16_is_only_emulated(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_precision("auto", torch.device("cuda")) == "fp16"  # a V100/T4: emulated bf16 only
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"


def test_bf16_asked_on_a_cpu_that_only_emulates_it_is_warned_about(monkeypatch, tmp_path):
    from gptcli.system import runtime

    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "cpu_flags", lambda: "flags\t: avx2 fma")  # AMD Zen 3
    assert "emulated" in runtime.precision_warning("bf16", cpu)
    assert runtime.precision_warning("fp32", cpu) is None and resolve_precision("auto", cpu) == "fp32"
    assert runtime.precision_warning("bf16", torch.device("cuda")) is None
    # The run says it as it starts (pretrain's start notes; finetune calls the same function once it has a device).
    report = RecordingProgress()
    pretrain(
        PretrainConfig(
            data=random_corpus(tmp_path / "corpus"),
            out=tmp_path / "run",
            preset="tiny",
            model=dict(MODEL),
            seq_len=16,
            batch_size=4,
            max_steps=1,
            warmup_steps=0,
            eval_every=0,
            device="cpu",
            precision="bf16",
            peak_flops=1e11,
        ),
        progress=report,
    )
    assert any("emulated" in n["message"] and n["level"] == "warn" for n in report.of("note"))
    monkeypatch.setattr(runtime, "cpu_flags", lambda: "flags\t: avx512f avx512_bf16")  # Zen 4: native
    assert runtime.precision_warning("bf16", cpu) is None


class _MatmulClock:
    """A clock that only torch.mm moves: each product "takes" 2n³ / ``rate`` seconds and its side is recorded."""

    def __init__(self, rate: float) -> None:
        self.rate, self.now, self.sides = rate, 0.0, []

    def perf_counter(self) -> float:
        return self.now

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.now += 2.0 * a.shape[0] ** 3 / self.rate
        self.sides.append(a.shape[0])
        return a


@pytest.mark.parametrize("rate, side", [(0.27e9, 384), (2e9, 768), (60e9, 2048)])
def test_the_cpu_peak_measurement_stays_short_where_products_are_emulated(monkeypatch, rate, side):
    """Zen 3 emulates bf16 products at 0.27 GFLOP/s: the benchmarks' 2048² peak probe took 64 s a product and over
    4 minutes per benchmark run (and per test that runs one). The side now shrinks to what the time asked allows;
    a native rate keeps the side asked for."""
    from gptcli.system import runtime

    clock = _MatmulClock(rate)
    monkeypatch.setattr(runtime, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(torch, "mm", clock.mm)
    runtime.measure_cpu_peak.cache_clear()
    try:
        peak = runtime.measure_cpu_peak("bf16", n=2048, seconds=2.0)
    finally:
        runtime.measure_cpu_peak.cache_clear()
    assert peak == pytest.approx(rate) and max(clock.sides) == side
    assert clock.now <= 2.0 + 3 * 2.0 * side**3 / rate  # the time asked, plus at most the three timed products


@pytest.mark.parametrize(
    "name, precision, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
        ("NVIDIA H100 NVL", "bf16", 835.5e12),
        ("NVIDIA H100 PCIe", "fp32", 378e12),
        ("NVIDIA L40", "bf16", 181e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA H200", "bf16", 989.4e12),
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("Tesla V100-SXM2-16GB", "bf16", None),
        ("NVIDIA H100 SXM5 Engineering Sample", "bf16", None),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_gpu_peaks_match_the_exact_device_name(name, precision, peak):
    got = peak_for_gpu_name(name, precision)
    assert got == pytest.approx(peak) if peak else got is None


def test_a_fused_adamw_fallback_is_said_once(monkeypatch):
    real = torch.optim.AdamW

    def picky(*a, fused=None, **kw):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real(*a, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", picky)
    report = RecordingProgress()
    opt = make_optimizer(torch.nn.Linear(2, 2), 1e-3, report=report)
    assert isinstance(opt, real)
    notes = report.of("note")
    assert len(notes) == 1 and notes[0]["level"] == "warn" and "fused AdamW" in notes[0]["message"]
    quiet = RecordingProgress()
    monkeypatch.setattr(torch.optim, "AdamW", real)
    make_optimizer(torch.nn.Linear(2, 2), 1e-3, report=quiet)
    assert quiet.of("note") == []
