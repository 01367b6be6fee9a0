"""The zero-shot heuristics: exact predictions against a stub LM with known log-probabilities, then end to end on
the real files with a tiny random checkpoint (CLI, results.json, predictions, the curve over checkpoints)."""

from __future__ import annotations

import json
import math
import shutil
import sys

import pytest
import torch
from error_lines import Outcome, assert_one_line_error, gpt1
from zs_toy_tokenizer import BagLM, ToyTokenizer

from gptcli.errors import GPT1Error
from gptcli.eval.zeroshot import ZeroShotConfig, cola, fit_threshold, multiple_choice, run_task, sst2, winograd
from gptcli.progress import RecordingProgress
from gptcli.tasks.base import Example
from gptcli.tasks.winograd import read_dprd

pytestmark = pytest.mark.usefixtures("one_thread")

# A terminal wide enough that the lines the tests read do not wrap.
WIDE = {"COLUMNS": "240"}
WORDS = "very positive negative good bad movie film the a was it . he she they ball red blue story end".split()


def _setup(words=WORDS, n_ctx=64):
    tok = ToyTokenizer(words)
    w = torch.zeros(tok.vocab_size, tok.vocab_size)
    return tok, w, n_ctx


def _id(tok, word):
    (i,) = tok.encode(word)
    return i


# --- heuristics against the stub ------------------------------------------------------------------------------------


def test_sst2_exact():
    tok, w, n_ctx = _setup()
    w[_id(tok, "good"), _id(tok, "positive")] = 5.0
    w[_id(tok, "bad"), _id(tok, "negative")] = 5.0
    model = BagLM(w, n_ctx)
    exs = [
        Example(("a good movie",), 1, uid="0"),
        Example(("a bad film",), 0, uid="1"),
        Example(("a good film",), 0, uid="2"),
        Example(("good and bad",), 1, uid="3"),
    ]
    seen = RecordingProgress()
    r = sst2(model, tok, exs, precision="fp32", progress=seen)
    assert [p["prediction"] for p in r.predictions] == [1, 0, 1, 0]  # the last is a tie: negative
    # One stage for the scoring pass (8 requests: 2 words × 4 examples), advanced to its total, then ended.
    assert seen.events[0] == ("stage", {"name": "scoring sst2", "total": 8, "unit": "", "done": 0})
    assert sum(a["n"] for a in seen.of("advance")) == 8 and seen.events[-1][0] == "end"
    assert r.score == pytest.approx(50.0) and r.n == 4 and r.notes == []
    V = tok.vocab_size
    # log p(positive | "a good movie very") = 5 - log(e^5 + V - 1), exactly.
    assert r.predictions[0]["logprob_positive"] == pytest.approx(5 - math.log(math.exp(5) + V - 1), abs=1e-5)
    assert r.predictions[0]["logprob_negative"] == pytest.approx(-math.log(math.exp(5) + V - 1), abs=1e-5)
    # One row per example: both words read from the same forward pass.
    assert model.forward_rows == 4


def test_sst2_multi_token_words_scored_as_sequences():
    tok, w, n_ctx = _setup([x for x in WORDS if x not in ("positive", "negative")])
    g = torch.Generator().manual_seed(0)
    model = BagLM(torch.randn(w.shape, generator=g), n_ctx)
    exs = [
        Example((t,), i % 2, uid=str(i)) for i, t in enumerate(["a good movie", "a bad film", "the end", "red ball"])
    ]
    r = sst2(model, tok, exs, precision="fp32")
    assert r.notes == ["multi-token words scored as full token sequences: 'negative' = 8 tokens, 'positive' = 8 tokens"]
    for ex, p in zip(exs, r.predictions):
        ctx = tok.encode(ex.texts[0]) + tok.encode("very")
        pos, _ = model.reference(ctx, tok.encode("positive"))
        neg, _ = model.reference(ctx, tok.encode("negative"))
        assert p["logprob_positive"] == pytest.approx(pos, abs=1e-4) and p["logprob_negative"] == pytest.approx(
            neg, abs=1e-4
        )
        assert p["prediction"] == int(pos > neg)


def test_cola_threshold_fitted_and_given():
    tok, w, n_ctx = _setup()
    # "the ball was red" is likely, "red the was ball" is not: reward the right successors.
    for a, b in [("the", "ball"), ("ball", "was"), ("was", "red"), ("was", "blue")]:
        w[_id(tok, a), _id(tok, b)] = 4.0
    model = BagLM(w, n_ctx)
    good = ["the ball was red", "the ball was blue", "the ball"]
    bad = ["red the was ball", "blue was the", "ball the"]
    train = [Example((s,), 1) for s in good] + [Example((s,), 0) for s in bad]
    dev = [Example(("the ball was blue",), 1), Example(("was the red",), 0), Example(("ball the red",), 1)]
    r = cola(model, tok, dev, train_examples=train, precision="fp32")
    means = [p["mean_logprob"] for p in r.predictions]
    for ex, m in zip(dev, means):
        s, n = model.reference([], tok.encode(ex.texts[0]))
        assert m == pytest.approx(s / n, abs=1e-5)
    # The fitted threshold separates the train sentences perfectly (MCC 100 on train).
    assert "train MCC 100.0" in r.notes[0]
    assert [p["prediction"] for p in r.predictions] == [int(m > r.threshold) for m in means] == [1, 0, 0]
    from gptcli.eval.metrics import mcc

    assert r.score == pytest.approx(100 * mcc([1, 0, 0], [1, 0, 1]))
    given = cola(model, tok, dev, threshold=-100.0, precision="fp32")
    assert [p["prediction"] for p in given.predictions] == [1, 1, 1] and given.threshold == -100.0
    with pytest.raises(GPT1Error, match="threshold"):
        cola(model, tok, dev, precision="fp32")


def test_fit_threshold_maximises_mcc():
    t, m = fit_threshold([-3.0, -1.0, -2.0, -0.5], [0, 1, 0, 1])
    assert -2.0 < t < -1.0 and m == pytest.approx(100.0)
    t, m = fit_threshold([-1.0, -1.0], [1, 0])  # cannot separate: MCC 0
    assert m == pytest.approx(0.0)


def test_multiple_choice_exact():
    tok, w, n_ctx = _setup()
    w[_id(tok, "story"), _id(tok, "end")] = 3.0
    w[_id(tok, "ball"), _id(tok, "red")] = 6.0
    g = torch.Generator().manual_seed(1)
    w += 0.1 * torch.randn(w.shape, generator=g)
    model = BagLM(w, n_ctx)
    contexts = [("a story about a ball", "which ?"), "the story"]
    choices = [("blue film", "red film", "the end", "he"), ("the end", "a good movie")]
    r = multiple_choice(model, tok, "race", contexts, choices, [1, 0], ["q0", "q1"], precision="fp32")
    for c, chs, p in zip(contexts, choices, r.predictions):
        ctx = [t for part in ([c] if isinstance(c, str) else c) for t in tok.encode(part)]
        means = []
        for ch in chs:
            s, n = model.reference(ctx, tok.encode(ch))
            means.append(s / n)
        assert p["mean_logprobs"] == pytest.approx(means, abs=1e-5)
        assert p["prediction"] == max(range(len(means)), key=lambda j: means[j])
    assert r.n == 2 and r.metric == "accuracy"


def test_winograd_exact(tmp_path):
    tok, w, n_ctx = _setup()
    p = tmp_path / "train.c.txt"
    p.write_text(
        "The ball hit the film because it was red.\nit\nThe ball,the film\nthe ball\n\n"
        "He saw the film because she was good.\nshe\nHe,the film\nthe film\n",
        encoding="utf-8",
    )
    schemas = read_dprd(p)
    w[_id(tok, "ball"), _id(tok, "red")] = 4.0
    w[_id(tok, "he"), _id(tok, "good")] = 4.0
    w[_id(tok, "film"), _id(tok, "was")] = -2.0
    model = BagLM(w, n_ctx)
    r = winograd(model, tok, "dprd", schemas, precision="fp32")
    for s, pr in zip(schemas, r.predictions):
        means = []
        for j in range(2):
            ctx, rest = s.substitute(j)
            total, n = model.reference(tok.encode(ctx), tok.encode(rest))
            means.append(total / n)
        assert pr["mean_logprobs"] == pytest.approx(means, abs=1e-5)
        assert pr["prediction"] == int(means[1] > means[0])
    preds = [x["prediction"] for x in r.predictions]
    assert r.score == pytest.approx(100 * sum(p == s.label for p, s in zip(preds, schemas)) / 2)
    # As every task's predictions: uid = the index in the file (it was the path:line, now "source").
    assert [(x["uid"], x["source"]) for x in r.predictions] == [("0", f"{p}:1"), ("1", f"{p}:6")]


def test_race_through_the_registry(tmp_path):
    tok, w, n_ctx = _setup()
    model = BagLM(w + 0.01 * torch.randn(w.shape, generator=torch.Generator().manual_seed(2)), n_ctx)
    for level, n in (("middle", 1), ("high", 2)):
        d = tmp_path / "RACE" / "dev" / level
        d.mkdir(parents=True)
        (d / f"{n}.txt").write_text(
            json.dumps(
                {
                    "id": f"{level}{n}.txt",
                    "article": "The ball was red. " * 20,
                    "questions": ["What was red?", "What color?"],
                    "options": [["the ball", "the film", "he", "a story"], ["red", "blue", "good", "bad"]],
                    "answers": ["A", "A"],
                }
            ),
            encoding="utf-8",
        )
    cfg = ZeroShotConfig(task="race", data_dir=str(tmp_path / "RACE"), precision="fp32")
    r = run_task("race", model, tok, cfg)
    assert r.n == 4 and r.split == "dev" and len(r.predictions) == 4
    assert any("left-truncated" in n for n in r.notes)  # 20 sentences of bytes > 64 tokens
    assert run_task("race-m", model, tok, cfg).n == 2


# --- end to end on the real files ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A pretraining run with three tiny random checkpoints and the toy tokenizer."""
    from gptcli.checkpoint import save_checkpoint
    from gptcli.model.gpt import GPT, ModelConfig

    root = tmp_path_factory.mktemp("zs") / "run"
    tok = ToyTokenizer(WORDS + "the of and to in is that for on with as his her".split())
    for step in (0, 100, 200):
        torch.manual_seed(step)
        m = GPT(ModelConfig(vocab_size=tok.vocab_size, n_ctx=96, n_embd=32, n_layer=2, n_head=2, n_inner=64))
        save_checkpoint(root / "checkpoints" / f"step-{step:07d}", m, tok, meta={"step": step})
    return root


@pytest.mark.parametrize(
    "task, folder, extra, n",
    [
        ("sst2", "glue/SST-2", ["--limit", "24"], 24),
        ("cola", "glue/CoLA", ["--limit", "40"], 40),
        ("dprd", "dprd", ["--split", "train", "--limit", "30"], 30),
        ("wsc", "wsc", [], 273),  # every schema of WSC273
        ("storycloze", "storycloze", ["--limit", "20"], 20),
    ],
)
def test_cli_on_real_files(task, folder, extra, n, tiny_run, shared_data, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = gpt1(
        [
            "zeroshot",
            "--task",
            task,
            "--checkpoint",
            str(tiny_run),
            "--data-dir",
            str(shared_data / folder),
            "--out",
            str(out),
            "--precision",
            "fp32",
            *extra,
        ],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert res["step"] == 200  # a run directory means its newest checkpoint
    t = res["tasks"][task]
    assert t["n"] == n and t["metric"] == ("mcc" if task == "cola" else "accuracy")
    assert (-100.0 <= t["score"] <= 100.0) if task == "cola" else (0.0 <= t["score"] <= 100.0)
    preds = [json.loads(line) for line in (out / f"predictions-{task}.jsonl").read_text().splitlines()]
    assert len(preds) == n and all(p["prediction"] in (0, 1) for p in preds)
    labels = [p["label"] for p in preds]
    acc = 100 * sum(p["prediction"] == y for p, y in zip(preds, labels)) / n
    if task != "cola":
        assert t["score"] == pytest.approx(acc)
    assert task in stdout and f"{t['score']:.1f}" in stdout


def test_curve_over_a_run(tiny_run, shared_data, tmp_path, capsys):
    out = tmp_path / "curve"
    code, stdout, err = gpt1(
        [
            "zeroshot",
            "--task",
            "all",
            "--checkpoint",
            str(tiny_run),
            "--data-dir",
            str(shared_data),
            "--split",
            "dprd=train",
            "--limit",
            "12",
            "--out",
            str(out),
            "--precision",
            "fp32",
        ],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    curve = json.loads((out / "curve.json").read_text())
    assert [p["step"] for p in curve["points"]] == [0, 100, 200]
    assert curve["tasks"] == ["sst2", "cola", "dprd", "wsc", "storycloze"]
    assert "race" in curve["skipped"]  # no RACE files here: skipped, said so, the rest still scored
    assert curve["normalization"]["sst2"] == {
        "random": 50.0,
        "sota": 93.2,
        "sota_source": "reference §6 previous best (paper Table 4)",
    }
    for p in curve["points"]:
        assert p["normalized"]["sst2"] == pytest.approx((p["scores"]["sst2"] - 50.0) / 43.2)
        assert all(v == 12 for v in p["n"].values())
    table_rows = [line for line in stdout.splitlines() if "step-0000" in line]
    assert len(table_rows) == 3
    assert sorted(x.name for x in out.iterdir() if x.is_dir()) == ["step-0000000", "step-0000100", "step-0000200"]


def test_curve_needs_matplotlib(tiny_run, tmp_path, monkeypatch):
    from gptcli.eval.curve import run_curve

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "c"
    with pytest.raises(GPT1Error, match="needs matplotlib: pip install matplotlib"):
        run_curve(ZeroShotConfig(task="wsc", out=str(out)), [tiny_run])
    assert not out.exists()  # checked before any scoring or writing


def test_user_errors(tiny_run, tmp_path, capsys):
    code, _, err = gpt1(
        ["zeroshot", "--task", "sst2", "--checkpoint", str(tiny_run), "--data-dir", str(tmp_path / "nope")],
        capsys,
        env=WIDE,
    )
    assert code == 1 and "data directory for task 'sst2' not found" in err
    code, _, err = gpt1(["zeroshot", "--task", "bogus", "--checkpoint", str(tiny_run)], capsys, env=WIDE)
    assert code == 1 and "unknown zero-shot task 'bogus'" in err
    code, _, err = gpt1(
        ["zeroshot", "--task", "dprd", "--checkpoint", str(tiny_run), "--data-dir", str(tmp_path)],
        capsys,
        env=WIDE,
    )
    assert code == 1 and "test.c.txt" in err


def test_sst2_with_the_original_bpe_reads_both_words_from_one_pass(shared_data):
    from gptcli.model.gpt import GPT, ModelConfig
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    tok = OpenAIBPETokenizer.from_dir(shared_data / "openai-gpt-bpe")
    assert [tok.encode(w) for w in ("very", "positive", "negative")] == [[963], [6353], [9503]]
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, n_ctx=64, n_embd=8, n_layer=1, n_head=1, n_inner=16)).eval()
    rows = []
    model.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    exs = [
        Example(("a gorgeous, witty, seductive movie.",), 1),
        Example(("the story is flat.",), 0),
        Example(("fine",), 1),
    ]
    r = sst2(model, tok, exs, precision="fp32")
    assert r.notes == [] and sum(rows) == 3  # one row per example, no multi-token note


def test_config_file_and_overrides(tiny_run, shared_data, tmp_path, capsys):
    cfg = tmp_path / "zs.toml"
    cfg.write_text('task = "dprd"\nsplit = "train"\nlimit = 7\nprecision = "fp32"\n', encoding="utf-8")
    out = tmp_path / "o"
    code, _, err = gpt1(
        [
            "zeroshot",
            "--config",
            str(cfg),
            "--checkpoint",
            str(tiny_run),
            "--data-dir",
            str(shared_data / "dprd"),
            "--limit",
            "9",
            "--out",
            str(out),
        ],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert (
        res["tasks"]["dprd"]["n"] == 9
        and res["config"]["precision"] == "fp32"
        and res["tasks"]["dprd"]["split"] == "train"
    )


def test_heuristics_match_hugging_face_directly(tmp_path):
    """SST-2 and Winograd log-probabilities from our pipeline vs. OpenAIGPTLMHeadModel with the same weights."""
    transformers = pytest.importorskip("transformers")
    from gptcli.interop.hf import config_to_hf, state_dict_to_hf
    from gptcli.model.gpt import GPT, ModelConfig

    tok = ToyTokenizer(WORDS)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_ctx=48, n_embd=32, n_layer=2, n_head=2, n_inner=128)
    ours = GPT(cfg).eval()
    hf = transformers.OpenAIGPTLMHeadModel(
        transformers.OpenAIGPTConfig(
            **{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
        )
    ).eval()
    hf.load_state_dict(state_dict_to_hf(ours.state_dict(), cfg.n_layer))

    def hf_logprobs(ids):
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)

    exs = [Example((t,), 1) for t in ("a good movie", "it was bad", "the film was a good story, really")]
    r = sst2(ours, tok, exs, precision="fp32")
    for ex, p in zip(exs, r.predictions):
        lp = hf_logprobs(tok.encode(ex.texts[0]) + tok.encode("very"))[-1]
        assert p["logprob_positive"] == pytest.approx(float(lp[_id(tok, "positive")]), abs=1e-4)
        assert p["logprob_negative"] == pytest.approx(float(lp[_id(tok, "negative")]), abs=1e-4)

    p = tmp_path / "d.txt"
    p.write_text("The ball hit the film because it was red.\nit\nThe ball,the film\nthe ball\n", encoding="utf-8")
    (s,) = read_dprd(p)
    r = winograd(ours, tok, "dprd", [s], precision="fp32")
    for j in range(2):
        ctx, rest = (tok.encode(x) for x in s.substitute(j))
        ctx = ctx[-(cfg.n_ctx + 1 - len(rest)) :]  # the documented left truncation (these byte sequences are long)
        lp = hf_logprobs(ctx + rest[:-1])
        want = sum(float(lp[len(ctx) - 1 + k, t]) for k, t in enumerate(rest)) / len(rest)
        assert r.predictions[0]["mean_logprobs"][j] == pytest.approx(want, abs=1e-4)


def test_several_tasks_skip_missing_data_but_not_bad_files(tmp_path):
    from gptcli.errors import DataError
    from gptcli.eval.zeroshot import evaluate

    tok, w, n_ctx = _setup()
    model = BagLM(w, n_ctx)
    (tmp_path / "dprd").mkdir()
    (tmp_path / "dprd" / "train.c.txt").write_text(
        "The ball was red.\nit\nThe ball,the film\nthe ball\n", encoding="utf-8"
    )
    (tmp_path / "wsc").mkdir()
    (tmp_path / "wsc" / "WSCollection.xml").write_text(
        "<collection><schema><text><txt1>The ball hit the film because</txt1><pron>it</pron>"
        "<txt2>was red.</txt2></text>"
        "<answers><answer>the ball</answer><answer>the film</answer></answers><correctAnswer>A</correctAnswer>"
        "</schema></collection>",
        encoding="latin-1",
    )
    cfg = ZeroShotConfig(task="sst2,wsc", data_dir=str(tmp_path), precision="fp32")
    results, skipped = evaluate(model, tok, cfg)
    assert list(results) == ["wsc"] and results["wsc"].n == 1 and "sst2" in skipped
    with pytest.raises(DataError, match=r"train\.c\.txt:2: pronoun 'it' does not occur"):
        evaluate(
            model, tok, ZeroShotConfig(task="dprd,wsc", split="train", splits={"wsc": "test"}, data_dir=str(tmp_path))
        )


def test_dprd_falls_back_to_the_split_that_exists(tiny_run, shared_data, tmp_path, capsys):
    """Only DPRD's train file ships here: without --split it is scored (zero-shot trains on nothing) and said so."""
    out = tmp_path / "out"
    code, _, err = gpt1(
        [
            "zeroshot",
            "--task",
            "dprd",
            "--checkpoint",
            str(tiny_run),
            "--data-dir",
            str(shared_data / "dprd"),
            "--out",
            str(out),
            "--limit",
            "6",
            "--precision",
            "fp32",
        ],
        capsys,
        env=WIDE,
    )
    assert code == 0, err
    t = json.loads((out / "results.json").read_text())["tasks"]["dprd"]
    assert t["split"] == "train" and t["n"] == 6
    assert any("test.c.txt not found" in n for n in t["notes"])


# --- progress: the one protocol ------------------------------------------------------------------------------------


def _stages(rec: RecordingProgress) -> list[tuple[int, str, object]]:
    """(depth, name, total) of every stage, checking that each one is ended exactly once and that every advance
    lands in an open stage."""
    depth, out = 0, []
    for kind, payload in rec.events:
        if kind == "stage":
            out.append((depth, payload["name"], payload["total"]))
            depth += 1
        elif kind == "end":
            depth -= 1
            assert depth >= 0, "end without a stage"
        elif kind == "advance":
            assert depth > 0, "advance outside any stage"
    assert depth == 0, "a stage was never ended"
    return out


def test_evaluate_reports_stages_scoring_passes_and_skips(tmp_path):
    from gptcli.eval.zeroshot import evaluate

    tok, w, n_ctx = _setup()
    model = BagLM(w, n_ctx)
    (tmp_path / "wsc").mkdir()
    (tmp_path / "wsc" / "WSCollection.xml").write_text(
        "<collection><schema><text><txt1>The ball hit the film because</txt1><pron>it</pron>"
        "<txt2>was red.</txt2></text>"
        "<answers><answer>the ball</answer><answer>the film</answer></answers><correctAnswer>A</correctAnswer>"
        "</schema></collection>",
        encoding="latin-1",
    )
    rec = RecordingProgress()
    results, skipped = evaluate(
        model, tok, ZeroShotConfig(task="sst2,wsc", data_dir=str(tmp_path), precision="fp32"), rec
    )
    # A task is read before its stage begins: the skipped one is a warning note, with no stage of its own.
    assert _stages(rec) == [(0, "zero-shot wsc", None), (1, "scoring wsc", 2)]
    assert rec.events[0] == ("note", {"message": f"skipped sst2: {skipped['sst2']}", "level": "warn"})
    assert sum(a["n"] for a in rec.of("advance")) == 2  # both candidates of the one schema
    ends = [e["summary"] for e in rec.of("end")]
    assert (
        ends[-1] == f"wsc (test): accuracy {results['wsc'].score:.1f} on 1 examples, "
        f"{results['wsc'].examples_per_s:.1f} examples/s"
    )


def test_curve_reports_one_stage_per_checkpoint_and_skips_once(tiny_run, shared_data):
    from gptcli.eval.curve import run_curve

    rec = RecordingProgress()
    cfg = ZeroShotConfig(task="wsc,race", data_dir=str(shared_data), limit=3, precision="fp32")
    curve = run_curve(cfg, [tiny_run], progress=rec)
    stages = _stages(rec)
    assert stages[0] == (0, "zero-shot curve", 3) and rec.events[0][1]["unit"] == "checkpoints"
    assert [s[1] for s in stages if s[0] == 1] == [
        "checkpoint step-0000000",
        "checkpoint step-0000100",
        "checkpoint step-0000200",
    ]
    # RACE has no files here: skipped (one warning) at the first checkpoint, not retried at the others.
    assert [n["message"].split(":")[0] for n in rec.of("note")] == ["skipped race"]
    assert [s[1] for s in stages if s[0] == 2] == ["zero-shot wsc", "zero-shot wsc", "zero-shot wsc"]
    assert list(curve.skipped) == ["race"] and curve.tasks == ["wsc"]
    # The curve stage advances once per checkpoint; each checkpoint's stage ends with its scores.
    depth, top = 0, []
    for kind, payload in rec.events:
        depth += {"stage": 1, "end": -1}.get(kind, 0)
        if kind == "advance" and depth == 1:
            top.append(payload["n"])
    assert top == [1, 1, 1]
    summaries = [e["summary"] for e in rec.of("end") if e["summary"].startswith("step ")]
    assert summaries == [f"step {p.step}: wsc {p.scores['wsc']:.1f}" for p in curve.points]


def test_a_task_that_cannot_be_read_is_the_only_line(tiny_run, shared_data, tmp_path, capsys):
    """The task's files are read before its progress stage is drawn: CoLA pointed at SST-2's folder is one error
    line, not a blank line and a rule above it; so is CoLA without the train split its threshold is fitted on."""
    from gptcli.eval.zeroshot import evaluate

    (tmp_path / "cola").mkdir()
    shutil.copy(shared_data / "glue" / "CoLA" / "dev.tsv", tmp_path / "cola" / "dev.tsv")
    for data in (shared_data / "glue" / "SST-2", tmp_path / "missing", tmp_path / "cola"):
        args = ["zeroshot", "--task", "cola", "--data-dir", str(data), "--checkpoint", str(tiny_run)]
        assert_one_line_error(Outcome(*gpt1(args, capsys, env=WIDE)), alone=True)
    rec = RecordingProgress()
    with pytest.raises(GPT1Error, match="threshold is fitted on the train split"):
        evaluate(None, None, ZeroShotConfig(task="cola", data_dir=str(tmp_path / "cola")), rec)
    assert rec.events == []


def test_out_of_memory_in_scoring_is_one_line(tiny_run, shared_data, tmp_path, capsys, monkeypatch):
    """Outside a training run's loop (which names its own flags) a failed allocation is one line too, naming the
    batch flags, where it was PyTorch's traceback; --debug still shows the traceback."""
    import gptcli.eval.zeroshot as zs

    def hungry(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 30.00 GiB.\nmore detail")

    monkeypatch.setattr(zs, "zeroshot", hungry)
    args = [
        "zeroshot",
        "--task",
        "sst2",
        "--checkpoint",
        str(tiny_run),
        "--data-dir",
        str(shared_data / "glue/SST-2"),
        "--out",
        str(tmp_path / "out"),
        "--limit",
        "4",
    ]
    code, _, err = gpt1(args, capsys, env=WIDE)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        "error: out of memory: CUDA out of memory. Tried to allocate 30.00 GiB. (score in smaller "
        "batches: --batch-size of eval and zeroshot;"
    ), err
    with pytest.raises(torch.OutOfMemoryError):
        from gptcli.cli import main

        main(["--debug", *args])


def test_zeroshot_and_the_curve_give_the_callers_kernels_mode_back(tiny_run, shared_data, monkeypatch):
    """Each computes in its config's mode (here through the curve's second positional-or-keyword argument after
    the checkpoints, progress); the caller's mode, here GPT1_KERNELS's, is back afterwards (both used to leave
    theirs set for the rest of the process)."""
    from gptcli.eval.curve import run_curve
    from gptcli.eval.zeroshot import zeroshot
    from gptcli.model import kernels

    monkeypatch.setenv(kernels.ENV, "reference")
    seen: list[str] = []

    class Watch(RecordingProgress):
        def stage(self, name, total=None, *, unit="", done=0):
            seen.append(kernels.mode())

    cfg = ZeroShotConfig(
        task="wsc",
        checkpoint=str(tiny_run),
        data_dir=str(shared_data / "wsc"),
        limit=2,
        precision="fp32",
        kernels="auto",
    )
    zeroshot(cfg, Watch())
    assert seen and set(seen) == {"auto"} and kernels.mode() == "reference"
    seen.clear()
    run_curve(
        ZeroShotConfig(task="wsc", data_dir=str(shared_data / "wsc"), limit=2, precision="fp32", kernels="auto"),
        [tiny_run / "checkpoints" / "step-0000000"],
        Watch(),
    )
    assert seen and set(seen) == {"auto"} and kernels.mode() == "reference"
