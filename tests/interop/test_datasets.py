"""Fetching task data from the Hugging Face Hub (gptcli/interop/datasets.py) against a local stand-in of the Hub's
parquet files, built from the real GLUE files in ../shared/data: RTE and SST-2 as ``nyu-mll/glue`` has them (the
Hub's column names, int labels, ``idx``), in the Hugging Face cache layout, read with ``HF_HUB_OFFLINE`` set.
The test splits, which ../shared lacks, are stand-ins of the official size (unlabeled, as on the Hub)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from hub_standin import DATASET_COMMIT, glue_tables, use_cache, write_dataset_repo

pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="session")
def glue_hub(tmp_path_factory, shared_data) -> Path:
    """The stand-in Hub cache holding ``nyu-mll/glue``'s RTE and SST-2 parquet files (built once, ~1 s)."""
    cache = tmp_path_factory.mktemp("hf-datasets") / "hub"
    write_dataset_repo(cache, "nyu-mll/glue", glue_tables(shared_data / "glue"))
    return cache


@pytest.fixture
def hub(glue_hub, monkeypatch) -> Path:
    use_cache(monkeypatch, glue_hub)
    return glue_hub


def rows_of(task: str, split: str, folder: Path) -> list[tuple]:
    from gptcli.tasks import get_task

    return [(e.texts, e.label, e.uid) for e in get_task(task).read(split, folder)]


def test_fetched_files_are_the_official_ones(hub, shared_data, tmp_path):
    from gptcli.files.outputs import kind_of
    from gptcli.interop.datasets import FetchConfig, fetch

    root = tmp_path / "data"
    results = fetch(FetchConfig(tasks=["rte", "sst2"], root=root))
    assert [(r.folder, r.status) for r in results] == [("RTE", "fetched"), ("SST-2", "fetched")]
    assert results[0].rows == {"train.tsv": 2490, "dev.tsv": 277, "test.tsv": 3000}
    for folder, name in (("RTE", "train.tsv"), ("RTE", "dev.tsv"), ("SST-2", "train.tsv"), ("SST-2", "dev.tsv")):
        assert (root / folder / name).read_bytes() == (shared_data / "glue" / folder / name).read_bytes(), name
    for task, folder in (("rte", "RTE"), ("sst2", "SST-2")):  # what the loaders read back
        for split in ("train", "dev"):
            assert rows_of(task, split, root / folder) == rows_of(task, split, shared_data / "glue" / folder)
    from gptcli.tasks import get_task

    test = get_task("rte").read("test", root / "RTE")
    assert len(test) == 3000 and test[0].label is None and test[7].uid == "7"
    assert (root / "RTE" / "test.tsv").read_text().split("\n", 1)[0] == "index\tsentence1\tsentence2"
    assert kind_of(root / "RTE") == "task-data"
    info = json.loads((root / "RTE" / ".gpt1-fetch.json").read_text())
    assert (
        info["repo"] == "nyu-mll/glue" and info["commit"] == DATASET_COMMIT and info["files"]["dev.tsv"]["rows"] == 277
    )
    assert sorted(p.name for p in root.iterdir()) == ["RTE", "SST-2"]  # no temporaries left


def test_a_folder_that_is_there_is_left_alone(hub, tmp_path):
    from gptcli.errors import GPT1Error
    from gptcli.interop.datasets import FetchConfig, fetch

    root = tmp_path / "data"
    fetch(FetchConfig(tasks=["rte"], root=root))
    stamp = (root / "RTE" / "train.tsv").stat().st_mtime_ns
    again = fetch(FetchConfig(tasks=["rte"], root=root))
    assert again[0].status == "present" and (root / "RTE" / "train.tsv").stat().st_mtime_ns == stamp
    assert fetch(FetchConfig(tasks=["rte"], root=root, overwrite=True))[0].status == "fetched"  # ours: replaced
    (root / "RTE" / "notes.txt").write_text("mine")  # the user's, in a fetched folder: refused, not deleted
    with pytest.raises(GPT1Error, match=r"files gpt1 did not write \(notes.txt\)"):
        fetch(FetchConfig(tasks=["rte"], root=root, overwrite=True))
    assert (root / "RTE" / "notes.txt").read_text() == "mine" and (root / "RTE" / "train.tsv").is_file()
    own = tmp_path / "own"
    (own / "SST-2").mkdir(parents=True)
    (own / "SST-2" / "notes.txt").write_text("mine")
    assert fetch(FetchConfig(tasks=["sst2"], root=own))[0].status == "present"
    with pytest.raises(GPT1Error, match="not something gpt1 wrote"):
        fetch(FetchConfig(tasks=["sst2"], root=own, overwrite=True))
    assert (own / "SST-2" / "notes.txt").read_text() == "mine"


def test_a_truncated_download_fails_loudly_and_writes_nothing(shared_data, tmp_path, monkeypatch):
    from gptcli.errors import GPT1Error
    from gptcli.interop.datasets import FetchConfig, fetch

    cache = tmp_path / "hf"
    write_dataset_repo(
        cache, "nyu-mll/glue", {k: v for k, v in glue_tables(shared_data / "glue", 200).items() if k.startswith("rte/")}
    )
    use_cache(monkeypatch, cache)
    root = tmp_path / "data"
    with pytest.raises(GPT1Error) as e:
        fetch(FetchConfig(tasks=["rte"], root=root))
    assert "nyu-mll/glue (rte/validation) has 200 rows where the official RTE/dev.tsv has 277" in str(e.value)
    assert "nothing was written" in str(e.value)
    assert list(root.iterdir()) == []  # no task folder, no temporary


@pytest.mark.parametrize("fails", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_mid_write_leaves_no_task_folder(hub, tmp_path, monkeypatch, fails):
    import gptcli.interop.datasets as datasets
    from gptcli.interop.datasets import FetchConfig, fetch

    root = tmp_path / "data"
    fetch(FetchConfig(tasks=["sst2"], root=root))  # an earlier, complete fetch
    before = (root / "SST-2" / "dev.tsv").read_bytes()
    real, calls = datasets.write_file, []

    def write_then_fail(source, spec, rows, folder):
        calls.append(spec.path)
        if len(calls) == 2:
            raise fails
        return real(source, spec, rows, folder)

    monkeypatch.setattr(datasets, "write_file", write_then_fail)
    for tasks, overwrite in ((["rte"], False), (["sst2"], True)):
        calls.clear()
        with pytest.raises(type(fails)):
            fetch(FetchConfig(tasks=tasks, root=root, overwrite=overwrite))
    assert sorted(p.name for p in root.iterdir()) == ["SST-2"]  # no RTE, no hidden temporary
    assert (root / "SST-2" / "dev.tsv").read_bytes() == before  # the earlier fetch survived the failed replacement


def test_offline_and_not_cached(tmp_path, monkeypatch):
    from gptcli.errors import GPT1Error
    from gptcli.interop.datasets import FetchConfig, fetch

    use_cache(monkeypatch, tmp_path / "empty")
    with pytest.raises(GPT1Error, match=r"^nyu-mll/glue is not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        fetch(FetchConfig(tasks=["rte"], root=tmp_path / "data"))
    assert not (tmp_path / "data").exists()


def test_which_folders_a_name_means():
    from gptcli.errors import GPT1Error
    from gptcli.interop.datasets import folders_for

    glue, manual = folders_for(["glue"])
    assert glue == ["MNLI", "QNLI", "RTE", "WNLI", "CoLA", "SST-2", "MRPC", "STS-B", "QQP"] and manual == []
    assert folders_for(["race-m", "RACE", "mnli-mm", "mnli"]) == (["RACE", "MNLI"], [])
    every, manual = folders_for(["all"])
    assert {"snli_1.0", "SciTailV1.1", "RACE"} <= set(every) and len(every) == 12
    assert [m[0] for m in manual] == ["storycloze", "dprd", "wsc"]
    with pytest.raises(GPT1Error, match=r"storycloze cannot be fetched: Story Cloze .*request form.*rocstories"):
        folders_for(["rte", "storycloze"])
    with pytest.raises(GPT1Error, match="unknown task 'nope'"):
        folders_for(["nope"])


def test_a_file_where_the_task_folder_goes_is_refused_not_moved(hub, tmp_path):
    """A file named like the task folder was renamed aside (to a hidden ``.RTE.old-…``) by the swap into place;
    now it is refused before any download, and stays where it was."""
    from gptcli.errors import GPT1Error
    from gptcli.interop.datasets import FetchConfig, fetch

    root = tmp_path / "data"
    root.mkdir()
    (root / "RTE").write_text("mine")
    with pytest.raises(GPT1Error, match="is a file, not a directory"):
        fetch(FetchConfig(tasks=["rte"], root=root))
    assert sorted(p.name for p in root.iterdir()) == ["RTE"] and (root / "RTE").read_text() == "mine"
