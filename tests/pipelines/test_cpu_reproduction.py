"""experiments/cpu_reproduction.py: the report code on synthetic runs, and --smoke end to end on the real data."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "cpu_reproduction.py"


@pytest.fixture(scope="module")
def repro():
    spec = importlib.util.spec_from_file_location("cpu_reproduction", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def _write_run(root: Path, rel: str, task: str, metric: str, score: float | None, n_train: int = 100) -> None:
    d = root / rel
    d.mkdir(parents=True)
    scores = {} if score is None else {metric: score}
    (d / "results.json").write_text(json.dumps({"task": task, "metric": metric, "scores": scores, "n_train": n_train,
                                                "n_eval": 50, "epoch": 3, "steps": 12, "elapsed_s": 1.5}))


def test_aggregation_and_tables_on_synthetic_runs(repro, tmp_path):
    scores = {"full": [80.0, 82.0, 84.0], "no-pretraining": [60.0, 61.0, 62.0], "no-aux-lm": [79.0, 81.0, None]}
    for variant, vals in scores.items():
        for seed, v in enumerate(vals):
            _write_run(tmp_path, f"finetune/sst2/{variant}/seed-{seed}", "sst2", "accuracy", v)
    _write_run(tmp_path, "finetune/cola/full/seed-0", "cola", "mcc", 10.0)
    for k, v in enumerate([55.0, 70.0, 75.0]):
        _write_run(tmp_path, f"layers/sst2/k-{k}/seed-0", "sst2", "accuracy", v)

    recs = repro.collect_runs(tmp_path)
    assert len(recs) == 3 * 3 + 1 + 3  # every run, the failed one included
    agg = repro.aggregate(recs)
    full = agg["full"]["sst2"]
    assert full["n"] == 3 and full["mean"] == pytest.approx(82.0) and full["std"] == pytest.approx(2.0)
    assert agg["no-aux-lm"]["sst2"]["n"] == 2 and agg["no-aux-lm"]["sst2"]["failed"] == 1
    assert agg["full"]["cola"]["std"] == 0.0
    assert repro.layers_curve(recs) == {0: (55.0, 0.0, 1), 1: (70.0, 0.0, 1), 2: (75.0, 0.0, 1)}

    md = repro.markdown_tables(recs, agg, {"seeds": 3})
    assert "| full (ours) | 82.0 ± 2.0 |" in md
    assert "| full (paper) | 91.3 | 45.4 | 56.0 | 82.3 | 82.0 | 86.5 |" in md
    assert "| sst2 | +21.0 (t = " in md  # full − no-pretraining, with Welch's t
    assert md.count("| failed |") == 1
    assert "other than 3 scored seeds: full/cola: 1, no-aux-lm/sst2: 2." in md
    # every run has its own row
    assert sum(1 for line in md.splitlines() if line.startswith("| sst2 | ") and "| accuracy |" in line) == 12


def test_mean_std_and_format(repro):
    m, s = repro.mean_std([1.0, 2.0, 3.0])
    assert (m, s) == (2.0, 1.0)
    assert math.isnan(repro.mean_std([])[0])
    assert repro.fmt(float("nan")) == "–"
    assert repro.fmt(50.0, 1.234, 3) == "50.0 ± 1.2"
    assert repro.fmt(50.0, 0.0, 1) == "50.0"
    # Welch: means 2 and 0, variances 1 and 1, n 3 and 3 → t = 2 / sqrt(2/3)
    assert repro.welch_t([1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]) == pytest.approx(2 / math.sqrt(2 / 3))
    assert repro.welch_t([1.0], [2.0, 3.0]) is None and repro.welch_t([1.0, 1.0], [2.0, 2.0]) is None
    assert repro.t_critical(2) == 4.303 and repro.t_critical(30) == 2.042
    assert repro.t_critical(100) == 2.042 and repro.t_critical(100, conservative=False) == 1.960


def test_majority_baselines_on_the_real_dev_splits(repro, shared_data, monkeypatch):
    monkeypatch.setenv("GPT1_DATA", str(shared_data))
    base = repro.majority_baselines()
    # SST-2 dev: 444 of 872 positive (train's majority); MRPC: always "paraphrase" → F1 = 2·279/(2·279+129)
    assert base["sst2"] == pytest.approx(100 * 444 / 872)
    assert base["mrpc"] == pytest.approx(100 * 2 * 279 / (2 * 279 + 129))
    assert base["cola"] == 0.0 and base["stsb"] is None
    assert 50.0 <= base["rte"] < 55.0 and 45.0 <= base["storycloze"] <= 55.0


def test_sst2_margin_auc_is_threshold_free(repro, tmp_path):
    zs = tmp_path / "zeroshot"
    points = []
    # every margin is positive (accuracy would be the positive share at both steps); step 10 orders them perfectly
    for step, margins in ((0, [(1, 2.0), (0, 3.0), (1, 1.0), (0, 4.0)]), (10, [(1, 5.0), (0, 3.0), (1, 4.0), (0, 1.0)])):
        d = zs / f"step-{step:07d}"
        d.mkdir(parents=True)
        rows = [{"label": y, "logprob_positive": m - 10.0, "logprob_negative": -10.0} for y, m in margins]
        (d / "predictions-sst2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        points.append({"checkpoint": f"/elsewhere/checkpoints/step-{step:07d}", "step": step})
    (zs / "curve.json").write_text(json.dumps({"points": points}))
    assert repro.sst2_margin_auc(zs) == {0: 0.0, 10: 1.0}
    assert repro.sst2_margin_auc(tmp_path / "missing") == {}


def test_smoke_end_to_end(repro, shared_data, tmp_path, monkeypatch):
    """The whole pipeline at tiny size on the real books and task files; then a rerun skips every stage."""
    monkeypatch.setenv("GPT1_DATA", str(shared_data))  # main() sets it; restored after the test
    out = tmp_path / "repro"
    assert repro.main(["--smoke", "--seeds", "2", "--out", str(out), "--data", str(shared_data)]) == 0
    res = json.loads((out / "results.json").read_text())
    runs = res["runs"]
    # 6 tasks × 3 variants × 2 seeds, and the layers curve 0..2 on one task
    assert len([r for r in runs if r["variant"] != "layers"]) == 6 * 3 * 2
    assert sorted(r["transfer_layers"] for r in runs if r["variant"] == "layers") == [0, 1, 2]
    assert all(r["score"] is not None and r["n_train"] == 24 for r in runs)
    assert {t for t in res["table5"]["full"]} == set(repro.TASKS)
    assert res["table5"]["full"]["sst2"]["n"] == 2
    assert [p["step"] for p in res["val_curve"]][0] == 0 and res["val_curve"][-1]["step"] == 30
    assert set(res["zeroshot"]["tasks"]) == set(repro.ZEROSHOT_TASKS)
    assert len(res["zeroshot"]["points"]) == 1 + 3  # step 0 + three checkpoints
    for png in ("val_perplexity.png", "zeroshot.png", "table5.png", "layers.png"):
        assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "tables.md").read_text()
    assert "| full (ours) |" in md and "| no-pretraining (paper) |" in md
    assert "| majority class (ours) |" in md and "## Zero-shot SST-2" in md
    assert res["meta"]["baselines"]["mrpc"] > 80 and set(res["meta"]["sst2_margin_auc"]) == {"0", "10", "20", "30"}

    # resumable: a rerun finds every stage's outputs and trains nothing
    before = {p: p.stat().st_mtime_ns for p in out.rglob("results.json") if "finetune" in p.parts or "layers" in p.parts}
    assert repro.main(["--smoke", "--seeds", "2", "--out", str(out), "--data", str(shared_data)]) == 0
    assert {p: p.stat().st_mtime_ns for p in before} == before
