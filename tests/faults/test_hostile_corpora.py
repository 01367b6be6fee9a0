"""Corpora crafted to mislead: a manifest whose shard entries point outside the corpus (``../``, an absolute path,
a link out, a FIFO) with its checksum recomputed so that it looks intact, and shards whose ids are signed or
floating point. `inspect`, `pretrain` and `eval` refuse each in one line, before hashing or training on anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import TINY_ARGS, copy_of, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")


def _commands(data: Path, run: Path, tmp: Path) -> dict[str, list]:
    return {
        "inspect": ["inspect", data],
        "pretrain": ["pretrain", "--data", data, "--out", tmp / "new-run", "--max-steps", "2", *TINY_ARGS],
        "eval": ["eval", "--checkpoint", run, "--data", data, "--device", "cpu"],
    }


def _point_first_shard_at(data: Path, rel: str) -> None:
    """Rewrite the manifest so its first shard entry names ``rel``, with a matching sha256 and a recomputed manifest
    checksum: only the path itself gives it away."""
    from gptcli.data.shards import write_manifest

    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    manifest.pop("manifest_sha256")
    entry = next(e for e in manifest["shards"] if e["split"] == "val")
    entry["file"] = rel
    write_manifest(data, manifest)


def _outside_targets(data: Path, tmp: Path) -> dict[str, str]:
    shard = data / "val-00000.arrow"
    outside = tmp / "elsewhere.arrow"
    outside.write_bytes(shard.read_bytes())
    os.symlink(outside, data / "link.arrow")
    return {"dotdot": "../elsewhere.arrow", "absolute": str(outside), "link out": "link.arrow"}


@pytest.mark.parametrize("command", ("inspect", "pretrain", "eval"))
@pytest.mark.parametrize("how", ("dotdot", "absolute", "link out"))
def test_a_manifest_naming_a_shard_outside_the_corpus_is_refused(how, command, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    rel = _outside_targets(data, tmp_path)[how]
    _point_first_shard_at(data, rel)
    res = gpt1(_commands(data, run, tmp_path)[command], capsys)
    assert_one_line_error(res, "manifest.json", repr(rel), "not a file inside the corpus")
    assert not (tmp_path / "new-run").exists()


@pytest.mark.parametrize("command", ("inspect", "pretrain"))
def test_a_shard_that_is_a_fifo_is_refused(command, corpus, run, tmp_path, capsys):
    data = copy_of(corpus, tmp_path)
    (data / "val-00000.arrow").unlink()
    os.mkfifo(data / "val-00000.arrow")
    res = gpt1(_commands(data, run, tmp_path)[command], capsys)
    assert_one_line_error(res, "val-00000.arrow", "not a regular file (a FIFO)")


def _rewrite_shard(path: Path, values: pa.Array) -> None:
    """Replace a shard by one document of ``values`` in the shard layout (one ``tokens`` list column)."""
    column = pa.LargeListArray.from_arrays(pa.array([0, len(values)], type=pa.int64()), values)
    batch = pa.record_batch([column], names=["tokens"])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


@pytest.mark.parametrize(
    "values",
    (pa.array(np.full(64, -1, dtype=np.int64)), pa.array(np.full(64, 2.5, dtype=np.float32))),
    ids=("negative", "float"),
)
@pytest.mark.parametrize("command", ("pretrain", "eval"))
def test_a_shard_of_signed_or_float_ids_is_one_line(values, command, corpus, run, tmp_path, capsys):
    """Run with --no-verify (the checksum would catch a changed shard first): the id type itself is refused, where
    the check of the largest id alone let -1 through to the embedding."""
    data = copy_of(corpus, tmp_path)
    _rewrite_shard(data / "val-00000.arrow", values)
    _rewrite_shard(data / "train-00000.arrow", values)
    res = gpt1([*_commands(data, run, tmp_path)[command], "--no-verify"], capsys)
    assert_one_line_error(res, "-00000.arrow", "not uint16 or uint32")
