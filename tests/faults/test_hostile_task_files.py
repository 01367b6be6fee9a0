"""Issue #31, classes 5 and 3 (task files): refuse what is ambiguous, count what is skipped, name file and line.

- A header that repeats a column name is refused (which one holds the data?) — GLUE TSVs and Story Cloze alike.
- A split with no examples (header only, blank, CR-only, every row bad) is refused by every command alike
  (``Task.read``): fine-tuning used to report "0 dev examples", no score, and exit 0, while ``eval`` refused.
- A row of only tabs is a row: a bad one, counted under ``--skip-bad-rows`` and named otherwise.
- Story Cloze's train and dev splits read one file: each bad row is counted once, by its own split, at its own
  line (lines counted on ``\\n`` alone, a stray ``\\r`` does not shift them).
- A task file that is a FIFO or a device (``/dev/zero``) is refused before it is read.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli.errors import GPT1Error
from gptcli.tasks import get_task
from gptcli.tasks.base import ReadOptions
from tests.faults.conftest import gpt1, unblock_later

pytestmark = pytest.mark.usefixtures("one_thread")

RTE_HEADER = "index\tsentence1\tsentence2\tlabel"
ROWS = [f"{i}\tA man walks {i}.\tA person moves.\tentailment" for i in range(6)]


def _rte(tmp: Path, train: str | None = None, dev: str | None = None) -> Path:
    d = tmp / "RTE"
    d.mkdir(exist_ok=True)
    (d / "train.tsv").write_text(train if train is not None else "\n".join([RTE_HEADER, *ROWS]) + "\n")
    (d / "dev.tsv").write_text(dev if dev is not None else "\n".join([RTE_HEADER, *ROWS[:3]]) + "\n")
    return d


def _finetune(run: Path, data: Path, tmp: Path, *extra) -> list:
    return [
        "finetune",
        "--task",
        "rte",
        "--init",
        run,
        "--out",
        tmp / "ft",
        "--data-dir",
        data,
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "-q",
        *extra,
    ]


DUPLICATE = "index\tsentence1\tsentence2\tsentence2\tlabel\n" + "0\ta b.\tc d.\te f.\tentailment\n"


@pytest.mark.parametrize("which", ["train", "dev"])
def test_a_header_repeating_a_column_is_refused(run, tmp_path, capsys, which):
    data = _rte(tmp_path, **{which: DUPLICATE})
    line = assert_one_line_error(
        gpt1(_finetune(run, data, tmp_path), capsys), f"{which}.tsv:1: the header repeats column 'sentence2'"
    )
    assert "columns 3 and 4" in line
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize(
    "dev",
    [
        RTE_HEADER + "\n",
        "",
        "\n\n\n",
        RTE_HEADER.replace("\t", "\t") + "\r" + "\r".join(ROWS[:3]) + "\r",
        RTE_HEADER + "\n" + "\t\t\t\n",
    ],
)
def test_a_dev_split_without_examples_is_refused_by_finetune_as_by_eval(run, tmp_path, capsys, dev):
    data = _rte(tmp_path, dev=dev)
    res = gpt1(_finetune(run, data, tmp_path, "--skip-bad-rows"), capsys)
    assert_one_line_error(res, "dev.tsv")
    assert not (tmp_path / "ft").exists()


def test_an_empty_split_is_refused_by_the_library_for_every_reader(tmp_path):
    data = _rte(tmp_path, dev=RTE_HEADER + "\n")
    with pytest.raises(GPT1Error, match=r"split 'dev' of task 'rte' has no examples \(only a header"):
        get_task("rte").read("dev", data)
    data = _rte(tmp_path, dev=RTE_HEADER + "\n" + "1\t\tx\tentailment\n")
    with pytest.raises(GPT1Error, match=r"has no examples \(all 1 rows were bad and skipped"):
        get_task("rte").read("dev", data, ReadOptions(skip_bad_rows=True))


def test_rows_of_only_tabs_are_counted_and_named(tmp_path):
    train = "\n".join([RTE_HEADER, ROWS[0], "\t\t\t", ROWS[1], "\t", ROWS[2]]) + "\n"
    data = _rte(tmp_path, train=train)
    with pytest.raises(GPT1Error, match=r"train.tsv:3: "):
        get_task("rte").read("train", data)
    opts = ReadOptions(skip_bad_rows=True)
    got = get_task("rte").read("train", data, opts)
    assert len(got) == 3
    assert [s.split(": ")[0].rsplit(":", 1)[1] for s in opts.skipped] == ["3", "5"]


# --- Story Cloze --------------------------------------------------------------------------------------------------

HEADER = [
    "InputStoryid",
    "InputSentence1",
    "InputSentence2",
    "InputSentence3",
    "InputSentence4",
    "RandomFifthSentenceQuiz1",
    "RandomFifthSentenceQuiz2",
    "AnswerRightEnding",
]


def _cloze(tmp: Path, n: int, bad: int, stray_cr_before: bool = True, header=HEADER) -> tuple[Path, int]:
    """A Story Cloze folder of ``n`` rows whose row ``bad`` has an empty ending; returns it and that row's line."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL)
    w.writerow(header)
    for i in range(n):
        first = "He left." + ("\r" if stray_cr_before and i == 0 else "")  # a stray CR, quoted by the writer
        w.writerow([f"id{i}", first, "b.", "c.", "d.", "" if i == bad else "e.", "f.", "1"])
    d = tmp / "storycloze"
    d.mkdir()
    (d / "cloze_test_val__spring2016 - cloze_test_ALL_val.csv").write_text(buf.getvalue(), encoding="utf-8")
    return d, bad + 2


def test_a_bad_story_cloze_row_is_counted_once_at_its_own_line(tmp_path):
    d, line = _cloze(tmp_path, 400, bad=17)  # 374 dev rows (the released split), 26 train rows
    task = get_task("storycloze")
    opts = ReadOptions(skip_bad_rows=True)
    train = task.read("train", d, opts)
    dev = task.read("dev", d, opts)
    assert len(train) + len(dev) == 399
    assert len(opts.skipped) == 1, opts.skipped
    assert f"val.csv:{line}: empty RandomFifthSentenceQuiz1" in opts.skipped[0]


def test_a_story_cloze_header_repeating_a_column_is_refused(tmp_path):
    d, _ = _cloze(tmp_path, 5, bad=-1, header=[*HEADER[:2], "InputSentence1", *HEADER[3:]])
    with pytest.raises(GPT1Error, match=r"val.csv:1: the header repeats column 'InputSentence1'"):
        get_task("storycloze").read("val", d)


# --- special files as task files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["fifo", "dev-zero", "dir"])
def test_a_task_file_that_is_not_a_regular_file_is_refused(run, tmp_path, capsys, how):
    data = _rte(tmp_path)
    (data / "dev.tsv").unlink()
    if how == "fifo":
        os.mkfifo(data / "dev.tsv")
        unblock_later(data / "dev.tsv")
    elif how == "dev-zero":
        (data / "dev.tsv").symlink_to("/dev/zero")
    else:
        (data / "dev.tsv").mkdir()
    line = assert_one_line_error(gpt1(_finetune(run, data, tmp_path), capsys), "dev.tsv")
    assert ("not a regular file" if how != "dir" else "directory") in line
    res = gpt1(["eval", "--checkpoint", run, "--task", "rte", "--data-dir", data, "--device", "cpu"], capsys)
    assert res.code == 1 and "Traceback" not in res.err
    shutil.rmtree(tmp_path / "ft", ignore_errors=True)
