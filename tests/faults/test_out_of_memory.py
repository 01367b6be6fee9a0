"""A run that runs out of memory ends with one line naming the flag and value that make it fit, and the checkpoint
to continue from; it writes no checkpoint after the failed allocation (gptcli/train/run/memory.py).

PyTorch's own error ("CUDA out of memory. Tried to allocate …", a traceback) named neither. A GPU's error cannot be
provoked on CPU, so the tests raise PyTorch's own ``torch.OutOfMemoryError`` where an allocation would fail, and the
host's real one (an allocation no machine has room for, refused at once by the allocator).
"""

from __future__ import annotations

import pytest
import torch
from corpus_helpers import random_corpus
from run_helpers import tiny_config

import gptcli.model.build as build_mod
import gptcli.train.pretrain as pretrain_mod
import gptcli.train.pretrain_job as pretrain_job_mod
from gptcli.train.pretrain import PretrainConfig, pretrain
from gptcli.train.run.memory import OutOfMemory, half, is_out_of_memory, out_of_memory
from gptcli.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
CUDA_WORDS = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB"


def _cfg(data, out, **kw) -> PretrainConfig:
    return tiny_config(data, out, **{"batch_size": 8, "max_steps": 6, **kw})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return random_corpus(tmp_path_factory.mktemp("corpus"))


def _host_out_of_memory() -> RuntimeError:
    """The CPU allocator's real error: 10 TB, which it refuses at once rather than paging towards."""
    try:
        torch.empty(10**13, dtype=torch.uint8)
    except RuntimeError as e:
        return e
    pytest.skip("this machine allocated 10 TB")


def test_what_counts_as_out_of_memory() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError(CUDA_WORDS))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(_host_out_of_memory())
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously …"))
    assert is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)"))
    assert not is_out_of_memory(ValueError("can't allocate memory"))  # the words alone are not the allocator's


def test_half_keeps_the_batch_split_valid() -> None:
    assert half(64, divides=64) == 32 and half(8) == 4 and half(5) == 2
    assert half(48, divides=48) == 24 and half(6, divides=12) == 3 and half(5, divides=10) == 2
    assert half(3, divides=4) == 1 and half(1) is None and half(1, divides=8) is None


def test_the_error_says_what_ran_out_when_and_what_to_pass() -> None:
    e = out_of_memory(torch.device("cpu"), "in update 4 of 6", "pass --micro-batch-size 2: …", "run/step-2")
    assert str(e) == (
        "cpu ran out of memory in update 4 of 6 (pass --micro-batch-size 2: …; then --resume continues from run/step-2)"
    )
    assert isinstance(e, OutOfMemory) and e.exit_code == 1


def _failing_update(at: int, error: BaseException):
    real = Trainer.step

    def step(self, i, micro_batches):
        if i == at:
            raise error
        return real(self, i, micro_batches)

    return step


def test_an_update_out_of_memory_names_the_micro_batch_and_the_checkpoint(corpus, tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    monkeypatch.setattr(Trainer, "step", _failing_update(3, torch.OutOfMemoryError(CUDA_WORDS)))
    with pytest.raises(OutOfMemory) as e:
        pretrain(_cfg(corpus, run))
    msg = str(e.value)
    assert msg.startswith(
        "cpu ran out of memory in update 4 of 6 (pass --micro-batch-size 4: each process then "
        "computes its 8 sequences of 16 tokens per update 4 at a time instead of 8; the update is "
        "the same (gradient accumulation); "
    ), msg
    assert msg.endswith(f"then --resume continues from {run / 'checkpoints' / 'step-0000002'})") and "\n" not in msg
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)  # --debug shows PyTorch's own error under it
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002"]  # nothing after the failure
    # The advice works: resumed with it, the run continues from that checkpoint and finishes.
    monkeypatch.undo()
    res = pretrain(_cfg(corpus, run, resume=True, micro_batch_size=4))
    assert res.step == 6 and (run / "checkpoints" / "step-0000006").is_dir()


def test_a_first_update_out_of_memory_has_no_checkpoint_to_name(corpus, tmp_path, monkeypatch) -> None:
    """The host's real allocation error, in the first update of a run already split in micro-batches of 2."""

    def hungry(model, batch):
        torch.empty(10**13, dtype=torch.uint8)

    monkeypatch.setattr(pretrain_mod, "lm_loss", hungry)
    run = tmp_path / "run"
    with pytest.raises(OutOfMemory) as e:
        pretrain(_cfg(corpus, run, micro_batch_size=2))
    msg = str(e.value)
    assert msg.startswith("cpu ran out of memory in update 1 of 6 (pass --micro-batch-size 1:"), msg
    assert "--resume" not in msg and not (run / "checkpoints").exists()


def test_one_sequence_that_does_not_fit_is_told_so(corpus, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Trainer, "step", _failing_update(0, MemoryError()))
    with pytest.raises(
        OutOfMemory,
        match=r"one sequence of 16 tokens per forward pass does not fit: use "
        r"--precision bf16 where the device has it, a shorter --seq-len",
    ):
        pretrain(_cfg(corpus, tmp_path / "run", micro_batch_size=1))


def test_validation_out_of_memory_names_the_validation_batch(corpus, tmp_path, monkeypatch) -> None:
    def hungry(*args, **kwargs):
        raise torch.OutOfMemoryError(CUDA_WORDS)

    monkeypatch.setattr(pretrain_job_mod, "evaluate_lm", hungry)
    with pytest.raises(OutOfMemory) as e:
        pretrain(_cfg(corpus, tmp_path / "run", eval_every=4))
    msg = str(e.value)
    assert msg.startswith(
        "cpu ran out of memory scoring the held-out data after update 4 (pass "
        "--micro-batch-size 4: validation then scores 4 sequences of 16 tokens at a time instead "
        "of 8; "
    ), msg
    assert "then --resume continues from" in msg and "step-0000002" in msg


def test_other_errors_pass_through_unchanged(corpus, tmp_path, monkeypatch) -> None:
    bug = RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)")
    monkeypatch.setattr(Trainer, "step", _failing_update(1, bug))
    with pytest.raises(RuntimeError) as e:
        pretrain(_cfg(corpus, tmp_path / "run"))
    assert e.value is bug


def test_fine_tuning_names_its_own_flags(pretrained, shared_data, tmp_path, monkeypatch) -> None:
    from gptcli.train.finetune import FinetuneConfig, finetune
    from gptcli.train.finetune_job import TaskLoss

    real, calls = TaskLoss.__call__, {"n": 0}

    def hungry(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError(CUDA_WORDS)
        return real(self, model, batch)

    monkeypatch.setattr(TaskLoss, "__call__", hungry)
    run = tmp_path / "ft"
    kw = dict(
        task="sst2",
        init=str(pretrained),
        out=str(run),
        data_dir=str(shared_data / "glue/SST-2"),
        max_train_examples=40,
        max_eval_examples=8,
        batch_size=4,
        epochs=1,
        log_every=3,
        save_every=2,
        device="cpu",
        precision="fp32",
    )
    with pytest.raises(OutOfMemory) as e:
        finetune(FinetuneConfig(**kw))
    msg = str(e.value)
    assert msg.startswith(
        "cpu ran out of memory in update 3 of 10 (pass --micro-batch-size 2: each process then "
        "computes its 4 examples per update 2 at a time instead of 4; the update is the same; "
        f"then --resume continues from {run / 'checkpoints' / 'step-0000002'})"
    ), msg

    import gptcli.train.finetune_job as finetune_job_mod

    monkeypatch.setattr(TaskLoss, "__call__", real)
    monkeypatch.setattr(finetune_job_mod, "predict_dev", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(OutOfMemory) as e:
        finetune(FinetuneConfig(**kw, resume=True, micro_batch_size=2))
    assert str(e.value).startswith(
        "cpu ran out of memory scoring the held-out data after update 10 (pass "
        "--eval-batch-size 4: the dev examples are then scored 4 at a time instead of 8;"
    )


def test_the_cli_shows_one_line(corpus, tmp_path, capsys, monkeypatch) -> None:
    from gptcli.cli import main

    monkeypatch.setattr(Trainer, "step", _failing_update(0, torch.OutOfMemoryError(CUDA_WORDS)))
    args = [
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(tmp_path / "run"),
        "--preset",
        "tiny",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--n-head",
        "2",
        "--n-inner",
        "64",
        "--n-ctx",
        "16",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
        "--max-steps",
        "4",
        "--warmup-steps",
        "1",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--quiet",
    ]
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: cpu ran out of memory in update 1 of 4 (pass --micro-batch-size 4:"), err


def test_a_worker_s_error_reaches_the_launcher_as_its_message_alone(tmp_path, monkeypatch) -> None:
    """Under `--gpus N` the launcher shows the failed rank's error from the file the worker wrote: the message,
    not "OutOfMemory: …" (GPT1Error subclasses are recorded as their message)."""
    from types import SimpleNamespace

    from gptcli.cli import _record_for_launcher
    from gptcli.train.distributed import _failure_message
    from gptcli.train.run.loop import NonFiniteLossError

    for error in (
        OutOfMemory("cuda:3 ran out of memory in update 7 of 9 (pass --micro-batch-size 4: …)"),
        NonFiniteLossError("loss became nan at update 5; stopping (…)"),
    ):
        path = tmp_path / f"{type(error).__name__}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
        _record_for_launcher(error)
        assert _failure_message(SimpleNamespace(error_file=str(path), exitcode=1)) == str(error)


# --- before the first update, on a CPU: Linux kills a process that runs out, without a word ----------------------


def test_an_update_too_big_for_the_free_memory_is_warned_about_with_a_size_that_fits() -> None:
    from gptcli.train.run.memory import too_big_warning

    gib = 2**30
    needed = lambda k: k * gib  # noqa: E731 - one GiB per sequence
    assert too_big_warning(needed, 8, "sequences", free=10 * gib) is None  # 8 GiB ≤ 90 % of 10
    msg = too_big_warning(needed, 64, "sequences of 512 tokens", divides=64, free=20 * gib)
    assert msg == (
        "a forward/backward of 64 sequences of 512 tokens needs about 64.0 GiB here and 20.0 GiB are free, "
        "so the system would likely stop the run without a word (pass --micro-batch-size 16: the same "
        "update, in smaller parts)"
    )  # 18 would fit, but 64 is split in parts of 16, not 18
    assert "--micro-batch-size 18:" in too_big_warning(needed, 64, "examples", free=20 * gib)
    assert "not even a micro-batch of 1 would fit" in too_big_warning(needed, 4, "examples", free=gib // 2)
    # `--procs 2` (CPU workers): each process holds its own forward/backward.
    assert too_big_warning(needed, 8, "examples", free=20 * gib, processes=2) is None  # 16 GiB of 20
    assert too_big_warning(needed, 12, "examples", free=20 * gib, processes=2).startswith(
        "a forward/backward of 12 examples in each of 2 processes needs about 24.0 GiB here and 20.0 GiB are free"
    )
    assert "--micro-batch-size 9:" in too_big_warning(needed, 12, "examples", free=20 * gib, processes=2)


def test_the_estimate_grows_with_the_model_the_tokens_and_the_precision() -> None:
    from gptcli.train.run.memory import update_bytes

    paper = dict(n_layer=12, n_embd=768, vocab=40481, params=116_534_784)
    # The measurement behind the constants (peak RSS of a second gpt1 update, Zen 5): 11.9 GB at 8,192 tokens in
    # fp32 with 0.8 GB held before, 8.4 GB in bf16: the estimate is at or a little above it, never far below.
    assert 11.0e9 <= update_bytes(**paper, tokens=8192, precision="fp32") + 0.8e9 <= 13.5e9
    assert 7.8e9 <= update_bytes(**paper, tokens=8192, precision="bf16") + 0.8e9 <= 9.5e9
    assert update_bytes(**paper, tokens=4096, precision="fp32") < update_bytes(**paper, tokens=8192, precision="fp32")


def test_free_memory_is_read_on_linux() -> None:
    from gptcli.train.run.memory import free_bytes

    free = free_bytes()
    assert free is None or 0 < free < 2**50


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cgroup_limit_above_the_process_counts(tmp_path, version) -> None:
    """A container's or a job scheduler's limit, on the process's cgroup or one above it, under cgroup v1 or v2:
    what is free is the tighter of it and the machine's MemAvailable."""
    from gptcli.train.run.memory import free_bytes

    gib = 2**30
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {64 * gib // 1024} kB\nMemAvailable: {40 * gib // 1024} kB\n")
    if version == "v2":
        (proc / "self" / "cgroup").write_text("0::/slurm/job_7/step_0\n")
        job, files = root / "slurm" / "job_7", ("memory.max", "memory.current")
        (root / "slurm" / "job_7" / "step_0").mkdir(parents=True)
        (root / "slurm" / "job_7" / "step_0" / "memory.max").write_text("max\n")
        (root / "slurm" / "job_7" / "step_0" / "memory.current").write_text(f"{gib}\n")
    else:
        (proc / "self" / "cgroup").write_text("5:devices:/\n4:memory:/docker/abc\n0::/\n")
        job, files = root / "memory" / "docker" / "abc", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        job.mkdir(parents=True)
    (job / files[0]).write_text(f"{24 * gib}\n")
    (job / files[1]).write_text(f"{3 * gib}\n")
    assert free_bytes(proc, root) == 21 * gib  # 24 GiB allowed, 3 in use: tighter than the 40 available
    (job / files[0]).write_text(f"{9223372036854771712 if version == 'v1' else 'max'}\n")
    assert free_bytes(proc, root) == 40 * gib  # no limit: the machine's


def test_a_model_whose_weights_alone_do_not_fit_says_its_size(corpus, tmp_path, monkeypatch) -> None:
    """Building the model itself failed: no batch setting can help, so the error gives the model's size instead."""
    real, sizes = build_mod.build_model, []

    def too_big(config):
        if torch.get_default_device().type != "meta":  # counting parameters allocates nothing
            sizes.append(real(config).num_params())  # this toy model's count, to compare with the error's
            raise _host_out_of_memory()
        return real(config)

    monkeypatch.setattr(build_mod, "build_model", too_big)
    with pytest.raises(OutOfMemory) as e:
        pretrain(_cfg(corpus, tmp_path / "run"))
    params = sizes[0]
    msg = str(e.value)
    assert msg.startswith(f"cpu has no room for the model itself: its {params:,} parameters take "), msg
    assert "batch" in msg and "--micro-batch-size" not in msg and "\n" not in msg, msg


def test_a_cpu_pretraining_run_too_big_for_this_machine_says_so_first(corpus, tmp_path, monkeypatch) -> None:
    import gptcli.train.run.memory as memory
    from gptcli.progress import RecordingProgress

    monkeypatch.setattr(memory, "free_bytes", lambda: 10_000)  # 10 kB free: even this toy run does not fit
    report = RecordingProgress()
    pretrain(_cfg(corpus, tmp_path / "run", max_steps=1), progress=report)  # a warning: the run still goes on
    warnings = [n["message"] for n in report.of("note") if n.get("level") == "warn"]
    assert any(
        w.startswith("a forward/backward of 8 sequences of 16 tokens needs about ")
        and w.endswith(
            "MiB are free, so the system would likely stop the run without a word (not even a "
            "micro-batch of 1 would fit: use a smaller model or a machine with more memory)"
        )
        for w in warnings
    ), warnings


def test_a_cpu_finetuning_run_names_its_largest_micro_batch(pretrained, shared_data, tmp_path, monkeypatch) -> None:
    import gptcli.train.run.memory as memory
    from gptcli.progress import RecordingProgress
    from gptcli.train.finetune import FinetuneConfig, finetune

    kw = dict(
        task="sst2",
        init=str(pretrained),
        data_dir=str(shared_data / "glue/SST-2"),
        max_train_examples=16,
        max_eval_examples=8,
        batch_size=8,
        epochs=1,
        device="cpu",
        precision="fp32",
    )
    report = RecordingProgress()
    finetune(FinetuneConfig(**kw, out=str(tmp_path / "fits")), progress=report)
    assert not [n for n in report.of("note") if "forward/backward" in n["message"]]  # a toy model fits anywhere
    monkeypatch.setattr(memory, "free_bytes", lambda: 10_000)
    report = RecordingProgress()
    finetune(FinetuneConfig(**kw, out=str(tmp_path / "tight")), progress=report)
    warnings = [n["message"] for n in report.of("note") if n.get("level") == "warn"]
    assert any(w.startswith("a forward/backward of 8 examples needs about ") for w in warnings), warnings
