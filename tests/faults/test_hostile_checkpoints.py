"""Issue #31, class 4: a hostile or broken checkpoint never asks for unbounded work.

The checksum table may name only files inside the checkpoint (no ``../../etc/…``, no absolute path to a 64 GB
file, no link out, no FIFO or device); ``config.json`` is type-checked field by field and checked against the
weights' safetensors header (cheap) before any model is built or allocated — 100,000 claimed layers cost nothing;
a tokenizer's ``model_file`` must be a regular file inside its directory, of bounded size; ``convert --from hf``
checks the config against the weights' shapes on the meta device before allocating. Each case is one line, exit 1,
no traceback, with and without ``--no-verify``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli import checkpoint as ckpt
from tests.faults.conftest import copy_of, gpt1, unblock_later

pytestmark = pytest.mark.usefixtures("one_thread")


def _newest(run: Path) -> Path:
    return ckpt.list_checkpoints(run)[-1]


def _edit_config(c: Path, edit) -> None:
    """Change config.json and re-seal its own digest (so only the new checks can object)."""
    config = json.loads((c / ckpt.CONFIG).read_text())
    edit(config)
    config[ckpt.CONFIG_DIGEST] = ckpt._config_digest(config)
    (c / ckpt.CONFIG).write_text(json.dumps(config))


def _generate(run: Path, *extra) -> list:
    return [
        "generate",
        "--checkpoint",
        run,
        "--prompt",
        "the quick fox",
        "-n",
        "2",
        "--greedy",
        "--device",
        "cpu",
        *extra,
    ]


@pytest.fixture
def mine(run, tmp_path) -> Path:
    return copy_of(run, tmp_path)


@pytest.fixture
def no_real_build(monkeypatch):
    """Fail the test if a model with more than 2 layers is built (on any device) while loading."""
    real = ckpt.build_model

    def build(cfg):
        assert getattr(cfg, "n_layer", 1) <= 2, f"built a {cfg.n_layer}-layer model before checking the weights"
        return real(cfg)

    monkeypatch.setattr(ckpt, "build_model", build)


@pytest.mark.parametrize(
    "target", ["../../../../etc/passwd", "/etc/passwd", "/dev/zero", "big", "link-out", "fifo", "tokenizer/../../x"]
)
def test_the_checksum_table_names_only_files_inside_the_checkpoint(mine, tmp_path, capsys, target):
    c = _newest(mine)
    if target == "big":
        big = tmp_path / "big.bin"
        with open(big, "wb") as f:
            f.truncate(64 << 30)  # a sparse 64 GB file: hashing it would take minutes
        target = str(big)
    elif target == "link-out":
        (c / "notes.txt").symlink_to("/etc/passwd")
        target = "notes.txt"
    elif target == "fifo":
        os.mkfifo(c / "pipe")
        unblock_later(c / "pipe")
        target = "pipe"
    _edit_config(c, lambda cfg: cfg["files"].__setitem__(target, "0" * 64))
    assert ckpt.verify_checkpoint(c)  # refused, and it returned: nothing was read forever
    line = assert_one_line_error(gpt1(_generate(mine), capsys))
    assert ("not a file inside the checkpoint" in line) or ("not a regular file" in line), line


@pytest.mark.parametrize(
    "field,value", [("n_layer", 100_000), ("n_embd", 1 << 20), ("vocab_size", 10**12), ("n_ctx", 10**9)]
)
@pytest.mark.parametrize("verify", [True, False])
def test_a_config_claiming_a_huge_model_is_refused_from_the_weights_header(
    mine, capsys, no_real_build, field, value, verify
):
    c = _newest(mine)
    _edit_config(c, lambda cfg: cfg["model"].__setitem__(field, value))
    res = gpt1(_generate(mine, *([] if verify else ["--no-verify"])), capsys)
    assert_one_line_error(res, "weights do not match the config")


@pytest.mark.parametrize(
    "field,value",
    [
        ("n_embd", "32"),
        ("n_embd", 32.0),
        ("n_layer", True),
        ("n_head", None),
        ("n_layer", 0),
        ("n_ctx", -3),
        ("embd_pdrop", float("nan")),
        ("n_inner", [128]),
        ("layer_norm_eps", "1e-5"),
    ],
)
def test_every_model_field_is_type_and_range_checked(mine, capsys, field, value):
    c = _newest(mine)
    config = json.loads((c / ckpt.CONFIG).read_text())
    config["model"][field] = value
    config[ckpt.CONFIG_DIGEST] = ckpt._config_digest(config)
    (c / ckpt.CONFIG).write_text(json.dumps(config))  # json writes nan as NaN, which Python's json reads back
    line = assert_one_line_error(gpt1(_generate(mine, "--no-verify"), capsys), str(c / "config.json"))
    assert field in line or field.replace("_", "-") in line, line


@pytest.mark.parametrize("what", ["kind", "arch", "files", "model", "whole"])
def test_config_fields_of_the_wrong_type_are_one_line(mine, capsys, what):
    c = _newest(mine)
    if what == "whole":
        (c / ckpt.CONFIG).write_text("[1, 2, 3]")
    else:
        value = {"kind": 7, "arch": ["transformer"], "files": {"model.safetensors": 5}, "model": "big"}[what]
        _edit_config(c, lambda cfg: cfg.__setitem__(what, value))
    assert_one_line_error(gpt1(_generate(mine, "--no-verify"), capsys))


@pytest.mark.parametrize("how", ["dev-zero", "fifo"])
def test_a_config_json_that_is_a_device_or_a_fifo_is_not_read(mine, capsys, how):
    c = _newest(mine)
    (c / ckpt.CONFIG).unlink()
    if how == "fifo":
        os.mkfifo(c / ckpt.CONFIG)
        unblock_later(c / ckpt.CONFIG)
    else:
        (c / ckpt.CONFIG).symlink_to("/dev/zero")
    assert_one_line_error(gpt1(_generate(c), capsys))


@pytest.mark.parametrize("model_file", ["/dev/zero", "../../../../etc/hostname", "fifo", "../config.json"])
def test_a_tokenizer_model_file_must_be_a_regular_file_inside_its_directory(mine, capsys, model_file):
    c = _newest(mine)
    tok = c / "tokenizer"
    if model_file == "fifo":
        os.mkfifo(tok / "fifo")
        unblock_later(tok / "fifo")
    meta = json.loads((tok / "tokenizer.json").read_text())
    meta["model_file"] = model_file
    (tok / "tokenizer.json").write_text(json.dumps(meta))
    assert_one_line_error(gpt1(_generate(mine, "--no-verify"), capsys))


def test_a_safetensors_header_claiming_more_than_the_file_is_one_line(mine, capsys):
    c = _newest(mine)
    w = c / ckpt.WEIGHTS
    data = bytearray(w.read_bytes())
    data[:8] = (1 << 62).to_bytes(8, "little")
    w.write_bytes(bytes(data))
    assert_one_line_error(gpt1(_generate(mine, "--no-verify"), capsys), "unreadable weights")


# --- convert --from hf ----------------------------------------------------------------------------------------------


@pytest.fixture
def hf_export(run, tmp_path, capsys) -> Path:
    out = tmp_path / "hf"
    assert gpt1(["convert", run, "--to", "hf", "--out", out], capsys).code == 0
    return out


@pytest.mark.parametrize(
    "edit",
    [
        {"n_layer": 48, "n_embd": 4096, "n_head": 32},
        {"n_layer": 100_000},
        {"n_embd": "32"},
        {"n_layer": 1.7},
        {"n_head": 0},
        {"vocab_size": True},
        {"attn_pdrop": "0.1"},
    ],
)
def test_convert_from_hf_checks_the_config_against_the_weights_before_allocating(
    hf_export, tmp_path, capsys, monkeypatch, edit
):
    import gptcli.interop.convert as convert

    real = convert.GPT

    def gpt(cfg):
        import torch

        if torch.get_default_device().type != "meta":
            assert cfg.n_layer <= 1 and cfg.n_embd <= 32, "allocated the claimed model before checking its weights"
        return real(cfg)

    monkeypatch.setattr(convert, "GPT", gpt)
    config = json.loads((hf_export / "config.json").read_text())
    config.update(edit)
    (hf_export / "config.json").write_text(json.dumps(config))
    assert_one_line_error(gpt1(["convert", "--from", "hf", hf_export, "--out", tmp_path / "ck"], capsys))
    assert not (tmp_path / "ck").exists()


def test_convert_from_hf_of_a_config_that_is_not_an_object_is_one_line(hf_export, tmp_path, capsys):
    (hf_export / "config.json").write_text("[]")
    assert_one_line_error(gpt1(["convert", "--from", "hf", hf_export, "--out", tmp_path / "ck"], capsys))
