"""Disks that say no: full while a checkpoint or a shard is written, read-only or forbidden output locations, an
--out that is a file. Each is one ``error:`` line that says what to do (exit 1), the outputs already in place
survive (a full disk never costs the previous checkpoint) and nothing partial is left.

The faults are injected by patching the writers (`OSError(ENOSPC)` from the safetensors or shard writer;
`os.mkdir` raising EROFS/EACCES: we run as root, for whom chmod stops nothing). Where the machine lets us mount a
small tmpfs (root with CAP_SYS_ADMIN), the same cases also run against a real full and a real read-only file
system; elsewhere those skip.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli import checkpoint as ckpt
from tests.faults.conftest import TINY_ARGS, assert_nothing_new, copy_of, gpt1, snapshot, tree

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up.\n" * 20
HINT = {errno.ENOSPC: "free some space", errno.EROFS: "read-only", errno.EACCES: "permissions"}


def _pretrain(data: Path, out: Path, *extra: str) -> list:
    return ["pretrain", "--data", data, "--out", out, "--save-every", "1", "--keep-last", "0", *TINY_ARGS, *extra]


def _texts(d: Path) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(3):
        files.append(d / f"t{i}.txt")
        files[-1].write_text(TEXT + f"document {i}\n")
    return files


def _prepare(inputs, out: Path) -> list:
    return ["prepare", *inputs, "--out", out, "--vocab-size", "40", "--workers", "1", "--val-fraction", "0.3"]


def _finetune(init: Path, out: Path) -> list:
    fixtures = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "SciTailV1.1"
    return [
        "finetune",
        "--task",
        "scitail",
        "--init",
        init,
        "--out",
        out,
        "--data-dir",
        fixtures,
        "--max-train-examples",
        "8",
        "--max-eval-examples",
        "4",
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "-q",
    ]


# --- a full disk ----------------------------------------------------------------------------------------------------


def _full_after(monkeypatch, ok_writes: int, real=ckpt.save_file) -> None:
    """The safetensors writer succeeds ``ok_writes`` times, then the disk is full."""
    calls = {"n": 0}

    def save_file(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] > ok_writes:
            # What safetensors itself raises on a full disk (not an OSError: checkpoint.save_tensors turns it into one)
            from safetensors import SafetensorError

            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ckpt, "save_file", save_file)


def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(corpus, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _full_after(monkeypatch, ok_writes=4)  # weights + optimizer of updates 1 and 2; update 3's weights fail
    res = gpt1(_pretrain(corpus, run, "--max-steps", "5"), capsys)
    line = assert_one_line_error(res, "model.safetensors", "No space left on device", "free some space")
    assert f"{run}/checkpoints/step-0000003/model.safetensors: " in line and ".partial-" not in line  # the user's
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step-0000001", "step-0000002"], names  # no temporary of step 3
    assert all(ckpt.verify_checkpoint(run / "checkpoints" / n) == [] for n in names)
    monkeypatch.undo()  # space freed: the run continues from update 2
    res = gpt1(_pretrain(corpus, run, "--max-steps", "5", "--resume"), capsys)
    assert res.code == 0, res.err[-3000:]
    assert ckpt.read_header(run).step == 5


def test_full_disk_while_writing_the_optimizer_state(corpus, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _full_after(monkeypatch, ok_writes=3)
    res = gpt1(_pretrain(corpus, run, "--max-steps", "5"), capsys)
    assert_one_line_error(res, "optimizer.safetensors", "No space left on device")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000001"]


def test_full_disk_while_exporting(run, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    _full_after(monkeypatch, ok_writes=0, real=safetensors.torch.save_file)
    monkeypatch.setattr(safetensors.torch, "save_file", ckpt.save_file)  # the patched one, where convert finds it
    before = tree(tmp_path)
    res = gpt1(["convert", run, "--to", "hf", "--out", tmp_path / "hf"], capsys)
    line = assert_one_line_error(res, "No space left on device")
    assert f"{tmp_path / 'hf'}" in line and ".partial-" not in line, line
    assert_nothing_new(tmp_path, before)


def test_full_disk_while_writing_shards(tmp_path, capsys, monkeypatch):
    import gptcli.data.shards as shards

    def write_shard(path, documents, dtype):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(shards, "write_shard", write_shard)
    inputs = _texts(tmp_path / "in")
    before = tree(tmp_path)
    res = gpt1(_prepare(inputs, tmp_path / "corpus"), capsys)
    line = assert_one_line_error(res, ".arrow", "No space left on device", "free some space")
    assert f"{tmp_path / 'corpus'}/train-00000.arrow: " in line and ".partial-" not in line, line
    assert_nothing_new(tmp_path, before)


def test_full_disk_under_an_existing_corpus_keeps_it(tmp_path, capsys, monkeypatch):
    """--overwrite on a full disk: the old corpus is still there, whole."""
    import gptcli.data.shards as shards

    inputs = _texts(tmp_path / "in")
    out = tmp_path / "corpus"
    assert gpt1(_prepare(inputs, out), capsys).code == 0
    old = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def write_shard(path, documents, dtype):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(shards, "write_shard", write_shard)
    before = tree(tmp_path)
    res = gpt1(_prepare(inputs, out) + ["--overwrite"], capsys)
    assert_one_line_error(res, "No space left on device")
    assert_nothing_new(tmp_path, before)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == old


# --- read-only and forbidden locations ------------------------------------------------------------------------------


def _refuse_mkdir(monkeypatch, under: Path, code: int) -> None:
    """``os.mkdir`` fails with ``code`` anywhere under ``under`` (what a read-only mount or a directory without
    write permission does, even for root on a read-only mount)."""
    real = os.mkdir

    def mkdir(path, *a, **k):
        p = Path(os.fsdecode(path)).absolute()
        if p == under or under in p.parents:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    # Python 3.10's Path.mkdir calls the os.mkdir its accessor bound at import, which the line above does not reach.
    accessor = getattr(pathlib, "_NormalAccessor", None)
    if accessor is not None and hasattr(accessor, "mkdir"):
        monkeypatch.setattr(accessor, "mkdir", staticmethod(mkdir))


def _outputs(corpus: Path, run: Path, tmp: Path, ro: Path) -> dict[str, list]:
    return {
        "prepare": _prepare(_texts(tmp / "in"), ro / "corpus"),
        "pretrain": _pretrain(corpus, ro / "run", "--max-steps", "2"),
        "finetune": _finetune(run, ro / "ft"),
        "convert": ["convert", run, "--to", "hf", "--out", ro / "hf"],
    }


@pytest.mark.parametrize("code", (errno.EROFS, errno.EACCES))
@pytest.mark.parametrize("command", ("prepare", "pretrain", "finetune", "convert"))
def test_output_in_a_read_only_or_forbidden_place(command, code, corpus, run, tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    cmd = _outputs(corpus, run, tmp_path, ro)[command]
    _refuse_mkdir(monkeypatch, ro, code)
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, str(ro), os.strerror(code), HINT[code])
    assert_nothing_new(tmp_path, before)


def test_resume_into_read_only_checkpoints_trains_nothing(run, tmp_path, capsys, monkeypatch):
    """A read-only checkpoints/ is refused before the first update (it used to train, then fail at the first save).
    Root writes anywhere: the permission is simulated where the run directory's check asks for it."""
    import gptcli.train.run.directory as directory

    mine = copy_of(run, tmp_path)
    real = os.access
    monkeypatch.setattr(directory.os, "access", lambda p, m, **k: Path(p) != mine / "checkpoints" and real(p, m, **k))
    before = snapshot(mine)
    res = gpt1(["pretrain", "--out", mine, "--resume", "--max-steps", "6", "--quiet"], capsys)
    assert_one_line_error(res, f"cannot write in {mine / 'checkpoints'}", "make it writable")
    assert snapshot(mine) == before  # no update logged, no checkpoint begun


@pytest.mark.parametrize("command", ("prepare", "pretrain", "finetune", "convert", "zeroshot"))
def test_out_naming_an_existing_file(command, corpus, run, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    cmds = _outputs(corpus, run, tmp_path, tmp_path)
    dprd = tmp_path / "dprd"
    dprd.mkdir()
    (dprd / "train.c.txt").write_text(
        "The bee landed on the flower because it had pollen.\nit\nThe bee,the flower\nthe flower\n", encoding="utf-8"
    )
    cmds["zeroshot"] = [
        "zeroshot",
        "--checkpoint",
        run,
        "--task",
        "dprd",
        "--data-dir",
        dprd,
        "--out",
        target,
        "--device",
        "cpu",
    ]
    cmd = [
        target if isinstance(a, Path) and a.parent == tmp_path and a.name in ("corpus", "run", "ft", "hf") else a
        for a in cmds[command]
    ]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, str(target))
    assert target.read_text() == "mine\n"
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("command", ("prepare", "pretrain", "finetune", "convert"))
def test_out_inside_a_file(command, corpus, run, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    cmds = _outputs(corpus, run, tmp_path, target)  # --out notes.txt/corpus …
    before = tree(tmp_path)
    res = gpt1(cmds[command], capsys)
    assert_one_line_error(res, str(target))
    assert target.read_text() == "mine\n"
    assert_nothing_new(tmp_path, before)


# --- the real thing: a small tmpfs ----------------------------------------------------------------------------------


@pytest.fixture
def mount(tmp_path):
    """``mount(size, readonly=False)`` → a fresh tmpfs under tmp_path (unmounted after the test); skips where
    mounting is not allowed."""
    mounted: list[Path] = []

    def make(size: str, readonly: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        opts = f"size={size}" + (",ro" if readonly else "")
        if shutil.which("mount") is None or os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_real_full_disk_while_checkpointing(corpus, tmp_path, capsys, mount):
    disk = mount("600k")  # room for two checkpoints of ~240 kB, not for a third
    run = disk / "run"
    res = gpt1(_pretrain(corpus, run, "--max-steps", "6"), capsys)
    assert_one_line_error(res, "No space left on device", "free some space")
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step-0000001", "step-0000002"], names
    assert all(ckpt.verify_checkpoint(run / "checkpoints" / n) == [] for n in names)
    shutil.rmtree(run / "checkpoints" / "step-0000001")  # the user frees space and resumes
    res = gpt1(_pretrain(corpus, run, "--max-steps", "3", "--keep-last", "1", "--resume"), capsys)
    assert res.code == 0, res.err[-3000:]


def test_real_full_disk_while_preparing(tmp_path, capsys, mount):
    disk = mount("48k")
    inputs = _texts(tmp_path / "in")
    for i, f in enumerate(inputs):
        f.write_text((TEXT + f"document {i}\n") * 30)
    res = gpt1(_prepare(inputs, disk / "corpus"), capsys)
    assert_one_line_error(res, "No space left on device")
    assert list(disk.iterdir()) == []


@pytest.mark.parametrize("command", ("prepare", "pretrain", "finetune", "convert"))
def test_real_read_only_file_system(command, corpus, run, tmp_path, capsys, mount):
    ro = mount("1m", readonly=True)
    cmd = _outputs(corpus, run, tmp_path, ro)[command]
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, "Read-only file system", "write elsewhere")
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize(
    "fault",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("Error building extension\nNo space left on device"),
    ],
)
def test_a_full_kernel_cache_is_named_not_a_missing_compiler(fault, tmp_path, monkeypatch):
    """Building the CPU kernels into a full cache (the folder itself, or the compiler's output written there) is said
    as that cache being full, with the variable that moves it; not as a C++ compiler to install."""
    from torch.utils import cpp_extension

    from gptcli.model import kernels
    from gptcli.model.kernels import native
    from gptcli.progress import RecordingProgress
    from gptcli.system.runtime import use_kernels

    cache = tmp_path / "kernel-cache"
    monkeypatch.setenv(native.CACHE_ENV, str(cache))
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # a compiler is there

    def full(**_):
        raise fault

    monkeypatch.setattr(cpp_extension, "load", full)
    native.library.cache_clear()
    report = RecordingProgress()
    try:
        with use_kernels("auto"):
            kernels.prepare("cpu", report)
    finally:
        native.library.cache_clear()
    warnings = [n["message"] for n in report.of("note") if n.get("level") == "warn"]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert f"kernel cache {cache} is full" in warnings[0] and native.CACHE_ENV in warnings[0], warnings
    assert "compiler" not in warnings[0], warnings
