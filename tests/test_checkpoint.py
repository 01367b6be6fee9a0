"""Checkpoints: training state round trip, atomic writes, keep-last-K, resolution, clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from gptcli import checkpoint as ckpt
from gptcli.errors import GPT1Error
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.train.optim import make_optimizer
from gptcli.train.run import directory
from gptcli.train.run import training_state as ts

TINY = ModelConfig(vocab_size=50, n_ctx=8, n_embd=16, n_layer=1, n_head=2, n_inner=32)


def _trained():
    model = GPT(TINY)
    opt = make_optimizer(model, lr=1e-3)
    for _ in range(2):
        model.lm_loss(torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_training_state_round_trip(tmp_path):
    model, opt = _trained()
    path = ckpt.save_checkpoint(
        tmp_path / "c",
        model,
        meta={"step": 2},
        extra=lambda d: ts.write_training_state(d, opt, {"step": 2, "sampler": {"seed": 0, "epoch": 1, "position": 4}}),
    )
    expected_draw = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123), random.seed(1), np.random.seed(2)  # disturb every RNG
    doc, tensors = ts.read_training_state(path)
    assert doc["step"] == 2 and doc["sampler"] == {"seed": 0, "epoch": 1, "position": 4}
    assert not any(p.suffix in (".pt", ".pkl", ".bin") for p in path.iterdir())  # nothing pickled
    model2 = GPT(TINY)
    model2.load_state_dict(ckpt.load_checkpoint(path).model.state_dict())
    opt2 = make_optimizer(model2, lr=1e-3)
    ts.restore_training_state(doc, tensors, opt2)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (
        expected_draw[0].tolist(),
        *expected_draw[1:],
    )
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])


def test_atomic_save_leaves_nothing_on_failure(tmp_path):
    model, _ = _trained()
    target = tmp_path / "checkpoints" / "step-0000001"
    ckpt.save_checkpoint(target, model, meta={"step": 1})
    before = (target / ckpt.WEIGHTS).read_bytes()

    def boom(d: Path) -> None:
        (d / "partial").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        ckpt.save_checkpoint(target, GPT(TINY), meta={"step": 1}, extra=boom)
    assert (target / ckpt.WEIGHTS).read_bytes() == before  # the old checkpoint is untouched
    assert [p.name for p in target.parent.iterdir()] == ["step-0000001"]  # no temp directory left


def test_saving_over_a_folder_that_is_not_a_checkpoint_is_refused(tmp_path):
    """save_checkpoint swapped any directory it was given away (a thesis, a corpus, a run): only an earlier or
    damaged checkpoint, which holds nothing a checkpoint does not, may be replaced."""
    model, _ = _trained()
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("years of work")
    with pytest.raises(GPT1Error, match="holds chapter1.tex, which no checkpoint holds; refusing"):
        ckpt.save_checkpoint(thesis, model)
    assert [p.name for p in thesis.iterdir()] == ["chapter1.tex"]
    damaged = tmp_path / "step-0000002"
    ckpt.save_checkpoint(damaged, model, meta={"step": 2})
    (damaged / ckpt.WEIGHTS).write_bytes(b"torn")  # a damaged one is still a checkpoint: replaced
    ckpt.save_checkpoint(damaged, model, meta={"step": 2})
    assert ckpt.load_checkpoint(damaged).meta["step"] == 2


def test_resolve_newest_ignores_temp_dirs_and_prune_keeps_k(tmp_path):
    model, _ = _trained()
    run = tmp_path / "run"
    for step in (2, 4, 6):
        ckpt.save_checkpoint(run / "checkpoints" / directory.step_dir_name(step), model, meta={"step": step})
    # What a process killed mid-save leaves: a temp dir that even holds complete-looking files.
    stale = run / "checkpoints" / ".step-0000008.tmp-deadbeef"
    stale.mkdir()
    (stale / ckpt.CONFIG).write_text(json.dumps({"model": {}, "meta": {"step": 8}}))
    (stale / ckpt.WEIGHTS).write_bytes(b"\0" * 10)
    assert ckpt.resolve_checkpoint(run).name == "step-0000006"
    assert ckpt.load_checkpoint(run).meta["step"] == 6
    directory.prune_checkpoints(run / "checkpoints", keep=2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000004", "step-0000006"]


def test_corrupt_checkpoints_are_named(tmp_path):
    model, _ = _trained()
    path = ckpt.save_checkpoint(tmp_path / "c", model, meta={"step": 1})
    with pytest.raises(GPT1Error, match="no training state"):
        ts.read_training_state(path)
    (path / ckpt.WEIGHTS).write_bytes((path / ckpt.WEIGHTS).read_bytes()[:100])
    with pytest.raises(GPT1Error, match=r"model\.safetensors: checksum mismatch .*--no-verify"):
        ckpt.load_checkpoint(path)
    with pytest.raises(GPT1Error, match=r"model\.safetensors: unreadable weights"):
        ckpt.load_checkpoint(path, verify=False)
    with pytest.raises(GPT1Error, match="checkpoint not found"):
        ckpt.load_checkpoint(tmp_path / "nope")


def test_a_flipped_byte_is_caught_by_the_checksums(tmp_path):
    model, _ = _trained()
    path = ckpt.save_checkpoint(tmp_path / "c", model, meta={"step": 1})
    header = ckpt.read_header(path)
    assert set(header.files) == {ckpt.WEIGHTS}
    data = bytearray((path / ckpt.WEIGHTS).read_bytes())
    data[-5] ^= 0x01  # a weight, not the safetensors header: the file still parses
    (path / ckpt.WEIGHTS).write_bytes(bytes(data))
    assert ckpt.verify_checkpoint(path) == [f"{path / ckpt.WEIGHTS}: checksum mismatch (the file is damaged)"]
    with pytest.raises(GPT1Error, match="checksum mismatch"):
        ckpt.load_checkpoint(path)
    ckpt.load_checkpoint(path, verify=False)  # the escape hatch still opens it


def test_checksums_cover_training_state_and_tokenizer_files(tmp_path):
    model, opt = _trained()
    path = ckpt.save_checkpoint(
        tmp_path / "c", model, meta={"step": 1}, extra=lambda d: ts.write_training_state(d, opt, {"step": 1})
    )
    assert {ckpt.WEIGHTS, ts.TRAINING_STATE, ts.OPTIMIZER} <= set(ckpt.read_header(path).files)
    (path / ts.TRAINING_STATE).write_text((path / ts.TRAINING_STATE).read_text().replace('"step": 1', '"step": 2'))
    with pytest.raises(GPT1Error, match="training_state.json: checksum mismatch"):
        ts.read_training_state(path)


def test_newest_intact_skips_damaged_checkpoints_and_says_why(tmp_path):
    model, _ = _trained()
    run = tmp_path / "run"
    for step in (1, 2, 3):
        ckpt.save_checkpoint(run / "checkpoints" / directory.step_dir_name(step), model, meta={"step": step})
    newest = run / "checkpoints" / directory.step_dir_name(3)
    (newest / ckpt.WEIGHTS).write_bytes(b"garbage")
    good, skipped = ckpt.newest_intact(run)
    assert good.name == directory.step_dir_name(2)
    assert [(c.name, "checksum mismatch" in why) for c, why in skipped] == [(newest.name, True)]
    for step in (1, 2):
        (run / "checkpoints" / directory.step_dir_name(step) / ckpt.CONFIG).write_text("{not json")
    with pytest.raises(GPT1Error, match="no intact checkpoint"):
        ckpt.newest_intact(run)


def test_checkpoints_from_before_checksums_still_load(tmp_path):
    import json

    model, _ = _trained()
    path = ckpt.save_checkpoint(tmp_path / "old", model, meta={"step": 1})
    config = json.loads((path / ckpt.CONFIG).read_text())
    del config["files"], config[ckpt.CONFIG_DIGEST]  # what format-1 checkpoints written before checksums look like
    (path / ckpt.CONFIG).write_text(json.dumps(config))
    assert ckpt.verify_checkpoint(path) == []
    assert ckpt.load_checkpoint(path).config == model.config


def test_a_hugging_face_export_is_named_as_such(tmp_path):
    import json

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "openai-gpt", "n_embd": 8}))
    (hf / "model.safetensors").write_bytes(b"")
    with pytest.raises(GPT1Error, match="Hugging Face export, not a gpt1 checkpoint .*gpt1 convert .* --from hf"):
        ckpt.load_checkpoint(hf)


def test_weights_sha256_is_the_recorded_checksum_else_the_files(tmp_path):
    """``Checkpoint.weights_sha256`` (what a fine-tuning resume compares its init checkpoint by): the sha256 the
    checkpoint's config records for its weights, and for a checkpoint written before checksums the file's own."""
    from gptcli.files.fsutil import sha256_file

    path = ckpt.save_checkpoint(tmp_path / "c", GPT(TINY), meta={"step": 1})
    loaded = ckpt.load_checkpoint(path, load_tokenizer=False)
    assert loaded.files == ckpt.read_header(path).files
    assert loaded.weights_sha256() == sha256_file(path / ckpt.WEIGHTS) == loaded.files[ckpt.WEIGHTS]
    older = ckpt.Checkpoint(path, loaded.model, loaded.config, None)  # no recorded checksums
    assert older.files == {} and older.weights_sha256() == sha256_file(path / ckpt.WEIGHTS)
