"""Damaged corpora, as the commands that read one meet them: `inspect`, `pretrain`, `eval --data`.

Each case truncates or flips bytes of one file of a prepared corpus — a shard, the manifest, the tokenizer — and
expects exit 1, one ``error:`` line naming the file, no traceback and no run directory or temporary left behind.
A flipped shard byte must be caught by the manifest's checksums (the bytes may still parse); with ``--no-verify``
(which skips them) a damaged shard must still be a one-line error, never training on garbage ids. A pickle in place
of the tokenizer description is never unpickled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import TINY_ARGS, assert_nothing_new, copy_of, flip, gpt1, malicious_pickle, tree, truncate

pytestmark = pytest.mark.usefixtures("one_thread")

FILES = (
    "train-00000.arrow",
    "val-00000.arrow",
    "manifest.json",
    "tokenizer/tokenizer.json",
    "tokenizer/sentencepiece.model",
)


def _commands(data: Path, run: Path, tmp: Path) -> dict[str, list]:
    return {
        "inspect": ["inspect", data],
        "pretrain": ["pretrain", "--data", data, "--out", tmp / "new-run", "--max-steps", "2", *TINY_ARGS],
        "eval": ["eval", "--checkpoint", run, "--data", data, "--device", "cpu"],
    }


COMMANDS = ("inspect", "pretrain", "eval")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_works_on_the_intact_corpus(command, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    res = gpt1(_commands(data, run, tmp_path)[command], capsys)
    assert res.code == 0, res.err[-3000:]


def _damage(path: Path, how: str) -> None:
    if how == "truncate":
        truncate(path)
    elif path.name == "manifest.json":
        # Inside the first shard's sha256: still valid JSON, only the checksum comparison can tell.
        text = path.read_bytes()
        flip(path, text.index(b'"sha256": "', text.index(b'"shards"')) + len(b'"sha256": "') + 7)
    elif path.suffix == ".arrow":
        flip(path, _token_offset(path) + 2 * 50)  # the low byte of the 51st id: the file still parses
    else:
        flip(path, 0.5)


def _token_offset(shard: Path) -> int:
    """Where the token ids start in a shard file (found by their bytes)."""
    from gptcli.data.shards import read_shard

    head = read_shard(shard).tokens[:16].tobytes()
    return shard.read_bytes().index(head)


def _cases():
    """(command, file, damage): each command with the files it reads. `eval --data` reads only the validation
    shards (it scores with the checkpoint's own tokenizer, not the corpus's)."""
    reads = {"inspect": FILES, "pretrain": FILES, "eval": ("val-00000.arrow", "manifest.json")}
    for command, files in reads.items():
        for rel in files:
            for how in ("truncate", "flip"):
                yield pytest.param(command, rel, how, id=f"{command}-{rel}-{how}")


@pytest.mark.parametrize("command,rel,how", list(_cases()))
def test_damaged_corpus_file_is_a_one_line_error(command, rel, how, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    _damage(data / rel, how)
    cmd = _commands(data, run, tmp_path)[command]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    line = assert_one_line_error(res)
    if rel.endswith(".arrow"):
        assert rel in line or "shards failed verification" in line, line
        if how == "flip":
            assert "checksum" in line or "failed verification" in line, line  # caught by the checksum
    elif rel == "manifest.json" and how == "flip":
        # The flipped checksum makes the intact shard look changed: the remedy (re-run prepare) is still right.
        assert "checksum mismatch" in line or "failed verification" in line, line
    else:
        assert Path(rel).name in line or "tokenizer" in line, line
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize(
    "command,rel",
    [
        ("inspect", "val-00000.arrow"),
        ("eval", "val-00000.arrow"),
        ("pretrain", "train-00000.arrow"),
        ("pretrain", "val-00000.arrow"),
    ],
)
def test_truncated_shard_without_verification_is_a_one_line_error(command, rel, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    truncate(data / rel)
    cmd = _commands(data, run, tmp_path)[command] + ["--no-verify"]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, rel, "not a readable token shard")
    assert_nothing_new(tmp_path, before)


def _out_of_range(data: Path) -> None:
    """Set the 101st id of the train shard to 64 (the vocabulary is 0…63): the file still parses, but it is no
    longer the shard the manifest's checksum describes."""
    shard = data / "train-00000.arrow"
    raw = bytearray(shard.read_bytes())
    at = _token_offset(shard) + 2 * 100  # uint16 ids
    raw[at : at + 2] = (64).to_bytes(2, "little")
    shard.write_bytes(bytes(raw))


def test_out_of_range_token_id_without_verification_is_a_one_line_error(corpus, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    _out_of_range(data)
    cmd = _commands(data, tmp_path, tmp_path)["pretrain"] + ["--no-verify"]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, "train-00000.arrow")
    assert_nothing_new(tmp_path, before)


def test_out_of_range_token_id_is_caught_by_the_checksum(corpus, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    _out_of_range(data)
    before = tree(tmp_path)
    res = gpt1(_commands(data, tmp_path, tmp_path)["pretrain"], capsys)
    assert_one_line_error(res, "train-00000.arrow", "checksum mismatch")
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "corrupt manifest"),
        ('{"format": 1}', "lists no shards"),
        ("[1, 2]", "lists no shards"),
        ("\x00\xff\xfe binary", "corrupt manifest"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS)
def test_manifest_that_is_not_one(command, text, message, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    (data / "manifest.json").write_bytes(text.encode("latin-1"))
    cmd = _commands(data, run, tmp_path)[command]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, "manifest.json", message)
    assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_shard_or_manifest(command, corpus, run, tmp_path, capsys):
    for rel, message in (("val-00000.arrow", "missing"), ("manifest.json", "not a prepared corpus")):
        data = copy_of(corpus, tmp_path / rel)
        (data / rel).unlink()
        cmd = _commands(data, run, tmp_path)[command]
        before = tree(tmp_path)
        res = gpt1(cmd, capsys)
        assert_one_line_error(res, message)
        assert_nothing_new(tmp_path, before)


@pytest.mark.parametrize("command", ("inspect", "pretrain"))
def test_missing_tokenizer(command, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    shutil.rmtree(data / "tokenizer")
    cmd = _commands(data, run, tmp_path)[command]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert_one_line_error(res, "tokenizer")
    assert_nothing_new(tmp_path, before)


def test_no_flip_in_the_manifest_goes_unnoticed(corpus, tmp_path):
    """Every byte of manifest.json, flipped: opening and verifying the corpus either reports a problem (a one-line
    GPT1Error or a verify() finding) or the manifest still says the same thing."""
    from gptcli.data.shards import open_corpus
    from gptcli.errors import GPT1Error

    data = copy_of(corpus, tmp_path)
    path = data / "manifest.json"
    original = path.read_bytes()
    meaning = json.loads(original)
    silent, crashed = [], []
    for i in range(0, len(original)):
        damaged = bytearray(original)
        damaged[i] ^= 0x01
        path.write_bytes(bytes(damaged))
        try:
            c = open_corpus(data)
            if c.verify():
                continue
            c.arrays("train"), c.num_tokens("train"), c.summary()
        except GPT1Error:
            continue
        except Exception as e:  # noqa: BLE001 - what a user would see as a traceback
            crashed.append((i, type(e).__name__))
            continue
        try:
            same = json.loads(bytes(damaged)) == meaning
        except ValueError:
            same = False
        if not same:
            silent.append((i, chr(original[i]), chr(damaged[i])))
    assert crashed == [] and silent == [], (crashed[:5], silent[:5], len(crashed), len(silent))


@pytest.mark.parametrize("command", ("inspect", "pretrain"))
def test_pickle_as_a_corpus_tokenizer_is_a_one_line_error(command, corpus, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    marker = tmp_path / "pwned"
    (data / "tokenizer" / "tokenizer.json").unlink()
    malicious_pickle(data / "tokenizer" / "tokenizer.json", marker)
    cmd = {
        "inspect": ["inspect", data],
        "pretrain": ["pretrain", "--data", data, "--out", tmp_path / "r", "--max-steps", "1", *TINY_ARGS],
    }[command]
    before = tree(tmp_path)
    res = gpt1(cmd, capsys)
    assert not marker.exists()
    assert_one_line_error(res, "tokenizer.json")
    assert_nothing_new(tmp_path, before)
