"""`gpt1 quickstart`: the toy task, the standard-library corpus, and one whole run at test scale through the CLI."""

from __future__ import annotations

import json
import math
import random

import pytest

from gptcli.errors import GPT1Error
from gptcli.pipelines.quickstart import OUTPUTS, QuickstartConfig, summary_rows
from gptcli.tasks import all_tasks, get_task, shuffled

# A model and budget small enough for a whole run in well under a minute on 2 CPU cores.
TINY = {
    "minutes": 1.0,
    "max_modules": 80,
    "vocab_size": 400,
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 48},
    "seq_len": 48,
    "batch_size": 8,
    "pretrain_steps": 12,
    "eval_batches": 4,
    "finetune_epochs": 1,
    "max_train_examples": 96,
    "zeroshot_fit_examples": 64,
    "workers": 1,
    "device": "cpu",
    "precision": "fp32",
}


# --------------------------------------------------------------------------------------------- the toy task


def test_prose_sentences_keep_prose_and_drop_code():
    text = (
        "Return whether the file supports seeking.\n\n"
        "    >>> f.seekable()\n    True\n\n"
        "Example::\n\n    x = compute(1, 2)\n\n"
        "The default is False, meaning it parses the entire file. Short one.\n"
        "See os.path.join() for details on how paths are joined here."
    )
    assert shuffled.prose_sentences(text) == [
        "Return whether the file supports seeking.",
        "The default is False, meaning it parses the entire file.",
    ]


def test_shuffle_words_changes_only_the_order():
    rng = random.Random(0)
    s = "The default is False, meaning it parses the entire file."
    for _ in range(20):
        t = shuffle_words_checked(s, rng)
        assert t.endswith(".") and t[0].isupper() and t != s
        norm = lambda x: sorted(w.lower().rstrip(",.") for w in x.split())  # noqa: E731
        assert norm(t) == norm(s)
    with pytest.raises(ValueError):
        shuffled.shuffle_words("Go go go go go go.", rng)


def shuffle_words_checked(s: str, rng: random.Random) -> str:
    t = shuffled.shuffle_words(s, rng)
    assert "," not in t.split()[-1], "a clause mark must not end up before the final period"
    return t


def test_rows_pair_each_sentence_with_its_shuffle_and_splits_do_not_share_sentences(tmp_path):
    sents = [
        ("m", f"Sentence number {w} says something rather plain here.")
        for w in ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    ]
    sents.append(("m", sents[0][1]))  # a duplicate is dropped
    groups = shuffled.make_rows(sents, seed=1)
    assert len(groups) == 10 and all(sorted(r.label for r in g) == [0, 1] for g in groups)
    assert groups == shuffled.make_rows(sents, seed=1)  # seeded
    splits = shuffled.split_rows(groups)
    assert [len(splits[k]) for k in ("train", "dev", "test")] == [12, 2, 6]
    originals = {k: {r.sentence for r in v if r.label == 1} for k, v in splits.items()}
    assert not (originals["train"] & originals["test"]) and not (originals["train"] & originals["dev"])

    d = shuffled.write_task_files(splits, tmp_path / "task")
    read = {k: shuffled.SHUFFLED.read(k, d) for k in ("train", "dev", "test")}
    assert [(e.texts[0], e.label) for e in read["test"]] == [(r.sentence, r.label) for r in splits["test"]]
    assert all(e.extra["star"] == ("" if e.label else "*") for e in read["train"])  # CoLA's marking


def test_registered_makes_the_task_visible_only_inside_the_block():
    before = [t.name for t in all_tasks()]
    with pytest.raises(GPT1Error):
        get_task(shuffled.NAME)
    with shuffled.registered() as task:
        assert get_task(shuffled.NAME) is task
        with shuffled.registered():  # nested: a no-op
            pass
        assert get_task(shuffled.NAME) is task
    assert [t.name for t in all_tasks()] == before


# --------------------------------------------------------------------------------------------- a whole run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One quickstart through the CLI (`gpt1 quickstart --config tiny.toml --out DIR`); returns (dir, stdout,
    stderr, progress events). The command's RichProgress is wrapped so that every call it receives is also kept
    (RecordingProgress): the rendering and the events of the same run."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    import gptcli.commands.quickstart as command
    from gptcli.cli import main
    from gptcli.config import save_config
    from gptcli.progress import RecordingProgress

    recorder = RecordingProgress()

    class Tee(command.RichProgress):
        def stage(self, name, total=None, *, unit="", done=0):
            recorder.stage(name, total, unit=unit, done=done)
            super().stage(name, total, unit=unit, done=done)

        def advance(self, n=0, **status):
            recorder.advance(n, **status)
            super().advance(n, **status)

        def note(self, message, *, level="info"):
            recorder.note(message, level=level)
            super().note(message, level=level)

        def end(self, summary=""):
            recorder.end(summary)
            super().end(summary)

    root = tmp_path_factory.mktemp("qs")
    cfg_file = root / "tiny.toml"
    save_config(QuickstartConfig(**TINY), cfg_file)
    out = root / "out"
    buf_out, buf_err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(command, "RichProgress", Tee)
        with redirect_stdout(buf_out), redirect_stderr(buf_err), pytest.raises(SystemExit) as exit_info:
            main(["quickstart", "--config", str(cfg_file), "--out", str(out), "--seed", "3"])
    assert exit_info.value.code == 0, buf_err.getvalue()[-3000:]
    return out, buf_out.getvalue(), buf_err.getvalue(), recorder


def test_run_writes_every_stage_and_finite_numbers(run):
    out, stdout, stderr, _ = run
    for rel in (
        "text/stdlib-docstrings.jsonl",
        "task/train.tsv",
        "task/dev.tsv",
        "task/test.tsv",
        "corpus/manifest.json",
        "corpus/tokenizer/tokenizer.json",
        "pretrain/metrics.jsonl",
        "pretrain/checkpoints/step-0000012",
        "finetune/results.json",
        "finetune/checkpoints/final",
        "eval/results.json",
        "eval/predictions.jsonl",
        "zeroshot/results.json",
        "summary.json",
        "config.toml",
    ):
        assert (out / rel).exists(), rel
    summary = json.loads((out / "summary.json").read_text())
    n = summary["numbers"]
    assert n["seed"] == 3 and n["pretrain_steps"] == 12 and n["vocab_size"] == 400
    for key in (
        "val_ppl_before",
        "val_ppl_after",
        "finetuned_accuracy",
        "finetuned_mcc",
        "majority_accuracy",
        "zeroshot_mcc_before",
        "zeroshot_mcc_after",
        "zeroshot_accuracy_after",
    ):
        assert isinstance(n[key], float) and math.isfinite(n[key]), key
    assert n["val_ppl_after"] < n["val_ppl_before"] < 3 * 400  # 12 updates already beat the random model
    assert n["majority_accuracy"] == 50.0  # every sentence is there as written and shuffled
    assert 0.0 <= n["finetuned_accuracy"] <= 100.0 and -100.0 <= n["zeroshot_mcc_after"] <= 100.0
    ev = json.loads((out / "eval" / "results.json").read_text())
    assert ev["task"] == "shuffled" and ev["split"] == "test" and ev["scores"]["accuracy"] == n["finetuned_accuracy"]
    assert set(summary["seconds"]) == {"text", "prepare", "pretrain", "finetune", "eval", "zeroshot"}
    # the task files are held out: no test sentence is a pretraining document's text
    test_sents = [ln.split("\t")[3] for ln in (out / "task" / "test.tsv").read_text().splitlines()]
    docs = [json.loads(line)["text"] for line in (out / "text" / "stdlib-docstrings.jsonl").read_text().splitlines()]
    corpus_text = " ".join(" ".join(d.split()) for d in docs).lower()
    originals = [
        s
        for s, y in zip(test_sents, [ln.split("\t")[1] for ln in (out / "task" / "test.tsv").read_text().splitlines()])
        if y == "1"
    ]
    assert originals and not any(s.lower() in corpus_text for s in originals)
    # the final table and the next steps are printed, on stdout
    for what, _, _ in summary_rows(n):
        assert what.split(",")[0] in " ".join(stdout.split())
    assert "gpt1 pretrain --data corpus --out run --gpus 8" in stdout
    assert "gpt1 finetune --task rte" in stdout and "gpt1 zeroshot --task sst2" in stdout
    assert "4/6" in stderr  # stage headers on stderr
    assert "shuffled" not in {t.name for t in all_tasks()}  # the toy task left the registry again


def test_run_reports_each_stage_through_progress(run):
    """Six numbered stages, each closed by one end with its summary; the library calls report inside them."""
    from gptcli.pipelines.quickstart import STAGES

    out, _, stderr, progress = run
    depth, top, inside = 0, [], {}
    for kind, payload in progress.events:
        if kind == "stage" and depth == 0:
            top.append({"name": payload["name"], "summary": None})
        elif depth >= 1:
            inside.setdefault(len(top), []).append((kind, payload))
        depth += {"stage": 1, "end": -1}.get(kind, 0)
        assert depth >= 0, "an end without its stage"
        if kind == "end" and depth == 0:
            top[-1]["summary"] = payload["summary"]
    assert depth == 0, "a stage was never ended"
    assert [s["name"] for s in top] == [f"{i}/6 {title}" for i, (_, title) in enumerate(STAGES, 1)]
    assert all(s["summary"] for s in top)
    assert top[2]["summary"].startswith("12 updates; validation perplexity")
    for s in top:  # each summary is printed with a ✓ and its seconds
        assert f"✓ {s['summary'].split(';')[0]}" in " ".join(stderr.split())
    # Stage 3: the budget decision as a note, then pretrain()'s own stage nested inside, with its updates.
    pretraining = inside[3]
    notes = [p["message"] for k, p in pretraining if k == "note"]
    assert any("→ 12 updates" in m and "validation perplexity before pretraining" in m for m in notes)
    nested = [p for k, p in pretraining if k == "stage"]
    assert nested and nested[0]["name"] == "pretrain" and nested[0]["total"] == 12 and nested[0]["unit"] == "updates"
    assert sum(p["n"] for k, p in pretraining if k == "advance") == 12
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["seconds"]) == [key for key, _ in STAGES]


def test_run_refuses_to_clobber(run, tmp_path):
    from gptcli.files.outputs import mark
    from gptcli.pipelines.quickstart import _replacing, check_out

    out = run[0]
    assert (out / ".gpt1-output").is_file()  # marked as a quickstart
    with pytest.raises(GPT1Error, match="not empty; pass --overwrite"):
        check_out(QuickstartConfig(out=out))
    assert check_out(QuickstartConfig(out=out, overwrite=True)) == out
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    (foreign / "summary.json").write_text("{}")
    (foreign / ".git").mkdir()  # hidden entries are the user's too
    with pytest.raises(GPT1Error, match="did not write"):
        check_out(QuickstartConfig(out=foreign, overwrite=True))
    (foreign / "notes.txt").unlink()
    with pytest.raises(GPT1Error, match=r"did not write \(\.git\)"):
        check_out(QuickstartConfig(out=foreign, overwrite=True))
    assert (foreign / "summary.json").exists() and (foreign / ".git").is_dir()
    # Only quickstart's names but no marker (and not a complete quickstart): not recognisably gpt1's.
    own = tmp_path / "own"
    own.mkdir()
    for name in OUTPUTS[:3]:
        (own / name).mkdir()
        (own / name / "x").write_text("old")
    (own / ".corpus.partial-1").mkdir()
    with pytest.raises(GPT1Error, match="not something gpt1 wrote"):
        check_out(QuickstartConfig(out=own, overwrite=True))
    mark(own, "quickstart")  # an interrupted quickstart: marked when it started
    check_out(QuickstartConfig(out=own, overwrite=True))
    with _replacing(own):
        assert sorted(p.name for p in own.iterdir() if not p.name.startswith(".quickstart-old-")) == [".gpt1-output"]
    assert [p.name for p in own.iterdir()] == [".gpt1-output"]


def test_a_failed_run_puts_the_earlier_quickstart_back(tmp_path):
    from gptcli.files.outputs import kind_of, mark
    from gptcli.pipelines.quickstart import _replacing

    own = tmp_path / "own"
    own.mkdir()
    mark(own, "quickstart")
    (own / "summary.json").write_text("old summary")
    (own / "corpus").mkdir()
    (own / "corpus" / "manifest.json").write_text("old manifest")
    with pytest.raises(KeyboardInterrupt), _replacing(own):
        (own / "text").mkdir()
        (own / "summary.json").write_text("new, half-written")
        raise KeyboardInterrupt
    assert sorted(p.name for p in own.iterdir()) == [".gpt1-output", "corpus", "summary.json"]
    assert (own / "summary.json").read_text() == "old summary"
    assert (own / "corpus" / "manifest.json").read_text() == "old manifest" and kind_of(own) == "quickstart"


def test_bad_budget_is_a_user_error(tmp_path):
    from gptcli.pipelines.quickstart import quickstart

    with pytest.raises(GPT1Error, match="--minutes"):
        quickstart(QuickstartConfig(out=tmp_path / "x", minutes=0))
    assert not (tmp_path / "x").exists()


def test_a_mistyped_model_table_is_refused_before_the_first_stage(tmp_path):
    from gptcli.pipelines.quickstart import quickstart

    with pytest.raises(GPT1Error, match=r"^model\.n_layer: expected an integer, got True$"):
        quickstart(QuickstartConfig(out=tmp_path / "x", model={**QuickstartConfig().model, "n_layer": True}))
    assert not (tmp_path / "x").exists()


def test_the_kernels_are_built_before_the_clock_starts(tmp_path, monkeypatch):
    """A machine's first quickstart compiles the CPU kernels (about a minute on 2 cores): before ``t_start``, so that
    the pretraining budget, and with it the numbers, are those of every later run."""
    import time

    from gptcli.model import kernels
    from gptcli.pipelines import quickstart as qs

    seen: dict[str, float] = {}

    def prepare(device, progress):
        seen["device"] = device.type
        seen["prepared"] = time.perf_counter()

    class Stop(Exception):
        pass

    def collect_text(run):
        seen["t_start"] = run.t_start
        raise Stop

    monkeypatch.setattr(kernels, "prepare", prepare)
    monkeypatch.setattr(qs, "collect_text", collect_text)
    with pytest.raises(Stop):
        qs.quickstart(QuickstartConfig(**{**TINY, "out": str(tmp_path / "qs")}))
    assert seen["device"] == "cpu" and seen["prepared"] <= seen["t_start"]
