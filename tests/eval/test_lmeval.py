"""The lm-evaluation-harness model ``gpt1`` (gptcli/eval/lmeval.py) agrees with gpt1's own numbers, offline, on real
data: lm-eval's scores on the local task configs (SST-2 dev, Story Cloze val, WikiText-2 valid) equal ``gpt1 zeroshot``
and ``gpt1 eval``'s on the same examples, and ``lm_eval --model hf`` on a ``gpt1 convert --to hf`` export equals
``lm_eval --model gpt1`` on the checkpoint.

Tiny random models (2 layers × 32, a 64-token context so that WikiText articles span many windows) with a sentencepiece
BPE learned on one book; a few dozen examples per task; everything in fp32 on the CPU. lm-eval is run in-process with
its built-in task index switched off (indexing its thousands of task files takes ~15 s); one test runs ``gpt1 lmeval``
as a user types it.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if os.environ.get("CI"):  # CI installs the dev extra: lm-eval missing there is an error, not a skipped module
    import lm_eval
else:
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is part of the dev extra (pip install -e '.[dev]')")

from gptcli.checkpoint import save_checkpoint  # noqa: E402
from gptcli.eval import lmeval  # noqa: E402  (registers the gpt1 model)
from gptcli.eval.lmeval_tasks import wikitext_articles, write_local_tasks  # noqa: E402
from gptcli.eval.perplexity import evaluate_lm  # noqa: E402
from gptcli.eval.zeroshot import ZeroShotConfig, zeroshot  # noqa: E402
from gptcli.model.gpt import GPT, ModelConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
LIMIT = 24
FP32 = "precision=fp32,device=cpu"


@pytest.fixture(scope="module", autouse=True)
def _datasets_offline(tmp_path_factory):
    """lm-eval reads the local task files through ``datasets``: offline, with a cache of this module's own (also when
    ``datasets`` was imported before, which reads both settings once)."""
    cache = tmp_path_factory.mktemp("datasets-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_DATASETS_CACHE", str(cache))
        config = sys.modules.get("datasets.config")
        if config is not None:
            mp.setattr(config, "HF_DATASETS_OFFLINE", True)
            mp.setattr(config, "HF_DATASETS_CACHE", cache)
        yield


@pytest.fixture(scope="module")
def learned_tok(shared_data):
    from gptcli.tokenizers.learned import LearnedBPETokenizer
    from gptcli.tokenizers.text import strip_gutenberg, word_lines

    book = (shared_data / "books" / "pg11_alice_in_wonderland.txt").read_text(encoding="utf-8-sig")
    return LearnedBPETokenizer.train(word_lines(strip_gutenberg(book)[0]), vocab_size=500, seed=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, learned_tok) -> Path:
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=learned_tok.vocab_size, n_ctx=64, n_embd=32, n_layer=2, n_head=2, n_inner=128))
    return save_checkpoint(tmp_path_factory.mktemp("ck") / "step-0000001", model, learned_tok, meta={"step": 1})


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, shared_data) -> Path:
    d = tmp_path_factory.mktemp("lmeval-tasks")
    assert write_local_tasks(shared_data, d, limit=LIMIT) == ["gpt1_sst2", "gpt1_storycloze", "gpt1_wikitext2"]
    return d


def harness(model: str, model_args: str, task_names: list[str], tasks: Path) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=task_names,
        log_samples=True,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        bootstrap_iters=0,
    )


def lls(result: dict, task: str) -> list[list[float]]:
    """Per document, the log-likelihood of each request (each choice), in the file's order."""
    samples = sorted(result["samples"][task], key=lambda s: s["doc_id"])
    return [[r[0] if isinstance(r, (list, tuple)) else r for r in s["filtered_resps"]] for s in samples]


@pytest.fixture(scope="module")
def gpt1_result(checkpoint, tasks) -> dict:
    return harness("gpt1", f"checkpoint={checkpoint},{FP32}", ["gpt1_sst2", "gpt1_storycloze", "gpt1_wikitext2"], tasks)


def test_sst2_matches_gpt1_zeroshot(gpt1_result, checkpoint, shared_data, tmp_path):
    """``<sentence> very`` → ``negative``/``positive``: lm-eval's per-choice log-likelihoods and accuracy are gpt1
    zeroshot's (both words are one-or-more tokens scored as sums on both sides)."""
    results, _, _ = zeroshot(
        ZeroShotConfig(
            task="sst2",
            checkpoint=str(checkpoint),
            data_dir=str(shared_data / "glue" / "SST-2"),
            limit=LIMIT,
            precision="fp32",
            device="cpu",
        )
    )
    ours = results["sst2"].predictions
    theirs = lls(gpt1_result, "gpt1_sst2")
    assert len(theirs) == len(ours) == LIMIT
    for p, (neg, pos) in zip(ours, theirs):
        assert neg == pytest.approx(p["logprob_negative"], abs=1e-4)
        assert pos == pytest.approx(p["logprob_positive"], abs=1e-4)
    assert 100 * gpt1_result["results"]["gpt1_sst2"]["acc,none"] == pytest.approx(results["sst2"].score, abs=1e-9)


def test_storycloze_matches_gpt1_zeroshot_per_token(gpt1_result, checkpoint, learned_tok, shared_data):
    """lm-eval's ``acc`` ranks endings by summed log-probability and ``acc_norm`` per character; gpt1 zeroshot ranks
    them per token (the paper's heuristic). The numbers underneath are the same: lm-eval's log-likelihood of an ending
    divided by its token count is zeroshot's mean, and the per-token choice is zeroshot's prediction."""
    results, _, _ = zeroshot(
        ZeroShotConfig(
            task="storycloze",
            checkpoint=str(checkpoint),
            data_dir=str(shared_data / "storycloze"),
            limit=LIMIT,
            precision="fp32",
            device="cpu",
        )
    )
    res = results["storycloze"]
    docs = [
        json.loads(line)
        for line in (
            Path(gpt1_result["configs"]["gpt1_storycloze"]["dataset_kwargs"]["data_files"]["validation"])
            .read_text()
            .splitlines()
        )
    ]
    theirs = lls(gpt1_result, "gpt1_storycloze")
    correct = 0
    for p, doc, ll in zip(res.predictions, docs, theirs):
        means = [x / len(learned_tok.encode(e)) for x, e in zip(ll, doc["endings"])]
        assert means == pytest.approx(p["mean_logprobs"], abs=1e-4)
        assert int(np.argmax(means)) == p["prediction"]
        correct += int(np.argmax(means)) == doc["label"]
    assert 100 * correct / len(docs) == pytest.approx(res.score)
    acc = gpt1_result["results"]["gpt1_storycloze"]["acc,none"]
    assert acc == pytest.approx(np.mean([int(np.argmax(ll)) == d["label"] for ll, d in zip(theirs, docs)]))


def test_wikitext_rolling_matches_gpt1_eval_perplexity(gpt1_result, checkpoint, learned_tok, shared_data):
    """``loglikelihood_rolling`` scores gpt1 eval's windows (n_ctx + 1 tokens on a stride of n_ctx, the first token of
    a document unscored): its summed log-likelihood over the articles is ``evaluate_lm``'s token loss (the function
    behind ``gpt1 eval --data``) times its token count, so the token perplexities agree; lm-eval's word perplexity is
    the same sum over the words."""
    from gptcli.checkpoint import load_checkpoint

    articles = wikitext_articles(shared_data / "wikitext-2" / "wiki.valid.tokens")[:LIMIT]
    arrays = [np.asarray(learned_tok.encode(a), dtype=np.int64) for a in articles]
    assert max(len(a) for a in arrays) > 20 * 64  # many windows per article
    model = load_checkpoint(checkpoint).model.eval()
    ref = evaluate_lm(model, arrays, 64, batch_size=8, precision="fp32")
    total = sum(x for (x,) in lls(gpt1_result, "gpt1_wikitext2"))
    assert ref.tokens == sum(len(a) - 1 for a in arrays)
    assert -total / ref.tokens == pytest.approx(ref.loss, abs=1e-4)
    assert math.exp(-total / ref.tokens) == pytest.approx(ref.perplexity, rel=1e-4)
    words = sum(len(re.split(r"\s+", a)) for a in articles)  # lm-eval's word count (Task.count_words)
    word_ppl = gpt1_result["results"]["gpt1_wikitext2"]["word_perplexity,none"]
    assert math.log(word_ppl) == pytest.approx(-total / words, rel=1e-6)


def test_hf_export_scores_as_gpt1_on_the_released_weights_stand_in(tmp_path, shared_data, tasks, monkeypatch):
    """``lm_eval --model hf`` on ``gpt1 convert --to hf`` of the released-weights stand-in (a random openai-gpt saved
    by transformers, the real 40,478-token BPE) equals ``lm_eval --model gpt1`` on the imported checkpoint, on every
    example whose ids the exported tokenizer reproduces (``prefix_token_id``: GPT-1 has no BOS/EOS, which lm-eval's
    hf model asks for; it is unused on these tasks, whose contexts are never empty)."""
    from hub_standin import write_gpt1_repo
    from transformers import AutoTokenizer

    from gptcli.interop.convert import convert_to_checkpoint, from_hf, to_hf

    snap = write_gpt1_repo(tmp_path / "hub", shared_data / "openai-gpt-bpe")
    ck = convert_to_checkpoint(from_hf(snap), tmp_path / "ck")
    export, _ = to_hf(ck, tmp_path / "hf")
    names = ["gpt1_sst2", "gpt1_storycloze"]
    ours = harness("gpt1", f"checkpoint={ck},{FP32}", names, tasks)
    theirs = harness("hf", f"pretrained={export},dtype=float32,device=cpu,prefix_token_id=0", names, tasks)
    hf_tok = AutoTokenizer.from_pretrained(export)
    from gptcli.checkpoint import load_checkpoint

    tok = load_checkpoint(ck).tokenizer
    for name in names:
        samples = sorted(ours["samples"][name], key=lambda s: s["doc_id"])

        def hf_ids(text: str) -> list[int]:
            return hf_tok.encode(text, add_special_tokens=False)

        # lm-eval's hf model encodes the context and context + continuation; gpt1 the two apart (then concatenated).
        agree = [
            all(
                hf_ids(c) == tok.encode(c) and hf_ids(c + k) == tok.encode(c) + tok.encode(k) for c, k in s["arguments"]
            )
            for s in samples
        ]
        assert sum(agree) >= 0.9 * len(samples), f"{name}: tokenization agrees on {sum(agree)}/{len(samples)} only"
        for same, a, b in zip(agree, lls(ours, name), lls(theirs, name)):
            if same:
                assert a == pytest.approx(b, abs=1e-4)
        if all(agree):
            assert ours["results"][name]["acc,none"] == theirs["results"][name]["acc,none"]

    # checkpoint=openai-gpt: the Hub id (here the stand-in in a local Hugging Face cache) is converted once and scored.
    from hub_standin import use_cache
    from lm_eval.api.instance import Instance

    use_cache(monkeypatch, tmp_path / "hub")
    by_id = lmeval.GPT1LM(checkpoint="openai-gpt", precision="fp32", device="cpu")
    request = samples[0]["arguments"][0]
    ((ll, _),) = by_id.loglikelihood([Instance("loglikelihood", {}, tuple(request), 0)])
    assert ll == pytest.approx(lls(ours, names[-1])[0][0], abs=1e-5)


def test_generate_until_is_gpt1_greedy_generation_cut_at_the_stop(checkpoint):
    """``generate_until`` is greedy KV-cached ``iter_generate``; a stop string is matched in the pipeline's form
    (lowercased, words spaced) and the text cut before it."""
    from lm_eval.api.instance import Instance

    from gptcli.checkpoint import load_checkpoint
    from gptcli.model.generate import SamplingConfig, generate

    lm = lmeval.GPT1LM(checkpoint=str(checkpoint), precision="fp32", device="cpu")
    ck = load_checkpoint(checkpoint)
    prompt = "Alice was beginning to get very tired"
    ids = generate(
        ck.model.eval(),
        ck.tokenizer.encode(prompt),
        SamplingConfig(max_new_tokens=12, greedy=True),
        vocab_limit=ck.tokenizer.vocab_size,
    )
    full = ck.tokenizer.decode(ids)
    words = full.split()
    assert len(words) >= 3
    stop = words[2].upper()  # a stop typed in another case still matches the lowercased text
    reqs = [
        Instance("generate_until", {}, (prompt, {"until": [stop], "max_gen_toks": 12}), 0),
        Instance("generate_until", {}, (prompt, {"until": ["\n\n"], "max_gen_toks": 12}), 1),
    ]
    cut, whole = lm.generate_until(reqs)
    assert whole == full
    assert cut == full[: full.find(words[2])]


def test_an_lstm_checkpoint_is_scored_too(tmp_path, learned_tok):
    from lm_eval.api.instance import Instance

    from gptcli.eval.scoring import Request, score
    from gptcli.model.lstm import LSTMLM, LSTMConfig

    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=learned_tok.vocab_size, n_ctx=32, n_embd=16, n_hidden=24))
    ck = save_checkpoint(tmp_path / "lstm", model, learned_tok)
    lm = lmeval.GPT1LM(checkpoint=str(ck), precision="fp32", device="cpu")
    text = "the queen said off with her head " * 12
    (rolled,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ids = learned_tok.encode(text)
    assert len(ids) > 64
    ref = evaluate_lm(model.eval(), [np.asarray(ids)], 32, precision="fp32")
    assert -rolled / ref.tokens == pytest.approx(ref.loss, abs=1e-4)
    ((ll, greedy),) = lm.loglikelihood([Instance("loglikelihood", {}, ("the queen said", " off with"), 0)])
    (s,) = score(
        model, [Request.of(learned_tok.encode("the queen said"), learned_tok.encode("off with"))], precision="fp32"
    )
    assert ll == pytest.approx(s.logprob, abs=1e-5) and greedy == s.greedy


def test_rolling_windows_are_scored_within_the_token_budget(checkpoint, learned_tok):
    # Rolling windows were grouped by their first token (every document's "alice", a newline) into single passes
    # far over the budget (batch_size × 128 tokens): they share no context, so each is a row of its own.
    from lm_eval.api.instance import Instance

    from gptcli.eval.scoring import score

    lm = lmeval.GPT1LM(checkpoint=str(checkpoint), precision="fp32", device="cpu", batch_size=4)
    rnd = np.random.default_rng(0)
    words = "the queen said off with her head and alice ran down the rabbit hole".split()
    texts = ["alice " + " ".join(rnd.choice(words, 90)) for _ in range(24)]
    sizes: list[int] = []
    hook = lm.model.register_forward_pre_hook(lambda m, args: sizes.append(args[0].numel()))
    rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])
    hook.remove()
    assert max(sizes) <= 4 * 128, max(sizes)
    ids = [learned_tok.encode(t) for t in texts]
    assert all(len(i) > 65 and i[0] == ids[0][0] for i in ids)  # several windows each, one first token for all
    ref = [sum(s.logprob for s in score(lm.model, lmeval.rolling_requests(i, 64), precision="fp32")) for i in ids]
    assert rolled == pytest.approx(ref, abs=1e-3)  # the same sums as the shared-context path gives


def test_model_args_are_checked(checkpoint):
    from gptcli.errors import GPT1Error

    with pytest.raises(GPT1Error, match="unknown for --model gpt1"):
        lmeval.GPT1LM(checkpoint=str(checkpoint), temprature=0.5)
    with pytest.raises(GPT1Error, match="checkpoint=DIR is required"):
        lmeval.GPT1LM()
    lm = lmeval.GPT1LM.create_from_arg_string(
        f"checkpoint={checkpoint},batch_size=4", {"batch_size": "auto", "device": "cpu", "max_batch_size": None}
    )
    assert lm.config.batch_size == 4 and lm.config.device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without the GPU")
def test_lm_evals_default_device_falls_back_where_there_is_no_gpu(checkpoint):
    """lm-eval passes its --device even when not given (default "cuda:0"): on a CPU machine the documented command
    failed with "no CUDA device". As lm-eval's own `hf` model does, a GPU that is not there means the best device
    here; a device named in --model_args stays strict."""
    from gptcli.errors import GPT1Error

    for given in ("cuda:0", "cuda"):
        lm = lmeval.GPT1LM.create_from_arg_string(f"checkpoint={checkpoint},precision=fp32", {"device": given})
        assert lm.config.device == "auto" and lm._device.type == "cpu"
    with pytest.raises(GPT1Error, match="no CUDA device"):
        lmeval.GPT1LM.create_from_arg_string(f"checkpoint={checkpoint},device=cuda", {"device": "cpu"})


def test_gpt1_lmeval_command_end_to_end(checkpoint, shared_data, tmp_path):
    """What a user types: ``gpt1 lmeval`` (lm-eval's own command line, the gpt1 model registered) on the local tasks,
    with no device given (lm-eval then passes its default, cuda:0, which a CPU machine must survive)."""
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "ds"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gptcli",
            "lmeval",
            "--model",
            "gpt1",
            "--model_args",
            f"checkpoint={checkpoint},precision=fp32",
            "--tasks",
            "gpt1_sst2",
            "--local-tasks",
            str(shared_data),
            "--limit",
            "8",
            "--output_path",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    body = json.loads(results.read_text())
    assert body["results"]["gpt1_sst2"]["acc,none"] is not None
    assert "|gpt1_sst2|" in proc.stdout.replace(" ", "")


def test_stop_strings_take_the_pipelines_form(learned_tok):
    assert lmeval.stop_forms(learned_tok, ["\n\n", "Question:", "  ", "Don't"]) == ["\n", "question :", "do n't"]
    assert lmeval.stop_forms(learned_tok, "\n") == ["\n"] and lmeval.stop_forms(learned_tok, None) == []
    assert lmeval.first_stop("a question : b\nc", ["\n", "question :"]) == 2
    assert lmeval.first_stop("abc", ["x"]) is None


def test_local_tasks_and_include_path_are_one_or_the_other(shared_data, tmp_path):
    from gptcli.errors import GPT1Error

    with pytest.raises(GPT1Error, match="give one of them"):
        lmeval.run_cli(["--model", "gpt1", "--include_path", str(tmp_path)], local_tasks=shared_data)
    with pytest.raises(GPT1Error, match="unknown local lm-eval task 'gpt1_rte'"):
        write_local_tasks(shared_data, tmp_path / "t", tasks=["gpt1_rte"])
    with pytest.raises(GPT1Error, match="none of the local lm-eval tasks' files found"):
        write_local_tasks(tmp_path, tmp_path / "t2")
