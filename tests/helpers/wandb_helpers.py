"""Weights & Biases offline, for tests: W&B's own config and cache folders under the test's tmp_path (nothing in the
real home, nothing on the network), and what its offline run files under ``RUN/wandb`` hold."""

from __future__ import annotations

import json
from pathlib import Path


def offline_runs(monkeypatch, tmp_path) -> None:
    """W&B offline, with its own config/cache folders (use as an autouse fixture)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def wandb_records(path: Path):
    """The protobuf records of a ``run-*.wandb`` file (W&B's LevelDB-style log: a 7-byte header, then 32 KiB blocks
    of records with a 7-byte header each — crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def logged(run_dir: Path, newest_only: bool = False) -> tuple[dict[int, dict], dict, dict]:
    """(history rows by step, final summary, config) of every offline W&B run under RUN/wandb, in order (or of the
    newest alone: what ``wandb sync`` leaves of a run synced once per process, each replacing the last)."""
    history: dict[int, dict] = {}
    summary: dict = {}
    config: dict = {}
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    for f in files[-1:] if newest_only else files:
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                step = r.history.step.num if r.history.HasField("step") else row["_step"]
                history.setdefault(int(step), {}).update(row)
            elif kind == "summary":
                summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "run":  # the run's header: id, project and the config given to wandb.init
                summary["_run_id"], summary["_project"] = r.run.run_id, r.run.project
                config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
    return history, summary, config
