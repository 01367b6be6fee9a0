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
    (d / "results.json").write_text(
        json.dumps(
            {
                "task": task,
                "metric": metric,
                "scores": scores,
                "n_train": n_train,
                "n_eval": 50,
                "epoch": 3,
                "steps": 12,
                "elapsed_s": 1.5,
            }
        )
    )


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


def test_lstm_row_aggregate_and_welch_t_against_full(repro, tmp_path):
    """Table 5's fourth row: the LSTM's ``full`` runs aggregate as the other variants, with Welch's t against full."""
    scores = {
        "full": [80.0, 82.0, 84.0],
        "no-pretraining": [60.0, 61.0, 62.0],
        "no-aux-lm": [79.0, 81.0, 83.0],
        "lstm-full": [70.0, 71.0, 72.0],
    }
    for variant, vals in scores.items():
        for seed, v in enumerate(vals):
            _write_run(tmp_path, f"finetune/sst2/{variant}/seed-{seed}", "sst2", "accuracy", v)
    _write_run(tmp_path, "finetune/cola/lstm-full/seed-0", "cola", "mcc", None)  # a failed run counts as failed

    recs = repro.collect_runs(tmp_path)
    agg = repro.aggregate(recs)
    lstm = agg["lstm-full"]["sst2"]
    assert lstm["n"] == 3 and lstm["mean"] == pytest.approx(71.0) and lstm["std"] == pytest.approx(1.0)
    assert agg["lstm-full"]["cola"] == {
        "scores": [],
        "failed": 1,
        "mean": pytest.approx(math.nan, nan_ok=True),
        "std": pytest.approx(math.nan, nan_ok=True),
        "n": 0,
    }

    md = repro.markdown_tables(recs, agg, {"seeds": 3})
    assert "| LSTM w/ aux LM (ours) | 71.0 ± 1.0 | – |" in md
    # the paper's row (reference §6, Table 5), GLUE-5 average over SST-2, CoLA, RTE, MRPC, STS-B
    assert "| LSTM w/ aux LM (paper) | 90.5 | 30.3 | 54.6 | 83.2 | 71.8 | – | 66.1 |" in md
    assert "| task | full − no-pretraining | full − no-aux-lm | full − LSTM w/ aux LM |" in md
    # means 82 vs 71, variances 4 and 1 over 3 seeds each → t = 11 / sqrt(5/3) = 8.5
    assert repro.welch_t(scores["full"], scores["lstm-full"]) == pytest.approx(11 / math.sqrt(5 / 3))
    assert "| sst2 | +21.0 (t = +16.3) | +1.0 (t = +0.6) | +11.0 (t = +8.5) |" in md
    assert "lstm-full/cola: 0" in md  # its failed cell is flagged as the others'

    # without LSTM runs the report keeps the Transformer-only layout (no empty "ours" row, no extra column)
    recs = [r for r in recs if r["variant"] != "lstm-full"]
    md = repro.markdown_tables(recs, repro.aggregate(recs), {"seeds": 3})
    assert "LSTM w/ aux LM (ours)" not in md and "| LSTM w/ aux LM (paper) |" in md
    assert "| task | full − no-pretraining | full − no-aux-lm |\n" in md


def test_variants_select_the_models_pretrained(repro):
    cfg = repro.ReproConfig()
    assert cfg.variants == ["full", "no-pretraining", "no-aux-lm", "lstm-full"]
    assert repro.pretrained_models(cfg) == ["gpt", "lstm"]
    cfg.variants = ["full", "no-pretraining", "no-aux-lm"]
    assert repro.pretrained_models(cfg) == ["gpt"]
    cfg.curve_models = ["gpt", "lstm"]  # a curve from the LSTM needs it pretrained too
    assert repro.pretrained_models(cfg) == ["gpt", "lstm"]
    pm = repro.pretrained_model(Path("/r"), "lstm")
    assert (pm.init, pm.run, pm.done, pm.zeroshot) == (
        Path("/r/pretrain-lstm-init"),
        Path("/r/pretrain-lstm"),
        Path("/r/pretrain-lstm-done.json"),
        Path("/r/zeroshot-lstm"),
    )
    # the LSTM is pretrained like the Transformer but for its preset and shape
    gpt_pc = repro._pretrain_config(cfg, Path("/r"), Path("/r/corpus"), 5127)
    lstm_pc = repro._pretrain_config(cfg, Path("/r"), Path("/r/corpus"), 5127, "lstm")
    assert (lstm_pc.preset, lstm_pc.out, lstm_pc.model["n_hidden"]) == ("lstm-tiny", Path("/r/pretrain-lstm"), 560)
    same = lambda pc: {k: v for k, v in vars(pc).items() if k not in ("preset", "out", "model")}  # noqa: E731
    assert same(lstm_pc) == same(gpt_pc) and gpt_pc.out == Path("/r/pretrain") and gpt_pc.preset == "tiny"


def test_nested_subsamples_are_nested(repro):
    items = list(range(1000))
    subs = {n: repro.nested_subsample(items, n, "sst2/0") for n in (10, 50, 250, 999)}
    for small, big in ((10, 50), (50, 250), (250, 999)):
        assert set(subs[small]) < set(subs[big])  # a size only adds rows to the smaller one
    assert all(s == sorted(s) and len(s) == n for n, s in subs.items())  # the original order, n rows
    assert repro.nested_subsample(items, 10, "sst2/0") == subs[10]  # seeded: the same rows every time
    assert repro.nested_subsample(items, 10, "sst2/1") != subs[10]
    assert repro.nested_subsample(items, 5000, "sst2/0") == items


def test_nested_task_cuts_only_the_training_split(repro, shared_data, monkeypatch):
    from gptcli.errors import GPT1Error
    from gptcli.tasks import get_task

    monkeypatch.setenv("GPT1_DATA", str(shared_data))
    rows = {}
    for n in (100, 300):
        with repro.nested_task("storycloze", n, "storycloze/0") as name:
            assert name == f"storycloze-n{n}"
            task = get_task(name)
            rows[n] = [e.texts for e in task.read("train")]
            assert len(task.read("dev")) == 374 and task.metric == "accuracy" and task.kind == "multiple_choice"
        with pytest.raises(GPT1Error):  # registered for the block only
            get_task(name)
    assert len(rows[100]) == 100 and len(rows[300]) == 300 and set(rows[100]) < set(rows[300])


def test_labeled_curve_gap_and_welch_t_per_size(repro, tmp_path):
    scores = {
        ("full", 250): [60.0, 62.0, 64.0],
        ("no-pretraining", 250): [50.0, 51.0, 52.0],
        ("full", 500): [70.0, 71.0, 72.0],
        ("no-pretraining", 500): [69.0, 70.0, 71.0],
        ("full", 1000): [80.0],
    }  # no random-init side: a point, but no gap
    for (variant, n), vals in scores.items():
        for seed, v in enumerate(vals):
            _write_run(tmp_path, f"labeled/sst2/{variant}/n-{n}/seed-{seed}", "sst2", "accuracy", v, n_train=n)
    _write_run(tmp_path, "labeled/sst2/no-pretraining/n-500/seed-3", "sst2", "accuracy", None, n_train=500)

    recs = repro.collect_labeled(tmp_path)
    assert len(recs) == 14 and {r["model"] for r in recs} == {"gpt"}
    lab = repro.labeled_curves(recs)
    full = next(c for c in lab["curves"] if c["variant"] == "full")
    assert [p["size"] for p in full["points"]] == [250, 500, 1000]
    rnd500 = next(c for c in lab["curves"] if c["variant"] == "no-pretraining")["points"][1]
    assert rnd500["n"] == 3 and rnd500["failed"] == 1
    gaps = {g["size"]: g for g in lab["gaps"]}
    assert set(gaps) == {250, 500}
    # means 62 vs 51, variances 4 and 1 over 3 seeds each → t = 11 / sqrt(4/3 + 1/3)
    assert gaps[250]["gap"] == pytest.approx(11.0) and gaps[250]["t"] == pytest.approx(11 / math.sqrt(5 / 3))
    assert gaps[500]["gap"] == pytest.approx(1.0) and gaps[500]["t"] == pytest.approx(1 / math.sqrt(2 / 3))

    md = "\n".join(repro.labeled_markdown(lab, {"labeled_seeds": 3, "baselines": {"sst2": 50.9}}))
    assert "| labeled examples | full | no-pretraining | full − no-pretraining (t) |" in md
    assert "| 250 | 62.0 ± 2.0 | 51.0 ± 1.0 | +11.0 (t = +8.5) |" in md
    assert "| 500 | 71.0 ± 1.0 | 70.0 ± 1.0 | +1.0 (t = +1.2) |" in md
    assert "| 1,000 | 80.0 | – | – |" in md and "Majority class (sst2 dev): 50.9." in md


def test_budget_curve_shares_the_final_checkpoints_labeled_runs(repro, tmp_path):
    for step in (0, 10):
        for seed in (0, 1):
            _write_run(
                tmp_path,
                f"budget/sst2/gpt/n-500/step-{step}/seed-{seed}",
                "sst2",
                "accuracy",
                55.0 + step + seed,
                n_train=500,
            )
    for seed in (0, 1, 2):  # the final checkpoint's runs: the labeled curve's (seed 2 is not on the budget curve)
        _write_run(tmp_path, f"labeled/sst2/full/n-500/seed-{seed}", "sst2", "accuracy", 70.0 + seed, n_train=500)
    (tmp_path / "budget" / "val-loss-gpt.json").write_text(
        json.dumps(
            [{"step": k, "checkpoint": f"step-{k}", "val_loss": loss} for k, loss in ((0, 8.0), (10, 5.0), (20, 4.0))]
        )
    )

    recs = repro.collect_budget(tmp_path)
    assert [(r["step"], r["seed"]) for r in recs] == [(0, 0), (0, 1), (10, 0), (10, 1), (20, 0), (20, 1)]
    assert recs[-1]["dir"] == "labeled/sst2/full/n-500/seed-1"
    bud = repro.budget_curves(tmp_path, recs)
    (curve,) = bud["curves"]
    assert (curve["task"], curve["model"], curve["size"]) == ("sst2", "gpt", 500)
    assert [(p["step"], p["mean"]) for p in curve["points"]] == [(0, 55.5), (10, 65.5), (20, 70.5)]
    assert bud["val"]["gpt"][2]["perplexity"] == pytest.approx(math.exp(4.0))
    md = "\n".join(repro.budget_markdown(bud, {"curves": [], "gaps": []}, {"baselines": {"sst2": 50.9}}))
    assert "| 20 | 54.6 | 70.5 ± 0.7 |" in md and "| majority class | – | 50.9 |" in md


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
    for step, margins in (
        (0, [(1, 2.0), (0, 3.0), (1, 1.0), (0, 4.0)]),
        (10, [(1, 5.0), (0, 3.0), (1, 4.0), (0, 1.0)]),
    ):
        d = zs / f"step-{step:07d}"
        d.mkdir(parents=True)
        rows = [{"label": y, "logprob_positive": m - 10.0, "logprob_negative": -10.0} for y, m in margins]
        (d / "predictions-sst2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        points.append({"checkpoint": f"/elsewhere/checkpoints/step-{step:07d}", "step": step})
    (zs / "curve.json").write_text(json.dumps({"points": points}))
    assert repro.sst2_margin_auc(zs) == {0: 0.0, 10: 1.0}
    assert repro.sst2_margin_auc(tmp_path / "missing") == {}


def test_smoke_end_to_end(repro, shared_data, tmp_path, monkeypatch):
    """The whole pipeline at tiny size on the real books and task files: first without the LSTM (a run directory as
    the script made them before it had one), then with it (the LSTM's stages only, nothing else redone); then a
    rerun skips every stage."""
    monkeypatch.setenv("GPT1_DATA", str(shared_data))  # main() sets it; restored after the test
    out = tmp_path / "repro"
    args = ["--smoke", "--seeds", "2", "--out", str(out), "--data", str(shared_data)]
    assert repro.main(args + ["--variants", "full,no-pretraining,no-aux-lm"]) == 0
    assert not any(p.name.startswith(("pretrain-lstm", "zeroshot-lstm")) for p in out.iterdir())
    assert "lstm-full" not in json.loads((out / "results.json").read_text())["table5"]
    transformer = {
        p: p.stat().st_mtime_ns
        for p in out.rglob("*")
        if p.is_file()
        and p.name != "seconds.json"
        and not {"plots", "results.json", "tables.md", "config.json"} & {p.name, *p.relative_to(out).parts}
    }
    assert any("pretrain" in p.parts for p in transformer) and any("labeled" in p.parts for p in transformer)

    assert repro.main(args) == 0  # the default variants add the LSTM to that directory
    assert {p: p.stat().st_mtime_ns for p in transformer} == transformer  # the Transformer's files untouched
    res = json.loads((out / "results.json").read_text())
    runs = res["runs"]
    # 6 tasks × 4 variants (the LSTM's lstm-full included) × 2 seeds, and the layers curve 0..2 on one task
    assert len([r for r in runs if r["variant"] != "layers"]) == 6 * 4 * 2
    assert sorted(r["transfer_layers"] for r in runs if r["variant"] == "layers") == [0, 1, 2]
    assert all(r["score"] is not None and r["n_train"] == 24 for r in runs)
    assert {t for t in res["table5"]["full"]} == set(repro.TASKS)
    assert res["table5"]["full"]["sst2"]["n"] == 2
    # Table 5's LSTM row: pretrained for the same updates, fine-tuned on the same tasks, sizes and seeds
    assert set(res["table5"]["lstm-full"]) == set(repro.TASKS) and res["table5"]["lstm-full"]["sst2"]["n"] == 2
    full_n = {(r["task"], r["seed"]): r["n_train"] for r in runs if r["variant"] == "full"}
    assert {(r["task"], r["seed"]): r["n_train"] for r in runs if r["variant"] == "lstm-full"} == full_n
    lstm = res["models"]["lstm"]
    assert lstm["pretrain"]["step"] == 30 and lstm["pretrain"]["params"] > 0
    assert [p["step"] for p in lstm["val_curve"]][0] == 0 and lstm["val_curve"][-1]["step"] == 30
    # its zero-shot curve: the same tasks at step 0 and every checkpoint, read from LSTM checkpoints
    zs = lstm["zeroshot"]
    assert set(zs["tasks"]) == set(repro.ZEROSHOT_TASKS) and [p["step"] for p in zs["points"]] == [0, 10, 20, 30]
    assert all("pretrain-lstm" in p["checkpoint"] for p in zs["points"])
    assert all(set(p["scores"]) == set(repro.ZEROSHOT_TASKS) for p in zs["points"])
    assert (
        json.loads((out / "pretrain-lstm" / "checkpoints" / "step-0000030" / "config.json").read_text())["arch"]
        == "lstm"
    )
    assert [p["step"] for p in res["val_curve"]][0] == 0 and res["val_curve"][-1]["step"] == 30
    assert set(res["zeroshot"]["tasks"]) == set(repro.ZEROSHOT_TASKS)
    assert len(res["zeroshot"]["points"]) == 1 + 3  # step 0 + three checkpoints
    for png in ("val_perplexity.png", "zeroshot.png", "table5.png", "layers.png"):
        assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "tables.md").read_text()
    assert "| full (ours) |" in md and "| no-pretraining (paper) |" in md
    assert "| majority class (ours) |" in md and "## Zero-shot SST-2" in md
    assert "| LSTM w/ aux LM (ours) |" in md and "| LSTM w/ aux LM (paper) |" in md and "full − LSTM w/ aux LM" in md
    assert "| step | AUC | AUC (LSTM) |" in md and "| LSTM | " in md
    assert res["meta"]["baselines"]["mrpc"] > 80 and set(res["meta"]["sst2_margin_auc"]) == {"0", "10", "20", "30"}
    # the labeled-data curve: 2 tasks × 2 sizes × 2 variants × 1 seed, and a gap per task and size
    lab = res["labeled"]
    assert len(lab["runs"]) == 8 and all(r["score"] is not None for r in lab["runs"])
    assert [r["n_train"] for r in lab["runs"] if r["task"] == "sst2" and r["variant"] == "full"] == [8, 16]
    assert {(g["task"], g["size"]) for g in lab["gaps"]} == {(t, n) for t in ("sst2", "storycloze") for n in (8, 16)}
    # the budget curve: steps 0, 10, 20, 30 per task, the last one being the labeled curve's run
    bud = res["budget"]
    assert {c["task"]: [p["step"] for p in c["points"]] for c in bud["curves"]} == {
        "sst2": [0, 10, 20, 30],
        "storycloze": [0, 10, 20, 30],
    }
    assert [v["step"] for v in bud["val"]["gpt"]] == [0, 10, 20, 30]
    assert sum(r["dir"].startswith("labeled/") for r in bud["runs"]) == 2
    for png in ("labeled.png", "budget.png"):
        assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Labeled-data curve: storycloze" in md and "## Pretraining-budget curve (gpt" in md
    assert "## Every run of the pretraining-budget curve" in md

    # resumable: a rerun finds every stage's outputs and trains nothing (the LSTM's stages included)
    before = {
        p: p.stat().st_mtime_ns
        for p in out.rglob("results.json")
        if {"finetune", "layers", "labeled", "budget"} & set(p.parts)
    }
    assert any("lstm-full" in p.parts for p in before)
    before.update({p: p.stat().st_mtime_ns for p in (out / "pretrain-lstm").rglob("*") if p.is_file()})
    before.update(
        {p: p.stat().st_mtime_ns for p in (out / "pretrain-lstm-done.json", out / "zeroshot-lstm" / "curve.json")}
    )
    assert repro.main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_a_signalled_finetune_run_stops_the_script_with_a_message(repro, tmp_path, monkeypatch):
    """A fine-tuning run stopped by a signal has no scores: the script used to crash on them (KeyError: 'scores')
    when a run was killed; it exits with a line that says to rerun, and nothing is recorded as done."""
    import gptcli.train.finetune as ft

    def stopped(fc):
        return ft.FinetuneResult(Path(fc.out), Path(fc.out), {}, [], "SIGTERM", 3, 10)

    monkeypatch.setattr(ft, "finetune", stopped)
    cfg = repro.ReproConfig(out=tmp_path)
    with pytest.raises(SystemExit, match="stopped by SIGTERM; rerun the same command"):
        repro._finetune_one(cfg, tmp_path / "run", "sst2", 0, "none", None, 0.5, 8)
    assert not (tmp_path / "run" / "results.json").exists()


def test_tasks_option_limits_the_finetune_stage(repro, tmp_path, monkeypatch):
    """--tasks: an invocation fine-tunes only its tasks (two on disjoint tasks share a directory)."""
    seen = []
    monkeypatch.setattr(
        repro,
        "_finetune_one",
        lambda cfg, d, task, *a, **k: seen.append(task) or {"scores": {"accuracy": 50.0}, "n_train": 8},
    )
    import gptcli.checkpoint as ckpt

    monkeypatch.setattr(ckpt, "resolve_checkpoint", lambda run: run)
    cfg = repro.ReproConfig(out=tmp_path, seeds=1, tasks=["rte"], variants=["full"])
    repro.stage_finetune(cfg, tmp_path, tmp_path / "pretrain", {"train_examples": {t: 8 for t in repro.TASKS}})
    assert seen == ["rte"]
