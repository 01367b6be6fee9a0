"""Result tables that cannot mislead: the trivial predictor's level beside every score, in every place that shows
one (commands/render.py's two tables, the per-epoch line of fine-tuning, `gpt1 finetune`'s final table)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from error_lines import gpt1
from rich.console import Console

from gptcli.commands.render import details_table, results_table
from gptcli.eval.baselines import baseline_of, label_counts, prediction_summary, trivial_level
from gptcli.eval.metrics import score_predictions
from gptcli.tasks import get_task
from gptcli.tasks.base import Example


def _text(renderable) -> str:
    console = Console(record=True, width=400)  # notes on one line each
    console.print(renderable)
    return console.export_text()


def _result(task_name: str, run: str, train, dev, preds, model: str, **extra) -> dict:
    task = get_task(task_name)
    return {
        "task": task.name,
        "title": task.title,
        "split": "dev",
        "metric": task.metric,
        "paper_score": task.paper_score,
        "n": len(dev),
        "run": run,
        "model": model,
        "scores": score_predictions(task, preds, dev),
        "baseline": baseline_of(task, train, dev),
        **prediction_summary(task, preds),
        **extra,
    }


@pytest.fixture(scope="module")
def real(shared_data):
    out = {}
    for name, folder in (("mrpc", "MRPC"), ("sst2", "SST-2"), ("stsb", "STS-B")):
        task = get_task(name)
        d = shared_data / "glue" / folder
        out[name] = (task.read("train", d), task.read("dev", d))
    return out


def test_combined_table_shows_levels_and_flags_the_constant_run(real):
    mrpc_train, mrpc_dev = real["mrpc"]
    sst_train, sst_dev = real["sst2"]
    sts_train, sts_dev = real["stsb"]
    race = get_task("race")
    race_dev = [Example(("c", "q"), label=y, choices=tuple("abcd")) for y in [0, 1, 2, 3, 0, 1, 2, 3]]
    results = [
        _result("mrpc", "small-mrpc", mrpc_train, mrpc_dev, [1] * len(mrpc_dev), "small"),  # 79.9-style trap
        _result("sst2", "small-sst2", sst_train, sst_dev, [int(e.label) for e in sst_dev], "small"),
        _result("stsb", "small-stsb", sts_train, sts_dev, [float(e.label) for e in sts_dev], "small"),
        {
            **_result("race", "small-race", race_dev, race_dev, [0, 1, 2, 3, 1, 2, 3, 0], "small"),
            "baseline": trivial_level(race, race_dev, {"A": 9, "B": 1, "C": 1, "D": 1}),
        },
        _result("mrpc", "big-mrpc", mrpc_train, mrpc_dev, [int(e.label) for e in mrpc_dev], "big"),
    ]
    text = _text(results_table(results))
    rows = _rows(text)
    # columns: MRPC, SST-2, STS-B, RACE; the level row sits under the paper's, named for both kinds it holds
    assert rows["GPT-1 (paper)"] == ["82.3", "91.3", "82.0", "59.0"]
    assert rows["majority / chance"] == ["81.2", "50.9", "n/a", "25.0 chance"]
    assert rows["small"] == ["81.2 ≈ majority", "100.0", "100.0", "50.0"]
    assert rows["big"][0] == "100.0"
    assert 'small-mrpc · mrpc (dev): all 408 predictions are "1": a constant predictor' in text
    assert "within 1 point of that level" in text and "chance: one of the answers at random" in text
    assert "n/a: a constant prediction has no correlation" in text
    assert "small-sst2" not in text and "†" not in text  # a good run is not named; every level from training labels
    details = _text(details_table(results))
    assert "majority / chance" in details and "│ 81.2 ≈ majority │" in details and "│ 68.4 ≈ majority │" in details
    assert "all 408 predictions" in details
    assert "all 408 predictions" not in _text(details_table(results, notes=False))
    notes = results_table(results).renderables[1].plain  # the table, then its notes: the legend, one-label runs
    assert notes.splitlines()[1:] == [
        'small-mrpc · mrpc (dev): all 408 predictions are "1": a constant predictor, whatever its scores look like.'
    ]


def _rows(text: str) -> dict[str, list[str]]:
    return {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in text.splitlines()
        if line.startswith("│")
    }


def test_a_table_of_good_runs_has_no_marks_and_names_its_level_plainly(real):
    mrpc_train, mrpc_dev = real["mrpc"]
    preds = [int(e.label) if i % 10 else 1 - int(e.label) for i, e in enumerate(mrpc_dev)]  # 90 % right
    good = _result("mrpc", "good", mrpc_train, mrpc_dev, preds, "pre")
    text = _text(results_table([good])) + _text(details_table([good]))
    assert "≈ majority" not in text and "< majority" not in text and "predictions are" not in text
    assert "chance" not in text and "n/a" not in text and "†" not in text
    rows = _rows(text)
    assert rows["majority"] == ["81.2"] and rows["pre"] == [f"{good['scores']['f1']:.1f}"]
    assert rows["good"][2:5] == ["f1 *", f"{good['scores']['f1']:.1f}", "81.2"]


def test_levels_from_the_evaluated_split_are_marked(real):
    mrpc_train, mrpc_dev = real["mrpc"]
    r = _result("mrpc", "old", mrpc_train, mrpc_dev, [1] * len(mrpc_dev), "pre")
    r["baseline"] = trivial_level(get_task("mrpc"), mrpc_dev, None)  # a checkpoint that records no training labels
    text = _text(results_table([r]))
    assert "81.2†" in text and "†: majority of the evaluated split's own labels" in text


def test_the_per_epoch_line_shows_the_level():
    from gptcli.train.finetune_dev import epoch_line as _epoch_line

    rte = get_task("rte")
    train = [Example(("p", "h"), label=y) for y in [0, 0, 0, 1]]
    dev = [Example(("p", "h"), label=y) for y in [0, 0, 1, 1, 0]]
    run = SimpleNamespace(task=rte, data=SimpleNamespace(train=train, dev=dev))
    record = {"kind": "eval", "step": 6, "epoch": 2, "split": "dev", "accuracy": 60.0}
    assert _epoch_line(record, run) == "epoch 2 (update 6): dev accuracy 60.00 (≈ majority 60.00)"
    assert _epoch_line({**record, "accuracy": 80.0}, run).endswith("accuracy 80.00 (majority 60.00)")
    assert _epoch_line({**record, "accuracy": 40.0}, run).endswith("(< majority 60.00)")
    assert _epoch_line(record) == "epoch 2 (update 6): dev accuracy 60.00"
    stsb = SimpleNamespace(
        task=get_task("stsb"), data=SimpleNamespace(train=[Example(("a", "b"), 1.0)], dev=[Example(("a", "b"), 2.0)])
    )
    sts_record = {"kind": "eval", "step": 6, "epoch": 2, "split": "dev", "pearson": 0.0, "spearman": 0.0}
    assert _epoch_line(sts_record, stsb).endswith("pearson 0.00, spearman 0.00 (majority n/a)")
    assert _epoch_line({"kind": "eval", "step": 3, "epoch": 1, "split": ""}, run) == "epoch 1 (update 3): no eval"
    one_class = {
        **record,
        "prediction_counts": {"entailment": 5, "not_entailment": 0},
        "constant_prediction": "entailment",
    }
    assert _epoch_line(one_class, run) == (
        "epoch 2 (update 6): dev accuracy 60.00 (≈ majority 60.00); all 5 "
        'predictions are "entailment": a constant predictor, whatever its scores '
        "look like"
    )
    mixed = {**record, "prediction_counts": {"entailment": 3, "not_entailment": 2}, "constant_prediction": None}
    assert _epoch_line(mixed, run) == "epoch 2 (update 6): dev accuracy 60.00 (≈ majority 60.00)"


def test_gpt1_finetune_shows_the_level_per_epoch_and_in_its_table(pretrained, shared_data, tmp_path, capsys):
    code, out, err = gpt1(
        [
            "finetune",
            "--task",
            "rte",
            "--init",
            str(pretrained),
            "--out",
            str(tmp_path / "run"),
            "--data-dir",
            str(shared_data / "glue" / "RTE"),
            "--max-train-examples",
            "16",
            "--max-eval-examples",
            "8",
            "--batch-size",
            "8",
            "--epochs",
            "1",
            "--lr",
            "1e-3",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ],
        capsys,
        env={"COLUMNS": "200"},
    )
    output = out + err
    assert code == 0, output
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    base = res["baseline"]
    assert base["source"] == "train" and sum(base["label_counts"].values()) == 16
    level = base["majority"]["accuracy"]
    assert f"majority {level:.2f})" in output  # the epoch line: "(majority 50.00)" / "(≈ majority 50.00)"
    assert "│ majority │" in output.replace("┃", "│") and f"{level:.1f}" in output
    from gptcli.checkpoint import read_header

    assert read_header(tmp_path / "run").meta["train_label_counts"] == base["label_counts"]
    assert sum(res["prediction_counts"].values()) == 8 and "constant_prediction" in res  # the chosen epoch's
    assert set(res["scores"]) == {"accuracy"}  # the distribution is not a score


def test_label_counts_lists_every_label_in_order():
    assert label_counts(get_task("race"), [Example(("c",), label=2)]) == {"A": 0, "B": 0, "C": 1, "D": 0}
    assert label_counts(get_task("stsb"), [Example(("a", "b"), label=1.0)]) is None
    assert label_counts(get_task("rte"), [Example(("p", "h"))]) is None
