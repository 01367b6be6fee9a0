"""Damaged checkpoints, as every command that opens one meets them: `pretrain --resume`, `eval`, `generate`,
`zeroshot`, `convert --to hf` and `finetune --init` (loads that write an output).

Each case truncates or flips one byte of one file of the newest checkpoint (for resume: of every checkpoint, so
there is no intact one to fall back to) and expects exit 1, one ``error:`` line naming the file, no traceback and
nothing new on disk. Byte flips in the checksummed files (everything but ``config.json``) must be caught by the
checksums in ``config.json``; a flip in ``config.json`` itself must be caught too (it holds those checksums).
Then a pickle whose unpickling would create a file is dropped where a checkpoint or tokenizer file belongs: it is
never unpickled.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli import checkpoint as ckpt
from gptcli.errors import GPT1Error
from gptcli.train.run.training_state import read_training_state
from tests.faults.conftest import assert_nothing_new, copy_of, flip, gpt1, malicious_pickle, tree, truncate

pytestmark = pytest.mark.usefixtures("one_thread")

FILES = (
    "model.safetensors",
    "optimizer.safetensors",
    "training_state.json",
    "config.json",
    "tokenizer/sentencepiece.model",
    "tokenizer/tokenizer.json",
)
DPRD = """The bee landed on the flower because it had pollen.
it
The bee,the flower
the flower

The bee landed on the flower because it wanted pollen.
it
The bee,the flower
The bee
"""


def _commands(run: Path, corpus: Path, tmp: Path) -> dict[str, list]:
    (tmp / "tasks" / "dprd").mkdir(parents=True, exist_ok=True)
    (tmp / "tasks" / "dprd" / "train.c.txt").write_text(DPRD, encoding="utf-8")
    return {
        "resume": ["pretrain", "--out", run, "--resume", "--max-steps", "6", "--quiet"],
        "eval": ["eval", "--checkpoint", run, "--data", corpus, "--device", "cpu"],
        "generate": [
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
        ],
        "zeroshot": [
            "zeroshot",
            "--checkpoint",
            run,
            "--task",
            "dprd",
            "--data-dir",
            tmp / "tasks" / "dprd",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ],
        "convert": ["convert", run, "--to", "hf", "--out", tmp / "hf"],
        "finetune": [
            "finetune",
            "--task",
            "scitail",
            "--init",
            run,
            "--out",
            tmp / "ft",
            "--data-dir",
            SCITAIL,
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
        ],
    }


SCITAIL = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "SciTailV1.1"
COMMANDS = ("resume", "eval", "generate", "zeroshot", "convert", "finetune")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_works_on_the_intact_run(command, run, corpus, tmp_path, capsys):
    """The control: the same command lines succeed on an undamaged copy, so each failure below is the damage's."""
    mine = copy_of(run, tmp_path)
    res = gpt1(_commands(mine, corpus, tmp_path)[command], capsys)
    assert res.code == 0, res.err[-3000:]


def _damage(run: Path, rel: str, how: str, every: bool) -> None:
    checkpoints = ckpt.list_checkpoints(run)
    for c in checkpoints if every else checkpoints[-1:]:
        if how == "truncate":
            truncate(c / rel)
        elif rel == "config.json":
            # A flip inside the checksum of model.safetensors: still valid JSON, so only a check of the recorded
            # checksums against the files (or of config.json's own integrity) can notice it.
            text = (c / rel).read_bytes()
            at = text.index(b'"model.safetensors": "') + len(b'"model.safetensors": "') + 5
            flip(c / rel, at)
        else:
            flip(c / rel, 0.5)


@pytest.mark.parametrize("how", ("truncate", "flip"))
@pytest.mark.parametrize("rel", FILES)
@pytest.mark.parametrize("command", COMMANDS)
def test_damaged_checkpoint_file_is_a_one_line_error(command, rel, how, run, corpus, tmp_path, capsys):
    mine = copy_of(run, tmp_path)
    cmds = _commands(mine, corpus, tmp_path)
    _damage(mine, rel, how, every=command == "resume")
    before = tree(tmp_path)
    res = gpt1(cmds[command], capsys)
    line = assert_one_line_error(res, Path(rel).name)
    if how == "flip":
        assert "checksum" in line, line  # the checksums caught it, not a parser by luck
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("mask", (0x01, 0x20, 0x80))
def test_no_flip_anywhere_in_config_json_goes_unnoticed(mask, run, tmp_path):
    """Every byte of config.json, flipped: either the checkpoint no longer verifies, or the file still says exactly
    the same thing (``1e-05`` → ``1E-05``). config.json holds the other files' checksums and its own."""
    import json

    mine = copy_of(run, tmp_path)
    c = ckpt.list_checkpoints(mine)[-1]
    original = (c / "config.json").read_bytes()
    meaning = json.loads(original)
    silent = []
    for i in range(len(original)):
        damaged = bytearray(original)
        damaged[i] ^= mask
        (c / "config.json").write_bytes(bytes(damaged))
        if not ckpt.verify_checkpoint(c):
            try:
                same = json.loads(bytes(damaged)) == meaning
            except ValueError:
                same = False
            if not same:
                silent.append((i, chr(original[i]), chr(damaged[i])))
    assert silent == []


def test_run_directory_whose_newest_config_is_unreadable(run, corpus, tmp_path, capsys):
    """Issue #17 item 10: `eval`/`generate`/`zeroshot` given the run directory, its newest config.json cut."""
    mine = copy_of(run, tmp_path)
    (ckpt.list_checkpoints(mine)[-1] / "config.json").write_text('{"format": 1, "kind": "lm", "mo', encoding="utf-8")
    for command in ("eval", "generate", "zeroshot", "convert", "finetune"):
        res = gpt1(_commands(mine, corpus, tmp_path)[command], capsys)
        assert_one_line_error(res, "config.json", "unreadable checkpoint config")


def test_missing_checkpoint_file_is_a_one_line_error(run, corpus, tmp_path, capsys):
    mine = copy_of(run, tmp_path)
    (ckpt.list_checkpoints(mine)[-1] / "tokenizer" / "tokenizer.json").unlink()
    res = gpt1(_commands(mine, corpus, tmp_path)["eval"], capsys)
    assert_one_line_error(res, "tokenizer.json", "missing")


# --- pickles are never loaded ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rel",
    (
        "model.safetensors",
        "optimizer.safetensors",
        "tokenizer/sentencepiece.model",
        "tokenizer/tokenizer.json",
        "training_state.json",
    ),
)
@pytest.mark.parametrize("command", ("resume", "eval", "generate"))
def test_pickle_in_place_of_a_checkpoint_file_never_runs(command, rel, run, corpus, tmp_path, capsys):
    mine = copy_of(run, tmp_path)
    marker = tmp_path / "pwned"
    for c in ckpt.list_checkpoints(mine):
        (c / rel).unlink()
        malicious_pickle(c / rel, marker)
    cmd = _commands(mine, corpus, tmp_path)[command]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert not marker.exists()
    assert_one_line_error(res, Path(rel).name)
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("name", ("pytorch_model.bin", "model.pt", "optimizer.pt", "training_state.pt"))
def test_pickle_files_beside_or_instead_of_the_weights_are_ignored(name, run, corpus, tmp_path, capsys):
    """A `.bin`/`.pt` file where gpt1 expects safetensors: beside intact files it is ignored (and its checksum
    is not in config.json: an intact checkpoint still loads); instead of the weights the directory is not a
    checkpoint at all. Neither loads it."""
    mine = copy_of(run, tmp_path)
    marker = tmp_path / "pwned"
    newest = ckpt.list_checkpoints(mine)[-1]
    malicious_pickle(newest / name, marker)
    res = gpt1(_commands(mine, corpus, tmp_path)["eval"], capsys)
    assert res.code == 0 and not marker.exists(), res.err[-3000:]
    lone = tmp_path / "lone"
    lone.mkdir()
    malicious_pickle(lone / name, marker)
    (lone / "config.json").write_text((newest / "config.json").read_text())
    for command in ("eval", "generate", "zeroshot"):
        res = gpt1(_commands(lone, corpus, tmp_path)[command], capsys)
        assert_one_line_error(res, "neither a checkpoint")
    assert not marker.exists()


def test_library_load_without_verification_still_never_unpickles(run, tmp_path):
    """``verify=False`` (the --no-verify escape) skips the checksums, never the format: a pickle in place of the
    weights is a safetensors parse error, not code."""
    mine = copy_of(run, tmp_path)
    marker = tmp_path / "pwned"
    newest = ckpt.list_checkpoints(mine)[-1]
    (newest / "model.safetensors").unlink()
    malicious_pickle(newest / "model.safetensors", marker)
    with pytest.raises(GPT1Error, match="unreadable weights"):
        ckpt.load_checkpoint(newest, verify=False)
    (newest / "optimizer.safetensors").unlink()
    malicious_pickle(newest / "optimizer.safetensors", marker)
    with pytest.raises(GPT1Error, match="unreadable optimizer state"):
        read_training_state(newest, verify=False)
    assert not marker.exists()


def test_the_payload_does_run_when_unpickled(tmp_path):
    """The negative control: the marker appears when the file *is* unpickled, so its absence above means
    something."""
    import pickle

    marker = tmp_path / "pwned"
    path = malicious_pickle(tmp_path / "x.pkl", marker)
    pickle.loads(path.read_bytes())
    assert marker.exists()


# --- downloaded weights: Hugging Face and OpenAI's release ----------------------------------------------------------


def _hf_export(run: Path, tmp: Path, capsys) -> Path:
    res = gpt1(["convert", run, "--to", "hf", "--out", tmp / "hf"], capsys)
    assert res.code == 0, res.err[-3000:]
    return tmp / "hf"


def test_hf_pytorch_model_bin_with_code_is_refused(run, tmp_path, capsys):
    """`convert --from hf` reads pytorch_model.bin with torch.load(weights_only=True): tensors, never code."""
    import torch
    from safetensors.torch import load_file

    hf = _hf_export(run, tmp_path, capsys)
    weights = load_file(str(hf / "model.safetensors"))
    (hf / "model.safetensors").unlink()
    torch.save(weights, hf / "pytorch_model.bin")  # the control: a plain state dict in a .bin converts
    assert gpt1(["convert", hf, "--from", "hf", "--out", tmp_path / "back"], capsys).code == 0
    marker = tmp_path / "pwned"
    malicious_pickle(hf / "pytorch_model.bin", marker)
    before = tree(tmp_path)
    res = gpt1(["convert", hf, "--from", "hf", "--out", tmp_path / "evil"], capsys)
    assert not marker.exists()
    assert_one_line_error(res, "pytorch_model.bin", "weights_only")
    assert_nothing_new(tmp_path, before)


def test_openai_release_npy_with_code_is_refused(tmp_path, capsys):
    """`convert --from openai` reads params_*.npy with allow_pickle=False: an object array is refused unread."""
    import json

    import numpy as np

    release = tmp_path / "release"
    release.mkdir()
    (release / "params_shapes.json").write_text(json.dumps([[2, 2]]))
    marker = tmp_path / "pwned"
    from tests.faults.conftest import Payload

    np.save(release / "params_0.npy", np.array([Payload(marker), 1], dtype=object), allow_pickle=True)
    before = tree(tmp_path)
    res = gpt1(["convert", release, "--from", "openai", "--out", tmp_path / "out"], capsys)
    assert not marker.exists()
    assert_one_line_error(res, "params_0.npy")
    assert_nothing_new(tmp_path, before)
    np.load(release / "params_0.npy", allow_pickle=True)  # the control: unpickling it does run the payload
    assert marker.exists()
