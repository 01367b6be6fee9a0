"""eval/baselines.py: what a trivial predictor scores, computed from the data.

The majority levels of the real GLUE dev sets are checked against label counts made here with the csv module,
independently of the task readers and of the metric code.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptcli.eval.baselines import (
    MARGIN,
    baseline_of,
    constant_sentence,
    label_counts,
    level,
    level_note,
    prediction_summary,
    trivial_level,
    verdict,
)
from gptcli.eval.metrics import score_predictions
from gptcli.tasks import get_task
from gptcli.tasks.base import Example


def _column(path: Path, col: int, header: bool) -> list[str]:
    """One column of a GLUE .tsv, read with csv alone (no quoting: GLUE's sentences hold bare quote marks)."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r[col] for r in rows[1 if header else 0 :] if r]


def _real(shared_data: Path, name: str, folder: str) -> tuple:
    task = get_task(name)
    d = shared_data / "glue" / folder
    return task, task.read("train", d), task.read("dev", d), d


# (task, folder, label column, header)
GLUE = [("sst2", "SST-2", -1, True), ("cola", "CoLA", 1, False), ("rte", "RTE", -1, True), ("mrpc", "MRPC", 0, True)]


@pytest.mark.parametrize("name,folder,col,header", GLUE)
def test_majority_levels_of_real_dev_sets_match_counts_made_here(shared_data, name, folder, col, header):
    task, train, dev, d = _real(shared_data, name, folder)
    train_labels, dev_labels = _column(d / "train.tsv", col, header), _column(d / "dev.tsv", col, header)
    counts = Counter(train_labels)
    top = max(task.labels, key=lambda lab: (counts[lab], -task.labels.index(lab)))
    base = baseline_of(task, train, dev)
    assert label_counts(task, train) == {lab: counts[lab] for lab in task.labels}
    assert base["source"] == "train" and base["majority_label"] == top and base["chance"] is None
    hits, n = dev_labels.count(top), len(dev_labels)
    expected = {"accuracy": 100 * hits / n}
    if name == "mrpc":  # always "1" (paraphrase): every positive found, every negative a false positive
        assert top == "1"
        expected["f1"] = 100 * 2 * hits / (2 * hits + (n - hits))
    if name == "cola":
        expected["mcc"] = 0.0  # any constant
    assert base["majority"] == pytest.approx(expected)
    assert list(base["majority"]) == [task.metric, *task.extra_metrics]  # headline first, as the scores


def test_the_real_levels(shared_data):
    """The figures docs/eval.md quotes (majority class of train, on the whole dev split)."""
    got = {}
    for name, folder, _, _ in GLUE:
        task, train, dev, _ = _real(shared_data, name, folder)
        got[name] = {k: round(v, 2) for k, v in baseline_of(task, train, dev)["majority"].items()}
    assert got == {
        "sst2": {"accuracy": 50.92},
        "cola": {"mcc": 0.0, "accuracy": 69.13},
        "rte": {"accuracy": 52.71},
        "mrpc": {"f1": 81.22, "accuracy": 68.38},
    }


def test_stsb_has_no_level(shared_data):
    task, train, dev, _ = _real(shared_data, "stsb", "STS-B")
    base = baseline_of(task, train, dev)
    assert base["majority"] is None and base["majority_label"] is None and base["label_counts"] is None
    assert level(base, "pearson") == ("majority", None) and level(base, "spearman")[1] is None
    assert verdict(0.0, base, "pearson") == "" and level_note({"pearson": 0.0}, base, "pearson") == "majority n/a"


def test_multiple_choice_chance_and_majority_position():
    race = get_task("race")
    train = [Example(("c", "q"), label=y, choices=tuple("abcd")) for y in [3, 3, 3, 0, 1, 2]]
    dev = [
        Example(("c", "q"), label=y, choices=tuple("abcd"), extra={"level": lv})
        for y, lv in [
            (3, "middle"),
            (3, "middle"),
            (3, "high"),
            (0, "high"),
            (1, "high"),
            (2, "middle"),
            (0, "middle"),
            (1, "high"),
        ]
    ]
    base = trivial_level(race, dev, label_counts(race, train))
    assert base["chance"] == 25.0 and base["majority_label"] == "D"
    assert base["majority"] == pytest.approx({"accuracy": 37.5, "accuracy_high": 25.0, "accuracy_middle": 50.0})
    assert level(base, "accuracy") == ("majority", 37.5)  # the always-D answer beats chance here
    assert level(base, "accuracy_high") == ("chance", 25.0)  # equal: chance is named
    # where the training split's favourite position is rare, chance is the level
    rare = trivial_level(race, [Example(("c",), label=y) for y in [0, 1, 2, 0]], label_counts(race, train))
    assert level(rare, "accuracy") == ("chance", 25.0) and rare["majority"]["accuracy"] == 0.0
    assert verdict(25.5, rare, "accuracy") == "≈ chance" and verdict(20.0, rare, "accuracy") == "< chance"


def test_story_cloze_real_dev(shared_data):
    task = get_task("storycloze")
    d = shared_data / "storycloze"
    base = baseline_of(task, task.read("train", d), task.read("dev", d))
    assert base["chance"] == 50.0 and sum(base["label_counts"].values()) == 1497
    name, value = level(base, "accuracy")
    assert value == max(50.0, base["majority"]["accuracy"]) and name == ("majority" if value > 50 else "chance")


def test_without_training_labels_the_evaluated_split_says_and_is_marked():
    rte = get_task("rte")
    dev = [Example(("p", "h"), label=y) for y in [1, 1, 1, 0]]
    for missing in (None, {}, {"0": 5, "1": 1}, {"entailment": 0, "not_entailment": 0}):  # absent, other labels, empty
        base = trivial_level(rte, dev, missing)
        assert base["source"] == "eval" and base["majority_label"] == "not_entailment"
        assert base["majority"] == {"accuracy": 75.0}
    # ties go to the label listed first; an unlabeled split has no level
    assert trivial_level(rte, dev, {"entailment": 3, "not_entailment": 3})["majority_label"] == "entailment"
    assert trivial_level(rte, [Example(("p", "h"))], {"entailment": 3, "not_entailment": 1}) is None


def _mrpc_result(shared_data: Path, preds_of) -> dict:
    task, train, dev, _ = _real(shared_data, "mrpc", "MRPC")
    preds = preds_of(dev)
    return {
        "task": "mrpc",
        "split": "dev",
        "metric": "f1",
        "n": len(dev),
        "scores": score_predictions(task, preds, dev),
        "baseline": baseline_of(task, train, dev),
        **prediction_summary(task, preds),
    }


def test_a_constant_predictor_is_flagged_and_a_good_one_is_not(shared_data):
    const = _mrpc_result(shared_data, lambda dev: [1] * len(dev))
    assert const["prediction_counts"] == {"0": 0, "1": 408} and const["constant_prediction"] == "1"
    assert const["scores"] == const["baseline"]["majority"]  # exactly the majority level: that is what it is
    assert verdict(const["scores"]["f1"], const["baseline"], "f1") == "≈ majority"
    assert verdict(const["scores"]["accuracy"], const["baseline"], "accuracy") == "≈ majority"
    assert (
        constant_sentence(const) == 'all 408 predictions are "1": a constant predictor, whatever its scores look like'
    )
    assert level_note(const["scores"], const["baseline"], "f1") == "≈ majority 81.22"
    minority = _mrpc_result(shared_data, lambda dev: [0] * len(dev))
    assert verdict(minority["scores"]["f1"], minority["baseline"], "f1") == "< majority"
    assert constant_sentence(minority).startswith('all 408 predictions are "0"')
    good = _mrpc_result(shared_data, lambda dev: [int(e.label) for e in dev])
    assert good["constant_prediction"] is None and constant_sentence(good) is None
    assert good["prediction_counts"] == {"0": 129, "1": 279}
    assert (
        verdict(good["scores"]["f1"], good["baseline"], "f1") == ""
        and level_note(good["scores"], good["baseline"], "f1") == "majority 81.22"
    )


def test_margin_edges():
    base = {"majority": {"accuracy": 50.0}, "chance": None, "margin": MARGIN}
    assert MARGIN == 1.0
    assert [verdict(s, base, "accuracy") for s in (48.9, 49.0, 50.0, 51.0, 51.1)] == [
        "< majority",
        "≈ majority",
        "≈ majority",
        "≈ majority",
        "",
    ]
    assert verdict(None, base, "accuracy") == "" and verdict(40.0, None, "accuracy") == ""


def test_regression_prediction_summary():
    stsb = get_task("stsb")
    s = prediction_summary(stsb, [2.5, 2.5, 2.5])
    assert s["constant_prediction"] == "2.500" and s["prediction_stats"]["std"] == 0.0
    s = prediction_summary(stsb, [1.0, 3.0])
    assert s["constant_prediction"] is None and s["prediction_stats"] == {
        "mean": 2.0,
        "std": 1.0,
        "min": 1.0,
        "max": 3.0,
    }
    assert prediction_summary(get_task("sst2"), [1])["constant_prediction"] is None  # one example says nothing


def test_eval_results_json_carries_level_and_prediction_distribution(shared_data, tmp_path):
    """gpt1 eval's writer: the training labels recorded in the checkpoint pick the majority; without them the
    evaluated split's own do; predictions and their counts agree line by line."""
    from gptcli.eval.tasks import write_outputs

    task, train, dev, _ = _real(shared_data, "rte", "RTE")
    ck = SimpleNamespace(
        path=tmp_path / "run" / "checkpoints" / "final",
        meta={"task": "rte", "init": "pre", "train_label_counts": label_counts(task, train)},
    )
    preds = [1] * len(dev)
    res = write_outputs(tmp_path / "ev", ck, task, "dev", dev, preds, [[0.0, 1.0]] * len(dev), skipped=[], n_ctx=64)
    saved = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert saved == json.loads(json.dumps(res))
    assert saved["baseline"]["source"] == "train" and saved["baseline"]["majority_label"] == "entailment"
    assert saved["baseline"]["majority"]["accuracy"] == pytest.approx(100 * 146 / 277)
    assert saved["prediction_counts"] == {"entailment": 0, "not_entailment": 277}
    assert saved["constant_prediction"] == "not_entailment"
    lines = [json.loads(x) for x in (tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()]
    assert Counter(x["prediction"] for x in lines) == Counter({"not_entailment": 277})
    skewed = SimpleNamespace(
        path=ck.path, meta={**ck.meta, "train_label_counts": {"entailment": 1, "not_entailment": 5}}
    )
    res = write_outputs(
        tmp_path / "ev1", skewed, task, "dev", dev, preds, [[0.0, 1.0]] * len(dev), skipped=[], n_ctx=64
    )
    assert res["baseline"]["majority_label"] == "not_entailment"  # the training labels decide, not the dev split's
    assert res["scores"] == res["baseline"]["majority"] == pytest.approx({"accuracy": 100 * 131 / 277})
    old = SimpleNamespace(path=ck.path, meta={"task": "rte", "init": "pre"})  # fine-tuned before the record existed
    res = write_outputs(
        tmp_path / "ev2", old, task, "dev", dev, [0, 1] * 138 + [0], [[0.0, 1.0]] * len(dev), skipped=[], n_ctx=64
    )
    assert res["baseline"]["source"] == "eval" and res["baseline"]["majority_label"] == "entailment"
    assert res["constant_prediction"] is None and res["prediction_counts"] == {"entailment": 139, "not_entailment": 138}
    unlabeled = [Example(e.texts, uid=e.uid) for e in dev[:3]]
    res = write_outputs(
        tmp_path / "ev3", ck, task, "test", unlabeled, [0, 0, 0], [[1.0, 0.0]] * 3, skipped=[], n_ctx=64
    )
    assert res["baseline"] is None and res["constant_prediction"] == "entailment"  # said before a GLUE submission
