"""The official layouts written from the Hub's records (gptcli/tasks/sources.py), read back by the task loaders:
every format the real-file round trip of tests/interop/test_datasets.py does not cover (MNLI, MRPC, CoLA, STS-B,
QQP, SNLI, SciTail, RACE). Rows here are made up; the row-count check is set to their number."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gptcli.errors import GPT1Error
from gptcli.tasks import get_task
from gptcli.tasks.sources import SOURCES, write_file


def write(folder: str, path: str, rows: list[dict], out: Path):
    """Write one official file of ``folder`` from ``rows`` (its official row count set to theirs)."""
    source = SOURCES[folder]
    spec = next(f for f in source.files if f.path == path)
    return write_file(source, dataclasses.replace(spec, rows=len(rows), passages=0), rows, out / folder)


def test_mnli_columns_labels_and_both_dev_files(tmp_path):
    hub = [
        {"premise": "A man sleeps.", "hypothesis": "A man rests.", "label": 0, "idx": 0},
        {"premise": 'He said "no.', "hypothesis": "He agreed.", "label": 2, "idx": 1},
        {"premise": "It rains.", "hypothesis": "It is wet.", "label": 1, "idx": 2},
    ]
    for path in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        write("MNLI", path, hub, tmp_path)
    write("MNLI", "test_matched.tsv", [{**r, "label": -1} for r in hub], tmp_path)
    lines = (tmp_path / "MNLI" / "dev_matched.tsv").read_text().splitlines()
    assert len(lines[0].split("\t")) == 16 and lines[0].endswith("label5\tgold_label")
    assert len((tmp_path / "MNLI" / "train.tsv").read_text().splitlines()[0].split("\t")) == 12
    train = get_task("mnli").read("train", tmp_path / "MNLI")
    assert [get_task("mnli").labels[e.label] for e in train] == ["entailment", "contradiction", "neutral"]
    assert train[1].texts == ('He said "no.', "He agreed.") and train[2].uid == "2"
    assert len(get_task("mnli-mm").read("dev", tmp_path / "MNLI")) == 3
    assert [e.label for e in get_task("mnli").read("test", tmp_path / "MNLI")] == [None] * 3


def test_mrpc_bom_cola_without_header_stsb_scores_and_qqp(tmp_path):
    write("MRPC", "train.tsv", [{"sentence1": "a b", "sentence2": "b a", "label": 1, "idx": 0}], tmp_path)
    raw = (tmp_path / "MRPC" / "train.tsv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t\t\ta b\tb a\n")
    assert get_task("mrpc").read("train", tmp_path / "MRPC")[0].label == 1
    write(
        "CoLA",
        "train.tsv",
        [{"sentence": "The cat sat.", "label": 1, "idx": 0}, {"sentence": "Cat the sat.", "label": 0, "idx": 1}],
        tmp_path,
    )
    assert (tmp_path / "CoLA" / "train.tsv").read_text() == "\t1\t\tThe cat sat.\n\t0\t\tCat the sat.\n"
    assert [e.label for e in get_task("cola").read("train", tmp_path / "CoLA")] == [1, 0]
    import numpy as np

    scores = [float(np.float32(x)) for x in (3.8, 5.0, 0.6)]  # as parquet float32 columns come back
    write(
        "STS-B",
        "dev.tsv",
        [{"sentence1": "x", "sentence2": "y", "label": s, "idx": i} for i, s in enumerate(scores)],
        tmp_path,
    )
    assert [line.rsplit("\t", 1)[1] for line in (tmp_path / "STS-B" / "dev.tsv").read_text().splitlines()[1:]] == [
        "3.8",
        "5.0",
        "0.6",
    ]
    assert [e.label for e in get_task("stsb").read("dev", tmp_path / "STS-B")] == pytest.approx([3.8, 5.0, 0.6])
    write("QQP", "test.tsv", [{"question1": "Why?", "question2": "How?", "label": -1, "idx": 9}], tmp_path)
    assert (tmp_path / "QQP" / "test.tsv").read_text() == "id\tquestion1\tquestion2\n9\tWhy?\tHow?\n"


def test_snli_no_consensus_rows_and_scitail(tmp_path):
    write(
        "snli_1.0",
        "snli_1.0_dev.jsonl",
        [
            {"premise": "A dog runs.", "hypothesis": "An animal moves.", "label": 0},
            {"premise": "A dog runs.", "hypothesis": "A cat.", "label": -1},
        ],
        tmp_path,
    )
    first = json.loads((tmp_path / "snli_1.0" / "snli_1.0_dev.jsonl").read_text().splitlines()[0])
    assert first == {"gold_label": "entailment", "sentence1": "A dog runs.", "sentence2": "An animal moves."}
    from gptcli.tasks.base import ReadOptions

    opts = ReadOptions()
    assert len(get_task("snli").read("dev", tmp_path / "snli_1.0", opts)) == 1 and len(opts.excluded) == 1
    written = write(
        "SciTailV1.1",
        "tsv_format/scitail_1.0_test.tsv",
        [{"premise": "Plants\tuse light.", "hypothesis": "Plants need light.", "label": "entails"}],
        tmp_path,
    )
    assert written.cleaned == 1  # a tab cannot stay inside a TSV cell
    ex = get_task("scitail").read("test", tmp_path / "SciTailV1.1")
    assert ex[0].texts == ("Plants use light.", "Plants need light.") and ex[0].label == 0


def test_race_passages_grouped_into_their_files(tmp_path):
    rows = [
        {
            "example_id": "middle12.txt",
            "article": "Tom has a dog.",
            "question": "What does Tom have?",
            "options": ["A cat", "A dog", "A fish", "A bird"],
            "answer": "B",
        },
        {
            "example_id": "middle12.txt",
            "article": "Tom has a dog.",
            "question": "Who has a dog?",
            "options": ["Tom", "Ann", "Bob", "Sue"],
            "answer": "A",
        },
        {
            "example_id": "middle3.txt",
            "article": "It rains.",
            "question": "What is the weather?",
            "options": ["Sun", "Rain", "Snow", "Wind"],
            "answer": "B",
        },
    ]
    written = write("RACE", "dev/middle", rows, tmp_path)
    assert written.passages == 2 and sorted(p.name for p in (tmp_path / "RACE" / "dev" / "middle").iterdir()) == [
        "12.txt",
        "3.txt",
    ]
    obj = json.loads((tmp_path / "RACE" / "dev" / "middle" / "12.txt").read_text())
    assert list(obj) == ["answers", "options", "questions", "article", "id"] and obj["answers"] == ["B", "A"]
    (tmp_path / "RACE" / "dev" / "high").mkdir()
    ex = get_task("race-m").read("dev", tmp_path / "RACE")
    assert [e.uid for e in ex] == ["middle3.txt-0", "middle12.txt-0", "middle12.txt-1"] and ex[1].label == 1


def test_counts_must_be_the_official_releases(tmp_path):
    source = SOURCES["RTE"]
    spec = next(f for f in source.files if f.path == "dev.tsv")
    assert spec.rows == 277 and spec.hub_pattern == "rte/validation-*.parquet"
    with pytest.raises(GPT1Error, match="has 2 rows where the official RTE/dev.tsv has 277"):
        write_file(source, spec, [{"sentence1": "a", "sentence2": "b", "label": 0, "idx": 0}] * 2, tmp_path)
    assert not (tmp_path / "dev.tsv").exists()
    race = SOURCES["RACE"]
    assert sum(f.rows for f in race.files if f.split == "train") == 87866
    assert {f.path: f.passages for f in race.files if f.path.startswith("test")} == {
        "test/middle": 362,
        "test/high": 1045,
    }
