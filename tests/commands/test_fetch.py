"""`gpt1 fetch` as a command: what it says, where it writes by default, and its one-line refusals. The Hub is the
local stand-in of tests/helpers/hub_standin.py (RTE's parquet files made from the real GLUE files); the fetch
itself is tested in tests/interop/test_datasets.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from error_lines import gpt1
from hub_standin import glue_tables, use_cache, write_dataset_repo

pytest.importorskip("huggingface_hub")

# A terminal wide enough that the lines the tests read do not wrap.
WIDE = {"COLUMNS": "200"}


@pytest.fixture(scope="module")
def rte_hub(tmp_path_factory, shared_data) -> Path:
    cache = tmp_path_factory.mktemp("hf-rte") / "hub"
    write_dataset_repo(cache, "nyu-mll/glue", glue_tables(shared_data / "glue", sst2=False))
    return cache


def test_fetch_into_the_default_data_root_then_finetune_finds_it(rte_hub, tmp_path, capsys, monkeypatch):
    use_cache(monkeypatch, rte_hub)
    monkeypatch.delenv("GPT1_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = gpt1(["fetch", "rte"], capsys, env=WIDE, unwrap_err=True)
    root = tmp_path / ".cache" / "gpt1" / "data"
    assert (
        code == 0
        and f"fetched {root / 'RTE'} from nyu-mll/glue@1a2b3c4d: train.tsv 2,490, dev.tsv 277, test.tsv "
        "3,000 rows (the official release's counts)"
        in err
    ), err
    from gptcli.tasks import get_task

    assert get_task("rte").data_dir() == root / "RTE"  # where every command looks
    code, _, err = gpt1(["fetch", "rte"], capsys, env=WIDE, unwrap_err=True)
    assert code == 0 and "already there (--overwrite fetches it again)" in err
    code, out, _ = gpt1(["fetch", "--list"], capsys, env=WIDE, unwrap_err=True)
    row = next(line for line in out.splitlines() if "│ rte " in line)
    assert "nyu-mll/glue" in row and "yes" in row
    (root / "RTE" / "test.tsv").unlink()  # a folder is not the data: what is missing is named
    (root / "MNLI").mkdir()
    (root / "MNLI" / "README.txt").write_text("GLUE's MNLI")
    code, out, _ = gpt1(["fetch", "--list"], capsys, env=WIDE, unwrap_err=True)
    rows = {line.split("│")[2].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "partly (no test.tsv)" in rows["RTE"] and rows["MNLI"].rstrip(" │").endswith("no")


def test_one_line_refusals(tmp_path, capsys, monkeypatch):
    use_cache(monkeypatch, tmp_path / "empty")
    code, _, err = gpt1(["fetch", "storycloze", "--root", tmp_path / "d"], capsys, env=WIDE, unwrap_err=True)
    assert (
        code == 1
        and err.startswith("error: storycloze cannot be fetched: Story Cloze is given out through a request form")
        and "https://cs.rochester.edu/nlp/rocstories/" in err
    )
    code, _, err = gpt1(["fetch", "--root", tmp_path / "d"], capsys, env=WIDE, unwrap_err=True)
    assert code == 1 and "name the tasks to fetch, e.g. `gpt1 fetch rte`" in err
    code, _, err = gpt1(["fetch", "race", "--root", tmp_path / "d"], capsys, env=WIDE, unwrap_err=True)
    assert code == 1 and err.startswith("error: ehovy/race is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    assert not (tmp_path / "d").exists()
