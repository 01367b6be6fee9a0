"""Fine-tuning end to end on CPU with a tiny model, evaluation read-back, ablation switches, progress reports.

The command-line tests of `gpt1 finetune` and `gpt1 eval` are in tests/commands/."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from toy_model import TINY
from toy_tokenizer import ToyTokenizer

from gptcli.checkpoint import load_checkpoint, save_checkpoint
from gptcli.errors import GPT1Error
from gptcli.eval.tasks import evaluate_task, load_results
from gptcli.model.gpt import GPT
from gptcli.progress import RecordingProgress
from gptcli.train.finetune import FinetuneConfig, finetune
from gptcli.train.finetune_setup import build_body

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "tasks" / "fixtures"


def _cfg(task: str, init, out: Path, data_dir, **kw) -> FinetuneConfig:
    base = dict(
        task=task,
        init=str(init),
        out=str(out),
        data_dir=str(data_dir),
        max_train_examples=24,
        max_eval_examples=16,
        batch_size=8,
        epochs=2,
        lr=1e-3,
        device="cpu",
        precision="fp32",
        log_every=1,
    )
    base.update(kw)
    return FinetuneConfig(**base)


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


# One task of each kind, on the real files where they exist (subsampled) and on the format fixtures otherwise.
KINDS = [
    ("sst2", "glue/SST-2", "classification", "accuracy"),
    ("rte", "glue/RTE", "entailment", "accuracy"),
    ("mrpc", "glue/MRPC", "similarity", "f1"),
    ("stsb", "glue/STS-B", "regression", "pearson"),
    ("storycloze", "storycloze", "multiple_choice", "accuracy"),
]


@pytest.mark.parametrize("task,folder,kind,metric", KINDS, ids=[k[0] for k in KINDS])
def test_finetune_each_kind_end_to_end(task, folder, kind, metric, pretrained, shared_data, tmp_path):
    run = tmp_path / task
    res = finetune(_cfg(task, pretrained, run, shared_data / folder))
    assert res.checkpoint == run / "checkpoints" / "final"
    results = json.loads((run / "results.json").read_text())
    assert results["task"] == task and results["n_train"] == 24 and results["n_eval"] == 16
    assert metric in results["scores"] and len(results["history"]) == 2
    train = _records(run, "train")
    assert [r["step"] for r in train] == list(range(1, 7))  # 24 examples / batch 8 × 2 epochs
    assert all("lm_loss" in r and "clf_loss" in r for r in train)
    # The released warmup_linear over T = 6 updates: update t runs at lr·(1 − t/T), the first (t = 0) at 0.
    assert train[0]["lr"] == 0 and train[-1]["lr"] == pytest.approx(1e-3 * (1 - 5 / 6), rel=1e-6)
    ck = load_checkpoint(run)
    assert ck.kind == "finetuned" and ck.config.n_special == 3 and ck.meta["kind"] == kind
    assert ck.meta["head"]["extract_id"] == 99 and set(ck.head_state) == {"linear.weight", "linear.bias"}
    # eval reads the run back and scores the same dev subset identically.
    ev = evaluate_task(
        task,
        run,
        "dev",
        data_dir=shared_data / folder,
        out=tmp_path / "ev",
        device="cpu",
        precision="fp32",
        max_examples=16,
    )
    assert ev["scores"][metric] == pytest.approx(results["scores"][metric])
    preds = [json.loads(x) for x in (tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 16 and all("prediction" in p and "label" in p for p in preds)
    assert json.loads((tmp_path / "ev" / "results.json").read_text())["scores"] == ev["scores"]
    assert load_results([tmp_path / "ev", run / "results.json"]) == [
        json.loads((tmp_path / "ev" / "results.json").read_text()),
        results,
    ]


def test_race_fixture_multiple_choice_and_levels(pretrained, tmp_path):
    res = finetune(
        _cfg(
            "race",
            pretrained,
            tmp_path / "race",
            FIXTURES / "RACE",
            max_train_examples=None,
            max_eval_examples=None,
            batch_size=2,
            epochs=1,
        )
    )
    assert res.results["n_train"] > 0
    ck = load_checkpoint(tmp_path / "race")
    assert ck.meta["head"]["kind"] == "multiple_choice"
    ev = evaluate_task("race", tmp_path / "race", "test", data_dir=FIXTURES / "RACE", out=tmp_path / "ev", device="cpu")
    assert {"accuracy", "accuracy_middle", "accuracy_high"} <= set(ev["scores"])
    # A run fine-tuned on `race` scores `race-m` (same kind and labels).
    ev_m = evaluate_task(
        "race-m", tmp_path / "race", "test", data_dir=FIXTURES / "RACE", out=tmp_path / "evm", device="cpu"
    )
    assert set(ev_m["scores"]) == {"accuracy"}


def test_unlabeled_test_split_gives_a_glue_submission(pretrained, shared_data, tmp_path):
    data = tmp_path / "SST-2"
    data.mkdir()
    for f in ("train.tsv", "dev.tsv"):
        (data / f).symlink_to(shared_data / "glue" / "SST-2" / f)
    (data / "test.tsv").write_bytes((FIXTURES / "glue_test" / "SST-2" / "test.tsv").read_bytes())
    finetune(_cfg("sst2", pretrained, tmp_path / "run", data, epochs=1))
    ev = evaluate_task("sst2", tmp_path / "run", "test", data_dir=data, device="cpu")
    sub = Path(ev["submission"])
    assert sub.name == "SST-2.tsv" and sub.parent == tmp_path / "run" / "eval" / "sst2-test"
    lines = sub.read_text().splitlines()
    ids = [ln.split("\t")[0] for ln in (FIXTURES / "glue_test" / "SST-2" / "test.tsv").read_text().splitlines()[1:]]
    assert lines[0] == "index\tprediction" and [ln.split("\t")[0] for ln in lines[1:]] == ids
    assert {ln.split("\t")[1] for ln in lines[1:]} <= {"0", "1"}
    assert ev["scores"] == {} and not ev["labeled"]


def test_stsb_submission_is_a_score(pretrained, shared_data, tmp_path):
    data = tmp_path / "STS-B"
    data.mkdir()
    for f in ("train.tsv", "dev.tsv"):
        (data / f).symlink_to(shared_data / "glue" / "STS-B" / f)
    (data / "test.tsv").write_bytes((FIXTURES / "glue_test" / "STS-B" / "test.tsv").read_bytes())
    finetune(_cfg("stsb", pretrained, tmp_path / "run", data, epochs=1))
    ev = evaluate_task("stsb", tmp_path / "run", "test", data_dir=data, device="cpu")
    rows = Path(ev["submission"]).read_text().splitlines()[1:]
    assert Path(ev["submission"]).name == "STS-B.tsv"
    assert all(0.0 <= float(r.split("\t")[1]) <= 5.0 for r in rows)


def test_eval_refuses_a_task_of_another_kind(pretrained, shared_data, tmp_path):
    finetune(_cfg("rte", pretrained, tmp_path / "run", shared_data / "glue" / "RTE", epochs=1))
    with pytest.raises(GPT1Error, match="cannot score task 'sst2'"):
        evaluate_task("sst2", tmp_path / "run", "dev", data_dir=shared_data / "glue" / "SST-2", device="cpu")
    with pytest.raises(GPT1Error, match="not a fine-tuned checkpoint"):
        evaluate_task("rte", pretrained, "dev", data_dir=shared_data / "glue" / "RTE", device="cpu")


# --------------------------------------------------------------------------------------------- ablation switches


def test_transfer_layers_keeps_exactly_the_first_k_blocks(pretrained):
    pre = load_checkpoint(pretrained).model.state_dict()
    gpt, tok, source = build_body(str(pretrained), transfer_layers=1)
    sd = gpt.state_dict()
    assert source["transfer_layers"] == 1
    torch.testing.assert_close(sd["tok_emb.weight"][:97], pre["tok_emb.weight"])
    torch.testing.assert_close(sd["pos_emb.weight"], pre["pos_emb.weight"])
    for k, v in pre.items():
        if k.startswith("blocks.0."):
            torch.testing.assert_close(sd[k], v)
        elif k.startswith("blocks.1.") and k.endswith("weight") and "ln_" not in k:
            assert not torch.allclose(sd[k], v) and abs(sd[k].std().item() - 0.02) < 0.01  # fresh N(0, 0.02)
    assert torch.all(sd["blocks.1.attn.qkv.bias"] == 0) and torch.all(sd["blocks.1.ln_1.weight"] == 1)
    # K = 0: embeddings only; K = n_layer: everything.
    gpt0, _, _ = build_body(str(pretrained), transfer_layers=0)
    assert not torch.allclose(gpt0.state_dict()["blocks.0.mlp.fc.weight"], pre["blocks.0.mlp.fc.weight"])
    gpt2, _, _ = build_body(str(pretrained), transfer_layers=2)
    torch.testing.assert_close(gpt2.state_dict()["blocks.1.mlp.fc.weight"], pre["blocks.1.mlp.fc.weight"])
    with pytest.raises(GPT1Error, match="between 0 and 2"):
        build_body(str(pretrained), transfer_layers=3)


def test_special_tokens_are_appended_with_small_random_rows(pretrained):
    gpt, tok, _ = build_body(str(pretrained))
    emb = gpt.tok_emb.weight
    assert emb.shape[0] == 100 == tok.total_vocab and gpt.config.n_special == 3
    new = emb[97:]
    assert new.abs().max() < 0.2 and new.std() > 0.005


def test_init_none_is_random_with_the_checkpoint_shape(pretrained, tmp_path):
    pre = load_checkpoint(pretrained).model.state_dict()
    torch.manual_seed(1)  # the fixture's "pretrained" weights were drawn from seed 0
    gpt, tok, source = build_body("none", str(pretrained))
    assert source["init"] == "none" and gpt.config.n_layer == TINY.n_layer and tok.vocab_size == 97
    assert not torch.allclose(gpt.state_dict()["blocks.0.mlp.fc.weight"], pre["blocks.0.mlp.fc.weight"])
    with pytest.raises(GPT1Error, match="--init none needs --tokenizer"):
        build_body("none")
    # A bare tokenizer directory: the shape comes from the --model preset.
    ToyTokenizer(97).save(tmp_path / "tok")
    gpt, tok, _ = build_body("none", str(tmp_path / "tok"), model="tiny")
    assert gpt.config.n_layer == 4 and gpt.config.vocab_size == 97 and gpt.config.n_special == 3


def test_tokenizer_with_a_pretrained_init_must_be_the_checkpoints_own(pretrained, tmp_path):
    # The checkpoint's own tokenizer, named again (the checkpoint, or a copy of its folder): accepted.
    shutil.copytree(pretrained / "tokenizer", tmp_path / "same")
    for same in (pretrained, tmp_path / "same"):
        _, tok, _ = build_body(str(pretrained), str(same))
        assert tok.vocab_size == 97
    # Another tokenizer of the same vocabulary size (other content): refused, saying what to do.
    ToyTokenizer(97).save(tmp_path / "other")
    (tmp_path / "other" / "learned_from.txt").write_text("another text", encoding="utf-8")
    with pytest.raises(GPT1Error, match=r"another tokenizer than the checkpoint .*drop --tokenizer.*--init none"):
        build_body(str(pretrained), str(tmp_path / "other"))


def test_lm_weight_zero_disables_the_lm_term(pretrained, shared_data, tmp_path):
    finetune(_cfg("rte", pretrained, tmp_path / "a", shared_data / "glue" / "RTE", lm_weight=0.0, epochs=1))
    finetune(_cfg("rte", pretrained, tmp_path / "b", shared_data / "glue" / "RTE", lm_weight=0.5, epochs=1))
    a, b = _records(tmp_path / "a", "train"), _records(tmp_path / "b", "train")
    assert all("lm_loss" not in r and r["loss"] == pytest.approx(r["clf_loss"]) for r in a)
    assert all(r["loss"] == pytest.approx(r["clf_loss"] + 0.5 * r["lm_loss"], rel=1e-5) for r in b)
    # Same seed and data: the first update's task loss is the same, only the LM term differs.
    assert a[0]["clf_loss"] == pytest.approx(b[0]["clf_loss"], rel=1e-5)


@pytest.mark.parametrize("select,epoch", [("best", 2), ("last", 3)])
def test_select_best_or_last(select, epoch, pretrained, shared_data, tmp_path, monkeypatch):
    import gptcli.train.finetune_job as ft_job

    scores = iter([60.0, 80.0, 70.0])
    monkeypatch.setattr(ft_job, "score_predictions", lambda task, preds, ex: {"accuracy": next(scores)})
    snaps = []
    real = ft_job.cpu_state
    monkeypatch.setattr(ft_job, "cpu_state", lambda m: snaps.append(real(m)) or snaps[-1])
    res = finetune(_cfg("rte", pretrained, tmp_path / select, shared_data / "glue" / "RTE", epochs=3, select=select))
    assert res.results["epoch"] == epoch and res.results["scores"] == {"accuracy": [60.0, 80.0, 70.0][epoch - 1]}
    assert res.results["last_scores"] == {"accuracy": 70.0}  # the unbiased figure beside a best epoch's
    ck = load_checkpoint(tmp_path / select)
    assert ck.meta["epoch"] == epoch
    if select == "best":
        # The kept weights are the ones snapshotted after epoch 2 (epoch 1 was snapshotted first).
        torch.testing.assert_close(ck.head_state["linear.weight"], snaps[-1]["head.linear.weight"])
        torch.testing.assert_close(
            ck.model.state_dict()["blocks.0.mlp.fc.weight"], snaps[-1]["gpt.blocks.0.mlp.fc.weight"]
        )
    else:
        assert not snaps  # nothing to keep in memory


def test_micro_batches_accumulate_to_the_same_update(shared_data, tmp_path):
    from dataclasses import replace

    # Without dropout the update is deterministic, so accumulation must reproduce the full-batch update.
    torch.manual_seed(0)
    nodrop = replace(TINY, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    pre = save_checkpoint(tmp_path / "pre", GPT(nodrop), ToyTokenizer(97))
    common = dict(epochs=1, clf_pdrop=0.0, lm_weight=0.5, eval_split="")
    finetune(_cfg("sst2", pre, tmp_path / "full", shared_data / "glue" / "SST-2", **common))
    finetune(_cfg("sst2", pre, tmp_path / "micro", shared_data / "glue" / "SST-2", micro_batch_size=4, **common))
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "micro")
    # No dev split: nothing to choose an epoch by, and the record says what was kept (it said "best").
    assert json.loads((tmp_path / "full" / "results.json").read_text())["select"] == "last"
    for k, v in a.model.state_dict().items():
        torch.testing.assert_close(b.model.state_dict()[k], v, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(b.head_state["linear.weight"], a.head_state["linear.weight"], atol=2e-6, rtol=1e-4)


def test_existing_run_needs_overwrite(pretrained, shared_data, tmp_path):
    finetune(_cfg("rte", pretrained, tmp_path / "r", shared_data / "glue" / "RTE", epochs=1))
    with pytest.raises(GPT1Error, match="--overwrite"):
        finetune(_cfg("rte", pretrained, tmp_path / "r", shared_data / "glue" / "RTE", epochs=1))
    finetune(_cfg("rte", pretrained, tmp_path / "r", shared_data / "glue" / "RTE", epochs=1, overwrite=True))
    assert len(_records(tmp_path / "r", "eval")) == 1  # metrics.jsonl restarted


def test_a_finished_run_reports_its_updates_and_leaves_the_callers_kernels_mode(
    pretrained, shared_data, tmp_path, monkeypatch
):
    """FinetuneResult.step and .total were 0 after a run that finished normally (as a resumed finished run and a
    stopped one said them); and the run left the process in its own kernels mode for good."""
    from gptcli.model import kernels

    monkeypatch.setenv(kernels.ENV, "reference")
    seen: list[str] = []

    class Watch(RecordingProgress):
        def stage(self, name, total=None, *, unit="", done=0):
            seen.append(kernels.mode())

    cfg = _cfg(
        "rte", pretrained, tmp_path / "r", shared_data / "glue" / "RTE", epochs=2, max_train_examples=16, kernels="auto"
    )
    res = finetune(cfg, Watch())
    assert (res.step, res.total) == (4, 4) == (res.results["steps"], res.results["steps"])  # 16 / 8 × 2 epochs
    assert set(seen) == {"auto"} and kernels.mode() == "reference"
    again = finetune(dataclasses.replace(cfg, resume=True))
    assert (again.step, again.total) == (4, 4) and kernels.mode() == "reference"


def test_bad_rows_stop_the_run_or_are_skipped(pretrained, shared_data, tmp_path):
    from gptcli.errors import DataError

    data = tmp_path / "RTE"
    data.mkdir()
    lines = (shared_data / "glue" / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines()[:30]
    lines[5] = "\t".join(lines[5].split("\t")[:3] + ["maybe"])  # an unknown label on file line 6
    (data / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (data / "dev.tsv").symlink_to(shared_data / "glue" / "RTE" / "dev.tsv")
    with pytest.raises(DataError, match=r"train\.tsv:6: .*; fix or remove the line, or pass --skip-bad-rows"):
        finetune(_cfg("rte", pretrained, tmp_path / "a", data, epochs=1))
    assert not (tmp_path / "a" / "checkpoints").exists()  # no half-written output
    res = finetune(_cfg("rte", pretrained, tmp_path / "b", data, epochs=1, skip_bad_rows=True))
    assert len(res.results["skipped_rows"]) == 1 and "train.tsv:6" in res.results["skipped_rows"][0]


def test_snli_fixture_leaves_out_no_consensus_rows(pretrained, tmp_path):
    res = finetune(
        _cfg(
            "snli",
            pretrained,
            tmp_path / "snli",
            FIXTURES / "snli_1.0",
            max_train_examples=None,
            max_eval_examples=None,
            batch_size=4,
            epochs=1,
        )
    )
    assert res.results["excluded_rows"] > 0 and res.results["n_train"] > 0


def test_finetune_reports_through_the_progress_protocol(pretrained, shared_data, tmp_path):
    """One stage sized in updates, one advance per update with epoch/loss/lr, a dev-score note per epoch, one end."""
    rec = RecordingProgress()
    res = finetune(_cfg("rte", pretrained, tmp_path / "run", shared_data / "glue" / "RTE"), progress=rec)
    stages = rec.of("stage")
    assert stages == [{"name": "finetune rte", "total": 6, "unit": "updates", "done": 0}]
    assert [k for k, _ in rec.events].count("end") == 1 and rec.events[-1][0] == "end"
    advances = rec.of("advance")
    assert len(advances) == 6 and all(a["n"] == 1 for a in advances)
    assert [a["epoch"] for a in advances] == ["1/2"] * 3 + ["2/2"] * 3
    train = _records(tmp_path / "run", "train")
    assert [a["lr"] for a in advances] == [r["lr"] for r in train]  # log_every=1: one record per update
    assert all(isinstance(a["loss"], float) for a in advances)
    notes = [n["message"] for n in rec.of("note")]
    acc = [h["accuracy"] for h in res.history]
    assert notes[0].startswith("rte: 24 training examples, 16 dev examples; 6 updates")
    level = res.results["baseline"]["majority"]["accuracy"]  # the trivial level beside each (eval/baselines.py)
    assert [n.rsplit(" (", 1)[0] for n in notes[1:]] == [
        f"epoch 1 (update 3): dev accuracy {acc[0]:.2f}",
        f"epoch 2 (update 6): dev accuracy {acc[1]:.2f}",
    ]
    assert all(n.endswith(f"majority {level:.2f})") for n in notes[1:])


def test_finetune_ends_its_stage_when_training_fails(pretrained, shared_data, tmp_path, monkeypatch):
    import gptcli.train.finetune_job as ft_job

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(ft_job, "score_predictions", boom)
    rec = RecordingProgress()
    with pytest.raises(RuntimeError, match="boom"):
        finetune(_cfg("rte", pretrained, tmp_path / "run", shared_data / "glue" / "RTE"), progress=rec)
    assert len(rec.of("stage")) == len(rec.of("end")) == 1


def test_evaluate_task_reports_one_stage_in_examples(pretrained, shared_data, tmp_path):
    finetune(_cfg("rte", pretrained, tmp_path / "run", shared_data / "glue" / "RTE", epochs=1))
    rec = RecordingProgress()
    evaluate_task(
        "rte",
        tmp_path / "run",
        "dev",
        data_dir=shared_data / "glue" / "RTE",
        out=tmp_path / "ev",
        device="cpu",
        max_examples=10,
        batch_size=4,
        progress=rec,
    )
    assert rec.of("stage") == [{"name": "evaluate run on rte (dev)", "total": 10, "unit": "examples", "done": 0}]
    assert [a["n"] for a in rec.of("advance")] == [4, 4, 2] and len(rec.of("end")) == 1


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"log_every": 0}, "--log-every 0 is impossible (it must be at least 1)"),  # was a ZeroDivisionError traceback
        ({"save_every": -1}, "--save-every -1 is impossible (it must be 0 or more)"),
        ({"keep_last": -2}, "--keep-last -2 is impossible (it must be 0 or more)"),
    ],
)
def test_impossible_cadences_are_one_line_errors(setting, message, pretrained, tmp_path):
    with pytest.raises(GPT1Error, match=re.escape(message)):
        finetune(FinetuneConfig(task="rte", init=str(pretrained), out=str(tmp_path / "run"), **setting))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task,folder", [("rte", "glue/RTE"), ("storycloze", "storycloze")])
def test_with_dropout_0_the_layouts_train_alike_update_for_update(task, folder, pretrained, shared_data, tmp_path):
    """``dropout = 0`` (``--dropout 0``): the body's dropouts are off, so the packed and padded layouts compute the
    same losses and dev score (with dropout on they draw masks over different positions and part after the first:
    the end-to-end check of issue #29 needs this switch). The classifier's dropout is ``clf_pdrop``'s."""
    runs = {}
    for layout in ("packed", "padded"):
        run = tmp_path / layout
        res = finetune(_cfg(task, pretrained, run, shared_data / folder, dropout=0.0, clf_pdrop=0.0, layout=layout))
        runs[layout] = (
            [(r["loss"], r["lm_loss"], r["clf_loss"]) for r in _records(run, "train")],
            json.loads((run / "results.json").read_text())["scores"],
            res,
        )
        ck = load_checkpoint(run)
        assert (ck.config.embd_pdrop, ck.config.attn_pdrop, ck.config.resid_pdrop) == (0.0, 0.0, 0.0)
    (packed, packed_scores, _), (padded, padded_scores, _) = runs["packed"], runs["padded"]
    assert len(packed) == len(padded) == 6
    for a, b in zip(packed, padded):
        assert a == pytest.approx(b, rel=2e-5, abs=1e-6)
    assert packed_scores == pytest.approx(padded_scores, abs=1e-9)
    # With the body's dropout on (the checkpoint's 0.1), the same two runs part.
    lossy = [
        finetune(_cfg(task, pretrained, tmp_path / f"on-{layout}", shared_data / folder, clf_pdrop=0.0, layout=layout))
        for layout in ("packed", "padded")
    ]
    first = [_records(tmp_path / f"on-{layout}", "train")[0]["loss"] for layout in ("packed", "padded")]
    assert first[0] != pytest.approx(first[1], rel=2e-5) and lossy[0].checkpoint != lossy[1].checkpoint


def test_dropout_overrides_the_bodys_dropouts_without_moving_the_random_stream(pretrained):
    cfg = _cfg("rte", pretrained, Path("unused"), Path("unused"))
    torch.manual_seed(5)
    gpt, _, _ = build_body(cfg.init, dropout=cfg.dropout)
    after_default = torch.rand(3)
    torch.manual_seed(5)
    dropped, _, _ = build_body(cfg.init, dropout=0.25)
    assert torch.equal(torch.rand(3), after_default)  # the head's init, the masks: drawn as without the override
    assert (dropped.config.embd_pdrop, dropped.config.attn_pdrop, dropped.config.resid_pdrop) == (0.25,) * 3
    assert {m.p for m in dropped.modules() if isinstance(m, torch.nn.Dropout)} == {0.25}
    assert all(torch.equal(a, b) for a, b in zip(gpt.state_dict().values(), dropped.state_dict().values()))
    assert gpt.config.resid_pdrop != 0.25


def test_the_dev_subset_is_evals_whatever_the_training_seed(shared_data):
    """``finetune --max-eval-examples N`` scores the dev examples ``eval --max-examples N`` scores, for any
    ``--seed`` (it drew them with seed + 1: the first GPU run's finetune and eval scored different CoLA subsets)."""
    from gptcli.tasks.base import EVAL_SUBSET_SEED, ReadOptions, subsample
    from gptcli.tasks.registry import get_task
    from gptcli.train.finetune_setup import read_task_data

    task = get_task("rte")
    data_dir = str(shared_data / "glue" / "RTE")
    every_dev = task.read("dev", data_dir, ReadOptions())
    evals = subsample(every_dev, 16, EVAL_SUBSET_SEED)
    for seed in (0, 7):
        dev = read_task_data(task, data_dir, ("train", "dev"), max_train=8, max_eval=16, seed=seed).dev
        assert [e.uid for e in dev] == [e.uid for e in evals] and len(dev) == 16


def test_n_ctx_above_the_models_context_is_refused(pretrained, tmp_path):
    """It was shortened to the model's 64 silently while the run's config.toml recorded the value asked for."""
    cfg = _cfg("qqp", pretrained, tmp_path / "run", FIXTURES / "QQP", n_ctx=65)
    with pytest.raises(
        GPT1Error,
        match=re.escape(
            "--n-ctx 65 exceeds the model's context of 64 tokens (pass --n-ctx "
            "64 or less, or leave it unset for the model's context)"
        ),
    ):
        finetune(cfg)
    assert not (tmp_path / "run").exists()


def test_sequence_limit_defaults_to_the_models_context_and_refuses_a_longer_one():
    from gptcli.train.finetune_setup import sequence_limit

    assert sequence_limit(None, 64) == 64 and sequence_limit(32, 64) == 32
    with pytest.raises(GPT1Error, match="^--n-ctx 65 exceeds the model's context of 64 tokens"):
        sequence_limit(65, 64)
