"""Fetch the paper's datasets from the Hugging Face Hub into their official layout under the data root.

``fetch(FetchConfig(tasks=["rte"]))`` (what ``gpt1 fetch rte`` runs) downloads the task's parquet files
(:data:`gptcli.tasks.sources.SOURCES`) through ``huggingface_hub``, so ``HF_HOME``, ``HF_HUB_OFFLINE``,
``HF_ENDPOINT`` and tokens apply and a second fetch reads the Hugging Face cache. It writes the official files
(``RTE/train.tsv``, …) because that is what the task loaders read, so every other command finds them where it
always looks (:func:`gptcli.tasks.base.data_root`).

Each file's row count must be the official release's, else nothing is written. A task folder is built under a
hidden temporary name and renamed into place once every file is checked, so a failed fetch leaves no folder; one
already there is left alone (``overwrite`` replaces only what an earlier fetch wrote). The folder carries the
output marker (kind ``task-data``) and ``.gpt1-fetch.json`` (Hub repository, commit, each file's rows and sha256).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import move_into_place, sha256_file, temp_sibling, write_text_atomic
from gptcli.files.locks import output_lock
from gptcli.files.outputs import check_output, mark
from gptcli.interop.hub import hub_snapshot
from gptcli.progress import SILENT, Progress
from gptcli.tasks.base import data_root
from gptcli.tasks.registry import all_tasks, get_task
from gptcli.tasks.sources import GLUE_REPO, SOURCES, OfficialFile, Source, write_file

PROVENANCE = ".gpt1-fetch.json"


@dataclass
class FetchConfig:
    """What ``gpt1 fetch`` downloads, and where."""

    tasks: list[str] = field(default_factory=list)
    """Tasks to download: registry names (rte, mnli, race, snli, …), `glue` for the nine GLUE tasks, or `all`."""
    root: Path | None = None
    """Data root to write the task folders into; default: $GPT1_DATA, else ~/.cache/gpt1/data (where every command
    looks for them)."""
    revision: str | None = None
    """Revision (branch, tag or commit) of the Hub dataset repositories; default: main."""
    overwrite: bool = False
    """Fetch again and replace a task folder an earlier fetch wrote (data gpt1 did not write is never replaced)."""


@dataclass
class Fetched:
    """The outcome for one task folder."""

    folder: str
    path: Path
    status: Literal["fetched", "present", "manual"]
    """``fetched`` now, already ``present`` (left alone), or ``manual``: not on the Hub (``detail`` says where)."""
    detail: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    """Rows (RACE: questions) per official file written."""
    commit: str = ""


def folders_for(names: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The fetchable task folders ``names`` ask for, in order without repeats, and ``(folder, how to get it)``
    for the others ``all`` covers. A task named on its own that cannot be fetched (Story Cloze, DPRD, WSC273) is a
    one-line error saying where to get it, as is an unknown name (from the registry)."""
    wanted: list[str] = []
    manual: list[tuple[str, str]] = []
    refused: list[str] = []
    for name in names:
        key = name.strip().lower()
        if key == "all":
            tasks = all_tasks(zero_shot=True)
        elif key == "glue":
            tasks = [t for t in all_tasks() if t.folder in SOURCES and SOURCES[t.folder].repo == GLUE_REPO]
        else:
            tasks = [get_task(key, zero_shot=True)]
        for t in tasks:
            if t.folder in SOURCES:
                wanted.append(t.folder)
            elif key == "all":
                manual.append((t.folder, t.how_to_get()))
            else:
                refused.append(f"{t.name} cannot be fetched: {t.how_to_get()}")
    if refused:
        raise GPT1Error("; ".join(dict.fromkeys(refused)))
    return list(dict.fromkeys(wanted)), list(dict.fromkeys(manual))


def fetch(cfg: FetchConfig, progress: Progress | None = None) -> list[Fetched]:
    """Fetch every folder ``cfg.tasks`` names (see the module docstring); returns one :class:`Fetched` each."""
    if not cfg.tasks:
        raise GPT1Error("name the tasks to fetch, e.g. `gpt1 fetch rte`, `gpt1 fetch glue` or `gpt1 fetch all`")
    report = progress or SILENT
    root = Path(cfg.root).expanduser() if cfg.root is not None else data_root()
    folders, manual = folders_for(cfg.tasks)
    out = [Fetched(folder, root / folder, "manual", how) for folder, how in manual]
    for folder in folders:
        out.append(fetch_folder(SOURCES[folder], root, revision=cfg.revision, overwrite=cfg.overwrite, progress=report))
    return out


def fetch_folder(
    source: Source,
    root: Path,
    *,
    revision: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Fetched:
    """Download ``source`` and write its official folder ``root/<folder>`` whole (or leave one that is there)."""
    report = progress or SILENT
    target = root / source.folder
    if _present(target) and not overwrite:
        return Fetched(source.folder, target, "present", "already there (--overwrite fetches it again)")
    if target.exists():  # ours to replace (an earlier fetch's folder, an empty one), or refused before any download
        check_output(
            target, "task-data", overwrite=True, flag="task folder", owned={f.path.split("/")[0] for f in source.files}
        )
    snapshot = hub_snapshot(
        source.repo, sorted({f.hub_pattern for f in source.files}), revision=revision, repo_type="dataset"
    )
    root.mkdir(parents=True, exist_ok=True)
    with output_lock(target, wait=True):  # a second fetch of the folder waits, then finds it there
        return _write_folder(source, snapshot, target, overwrite, report)


def _write_folder(source: Source, snapshot: Path, target: Path, overwrite: bool, report: Progress) -> Fetched:
    tmp = temp_sibling(target, "fetch")
    try:
        tmp.mkdir()
        rows = _write_all(source, snapshot, tmp, report)
        mark(tmp, "task-data")
        _provenance(tmp, source, snapshot, rows)
        if _present(target) and not overwrite:  # another fetch finished first: keep its folder, readers may use it
            shutil.rmtree(tmp, ignore_errors=True)
            return Fetched(source.folder, target, "present", "fetched meanwhile by another process")
        move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Fetched(source.folder, target, "fetched", f"{source.repo}@{snapshot.name[:8]}", rows, snapshot.name)


def _present(target: Path) -> bool:
    return target.is_dir() and any(target.iterdir())


def _write_all(source: Source, snapshot: Path, tmp: Path, report: Progress) -> dict[str, int]:
    rows: dict[str, int] = {}
    report.stage(f"{source.folder} from {source.repo}", total=len(source.files))
    try:
        for spec in source.files:
            written = write_file(source, spec, read_split(source, spec, snapshot), tmp)
            rows[spec.path] = written.rows
            if written.cleaned:
                report.note(
                    f"{source.folder}/{spec.path}: {written.cleaned} texts held a tab or line break, "
                    "written as a space (a TSV line cannot hold them)",
                    level="warn",
                )
            report.advance(1)
    finally:
        report.end(f"{sum(rows.values()):,} rows")
    return rows


def read_split(source: Source, spec: OfficialFile, snapshot: Path) -> list[dict[str, Any]]:
    """The records of one Hub split, every shard in order."""
    import pyarrow.parquet as pq

    shards = sorted((snapshot / spec.config).glob(f"{spec.split}-*.parquet"))
    if not shards:
        raise GPT1Error(
            f"{source.repo}: no {spec.hub_pattern} in the downloaded snapshot {snapshot} (the Hub's "
            "layout changed? pin an older --revision, or get the official distribution)"
        )
    records: list[dict[str, Any]] = []
    for shard in shards:
        try:
            records.extend(pq.read_table(shard).to_pylist())
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
            raise GPT1Error(
                f"{shard}: unreadable parquet file ({type(e).__name__}: {e}) (delete it from the Hugging "
                "Face cache and fetch again)"
            ) from None
    return records


def _provenance(tmp: Path, source: Source, snapshot: Path, rows: dict[str, int]) -> None:
    files = {}
    for spec in source.files:
        p = tmp / spec.path
        files[spec.path] = {"rows": rows[spec.path], **({"sha256": sha256_file(p)} if p.is_file() else {})}
    info = {"repo": source.repo, "repo_type": "dataset", "commit": snapshot.name, "files": files}
    write_text_atomic(tmp / PROVENANCE, json.dumps(info, indent=2) + "\n")


__all__ = ["FetchConfig", "Fetched", "fetch", "fetch_folder", "folders_for", "read_split"]
