"""The encoded-example cache (gptcli/data/cache.py) and parallel tokenization (transforms.encode_texts): cached and
parallel encodings equal the plain one on real task files; damaged entries are reported and rebuilt."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gptcli.data import cache as cache_mod
from gptcli.data import transforms
from gptcli.data.cache import default_root, encode_cached, read_entry
from gptcli.data.transforms import encode_examples, encode_texts
from gptcli.progress import RecordingProgress as Recorder
from gptcli.tasks import ReadOptions, get_task


@pytest.fixture(scope="module")
def openai_tok(shared_data):
    from gptcli.tokenizers.openai import OpenAIBPETokenizer

    return OpenAIBPETokenizer.from_dir(shared_data / "openai-gpt-bpe")


@pytest.fixture(scope="module")
def learned_tok(shared_data):
    from gptcli.tokenizers.learned import LearnedBPETokenizer
    from gptcli.tokenizers.text import word_lines

    book = (shared_data / "books" / "pg11_alice_in_wonderland.txt").read_text(encoding="utf-8-sig")[:60000]
    return LearnedBPETokenizer.train(word_lines(book), vocab_size=400, seed=0)


REAL = {
    "rte": ("glue/RTE", "dev"),
    "mrpc": ("glue/MRPC", "dev"),
    "stsb": ("glue/STS-B", "dev"),
    "storycloze": ("storycloze", "dev"),
}


def real(shared_data: Path, name: str, n: int = 150) -> tuple[object, list]:
    folder, split = REAL[name]
    task = get_task(name)
    return task, task.read(split, shared_data / folder, ReadOptions())[:n]


def same(a, b) -> None:
    assert [(e.seqs, e.label, e.index, e.uid, e.extra) for e in a] == [
        (e.seqs, e.label, e.index, e.uid, e.extra) for e in b
    ]
    for e in b:  # the same Python types as the plain path (lists of ints), not numpy scalars
        assert all(type(s) is list and all(type(i) is int for i in s) for s in e.seqs)


@pytest.mark.parametrize("name", list(REAL))
def test_cached_encoding_is_identical_on_real_files(shared_data, openai_tok, tmp_path, monkeypatch, name):
    task, examples = real(shared_data, name)
    plain = encode_examples(task, examples, openai_tok, 512)
    first = encode_cached(task, examples, openai_tok, 512, root=tmp_path, workers=1)
    assert len(list(tmp_path.glob("*.arrow"))) == 1 and len(list(tmp_path.glob("*.json"))) == 1
    same(plain, first)

    def boom(*a, **k):
        raise AssertionError("encoded again although the cache holds the entry")

    monkeypatch.setattr(cache_mod, "encode_examples", boom)
    second = encode_cached(task, examples, openai_tok, 512, root=tmp_path)
    same(plain, second)


def test_default_location_follows_gpt1_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GPT1_CACHE", str(tmp_path / "c"))
    assert default_root() == tmp_path / "c"
    monkeypatch.delenv("GPT1_CACHE")
    assert default_root() == Path.home() / ".cache" / "gpt1" / "encoded"


def test_every_input_of_the_encoding_is_in_the_key(shared_data, openai_tok, learned_tok, tmp_path):
    task, examples = real(shared_data, "rte", 40)
    encode_cached(task, examples, openai_tok, 512, root=tmp_path)
    encode_cached(task, examples, openai_tok, 64, root=tmp_path)  # n_ctx
    encode_cached(task, examples[:39], openai_tok, 512, root=tmp_path)  # another subset / file content
    encode_cached(task, examples, learned_tok, 512, root=tmp_path)  # another tokenizer
    encode_cached(get_task("wnli"), examples, openai_tok, 512, root=tmp_path)  # another task, same kind
    assert len(list(tmp_path.glob("*.arrow"))) == 5
    encode_cached(task, examples, openai_tok, 64, root=tmp_path)  # a repeat is a hit
    assert len(list(tmp_path.glob("*.arrow"))) == 5


def test_no_cache_reads_and_writes_nothing(shared_data, openai_tok, tmp_path):
    task, examples = real(shared_data, "mrpc", 20)
    enc = encode_cached(task, examples, openai_tok, 512, root=tmp_path, cache=False)
    same(encode_examples(task, examples, openai_tok, 512), enc)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
    elif how == "no-sidecar":
        path.with_suffix(".json").unlink()
    elif how == "bad-sidecar":
        path.with_suffix(".json").write_text("{not json", encoding="utf-8")


@pytest.mark.parametrize("how", ["truncate", "flip", "no-sidecar", "bad-sidecar"])
def test_a_damaged_entry_is_reported_and_rebuilt(shared_data, openai_tok, tmp_path, how):
    task, examples = real(shared_data, "stsb", 30)
    plain = encode_cached(task, examples, openai_tok, 512, root=tmp_path)
    (entry,) = tmp_path.glob("*.arrow")
    _damage(entry, how)
    rec = Recorder()
    again = encode_cached(task, examples, openai_tok, 512, root=tmp_path, progress=rec, what="stsb dev")
    same(plain, again)
    warns = [n for n in rec.of("note") if n["level"] == "warn"]
    assert len(warns) == 1 and "damaged" in warns[0]["message"] and "stsb dev" in warns[0]["message"]
    assert "\n" not in warns[0]["message"]
    rec = Recorder()  # rebuilt: the next run uses it without a word
    same(plain, encode_cached(task, examples, openai_tok, 512, root=tmp_path, progress=rec))
    assert rec.of("note") == []
    assert isinstance(read_entry(tmp_path, entry.stem, len(examples)), list)


def test_an_unwritable_cache_is_a_warning_not_a_failure(shared_data, openai_tok, tmp_path):
    task, examples = real(shared_data, "rte", 10)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rec = Recorder()
    enc = encode_cached(task, examples, openai_tok, 512, root=blocker, progress=rec)
    same(encode_examples(task, examples, openai_tok, 512), enc)
    (warn,) = [n for n in rec.of("note") if n["level"] == "warn"]
    assert "GPT1_CACHE" in warn["message"] and "--no-cache" in warn["message"]


def test_no_temporary_file_is_left_behind(shared_data, openai_tok, tmp_path):
    task, examples = real(shared_data, "rte", 10)
    encode_cached(task, examples, openai_tok, 512, root=tmp_path)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".arrow", ".json"]


# --------------------------------------------------------------------------------------------- parallel encoding


def _texts(shared_data: Path, n: int) -> list[str]:
    _, examples = real(shared_data, "rte", n)
    return [t for e in examples for t in e.texts]


@pytest.mark.parametrize("kind", ["openai", "sentencepiece"])
def test_workers_give_the_ids_of_one_process(shared_data, openai_tok, learned_tok, monkeypatch, kind):
    tok = openai_tok if kind == "openai" else learned_tok
    texts = _texts(shared_data, 120)
    one = encode_texts(tok, texts, workers=1)
    monkeypatch.setattr(transforms, "PARALLEL_MIN_TEXTS", 0)
    assert encode_texts(tok, texts, workers=2) == one
    assert encode_texts(tok, texts, workers=3) == one


class PidTokenizer:
    """Encodes every text as [the pid of the process that encoded it, its length]; slowly, so that both workers
    get chunks (a fast one could take them all before the other starts)."""

    def encode_batch(self, texts):
        time.sleep(0.05)
        return [[os.getpid(), len(t)] for t in texts]


def test_the_work_really_runs_in_worker_processes(monkeypatch):
    monkeypatch.setattr(transforms, "PARALLEL_MIN_TEXTS", 0)
    texts = [f"text {i}" for i in range(1000)]
    out = encode_texts(PidTokenizer(), texts, workers=2)
    assert [o[1] for o in out] == [len(t) for t in texts]  # in order
    pids = {o[0] for o in out}
    assert os.getpid() not in pids and len(pids) == 2


def test_small_inputs_stay_in_process():
    out = encode_texts(PidTokenizer(), ["a", "b"], workers=4)
    assert {o[0] for o in out} == {os.getpid()}


def test_workers_zero_means_all_cores_and_negative_is_refused():
    from gptcli.errors import GPT1Error

    assert transforms.resolve_workers(0) == len(os.sched_getaffinity(0))
    with pytest.raises(GPT1Error, match="--workers"):
        transforms.resolve_workers(-1)


# --------------------------------------------------------------------------------------------- through finetune


def test_finetune_fills_the_cache_reuses_it_and_no_cache_bypasses_it(pretrained, shared_data, tmp_path, monkeypatch):
    from gptcli.train.finetune import FinetuneConfig, finetune

    root = tmp_path / "cache"
    monkeypatch.setenv("GPT1_CACHE", str(root))
    base = dict(
        task="rte",
        init=str(pretrained),
        data_dir=str(shared_data / "glue/RTE"),
        max_train_examples=16,
        max_eval_examples=8,
        batch_size=8,
        epochs=1,
        lr=1e-3,
        device="cpu",
        precision="fp32",
    )
    first = finetune(FinetuneConfig(out=str(tmp_path / "a"), **base))
    assert len(list(root.glob("*.arrow"))) == 2  # train and dev
    monkeypatch.setattr(cache_mod, "encode_examples", lambda *a, **k: pytest.fail("encoded again"))
    second = finetune(FinetuneConfig(out=str(tmp_path / "b"), workers=2, **base))
    assert second.results["scores"] == first.results["scores"]
    monkeypatch.undo()
    root2 = tmp_path / "cache2"
    monkeypatch.setenv("GPT1_CACHE", str(root2))
    third = finetune(FinetuneConfig(out=str(tmp_path / "c"), cache=False, **base))
    assert not root2.exists()
    assert third.results["scores"] == first.results["scores"]


def test_the_gc_pause_of_a_warm_start_restores_the_collectors_state():
    """The cache hit pauses the cyclic GC while it builds its objects (and freezes them): whatever the state was
    before, it is the state after, an exception included."""
    import gc

    from gptcli.data.cache import _gc_paused

    for before in (True, False):
        (gc.enable if before else gc.disable)()
        try:
            with _gc_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
            with pytest.raises(RuntimeError), _gc_paused():
                raise RuntimeError("boom")
            assert gc.isenabled() is before
        finally:
            gc.enable()


def test_parallel_encoding_under_the_command_line_prints_no_worker_traceback(
    shared_data, openai_tok, monkeypatch, capfd
):
    """The pool's workers are forked with the command line's SIGTERM handler (raise ``Terminated``); leaving the
    ``with Pool()`` block terminates them with SIGTERM, and every `gpt1 finetune` that encoded in parallel printed a
    worker's traceback. The workers now take SIGTERM's default."""
    import signal

    from gptcli import cli

    texts = _texts(shared_data, 120)
    monkeypatch.setattr(transforms, "PARALLEL_MIN_TEXTS", 0)
    previous = cli._catch_sigterm()
    try:
        assert encode_texts(openai_tok, texts, workers=2) == encode_texts(openai_tok, texts, workers=1)
    finally:
        for s, handler in (previous or {}).items():
            signal.signal(s, handler)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Terminated" not in err, err
