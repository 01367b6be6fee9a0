"""Encoding an MNLI-sized task with the `openai` tokenizer: cold (1 and 2 workers), warm (cache hit), word cache.

There is no real MNLI here, so the input is built from real sentences in ../shared/data — premises from the
Gutenberg books (one or two consecutive sentences), hypotheses from the GLUE sentence files (SST-2, CoLA, RTE, MRPC,
STS-B, QNLI) — and written in MNLI's 12-column ``train.tsv`` format, so `gptcli.tasks` reads it as the `mnli` task.

Measured, each with a fresh tokenizer (empty word cache) and an empty encoding cache:

- cold encode at 1 worker and at 2 workers (``encode_cached``: tokenize + lay out + write the cache entry), and the
  ratio;
- warm start: read the TSV, hit the cache (sha256 check + memory-map), build the first batch — what a second run
  spends before its first update (the model load is not included);
- the word cache of the openai tokenizer (``OpenAIBPETokenizer._cache``): the BPE-merge step with and without it,
  on one worker, with its hit rate.

    python benchmarks/finetune_encode.py                    # 20,000 pairs (well under 2 minutes on 2 cores)
    python benchmarks/finetune_encode.py --pairs 393000     # MNLI's size (about 20× longer)

The machine is shared: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import random
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gptcli.data.batching import iterate  # noqa: E402
from gptcli.data.cache import encode_cached  # noqa: E402
from gptcli.tasks import ReadOptions, get_task  # noqa: E402
from gptcli.tokenizers import openai as openai_mod  # noqa: E402
from gptcli.tokenizers.openai import OpenAIBPETokenizer  # noqa: E402

SHARED = Path(os.environ.get("GPT1_SHARED", REPO.parent / "shared")) / "data"
GLUE_SENTENCES = {
    "SST-2/train.tsv": ["sentence"],
    "RTE/train.tsv": ["sentence1", "sentence2"],
    "MRPC/train.tsv": ["#1 String", "#2 String"],
    "STS-B/train.tsv": ["sentence1", "sentence2"],
    "QNLI/dev.tsv": ["question", "sentence"],
}
HEADER = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
    "label1",
    "gold_label",
]
LABELS = ("entailment", "neutral", "contradiction")


def glue_sentences() -> list[str]:
    out: list[str] = []
    for name, cols in GLUE_SENTENCES.items():
        with open(SHARED / "glue" / name, encoding="utf-8-sig", newline="") as f:
            for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                out += [row[c].strip() for c in cols if row.get(c) and row[c].strip()]
    return out


def book_sentences() -> list[str]:
    out: list[str] = []
    for path in sorted((SHARED / "books").glob("*.txt")):
        text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
        body = re.split(r"\*\*\* ?START OF.*?\*\*\*", text, maxsplit=1)[-1]
        body = re.split(r"\*\*\* ?END OF", body, maxsplit=1)[0]
        for para in re.split(r"\n\s*\n", body):
            para = " ".join(para.split())
            out += [s for s in re.split(r"(?<=[.!?])\s+", para) if 20 <= len(s) <= 400]
    return out


def build_tsv(path: Path, pairs: int, seed: int = 0) -> int:
    """MNLI-format train.tsv of ``pairs`` rows; returns its size in bytes."""
    rng = random.Random(seed)
    books, glue = book_sentences(), glue_sentences()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\t".join(HEADER) + "\n")
        for i in range(pairs):
            j = rng.randrange(len(books) - 1)
            premise = " ".join(books[j : j + rng.choice((1, 1, 2))])
            hypothesis = rng.choice(glue)
            label = rng.choice(LABELS)
            row = [str(i), str(i), f"{i}e", "fiction", "", "", "", "", premise, hypothesis, label, label]
            f.write("\t".join(x.replace("\t", " ") for x in row) + "\n")
    return path.stat().st_size


def fresh_tokenizer() -> OpenAIBPETokenizer:
    return OpenAIBPETokenizer.from_dir(SHARED / "openai-gpt-bpe")


def cold(task, examples, workers: int, root: Path) -> float:
    tok = fresh_tokenizer()
    t = time.perf_counter()
    encode_cached(task, examples, tok, 512, workers=workers, root=root)
    return time.perf_counter() - t


def warm(task, folder: Path, root: Path) -> dict[str, float]:
    tok = fresh_tokenizer()
    t0 = time.perf_counter()
    examples = task.read("train", folder, ReadOptions())
    t1 = time.perf_counter()
    enc = encode_cached(task, examples, tok, 512, root=root)
    t2 = time.perf_counter()
    next(iter(iterate(enc, 32, shuffle=True, rng=random.Random(0))))
    t3 = time.perf_counter()
    return {"read": t1 - t0, "cache hit": t2 - t1, "first batch": t3 - t2, "total": t3 - t0}


def word_cache_effect(examples, n: int) -> dict[str, float]:
    """Encode the first ``n`` pairs' texts with the word cache on and off (one process each, fresh tokenizers)."""
    from gptcli.tokenizers.text import clean, spacy_tokenizer

    texts = list(dict.fromkeys(t for e in examples[:n] for t in e.texts))
    words = [[w.text for w in doc] for doc in spacy_tokenizer().pipe(clean(t) for t in texts)]
    out = {"words": sum(map(len, words)), "distinct": len({w for ws in words for w in ws})}
    t = time.perf_counter()
    spacy_list = list(spacy_tokenizer().pipe(clean(t) for t in texts))
    out["clean+spaCy s"] = time.perf_counter() - t
    del spacy_list
    for label, limit in (("BPE with cache s", openai_mod._CACHE_LIMIT), ("BPE without cache s", 0)):
        tok = fresh_tokenizer()
        openai_mod._CACHE_LIMIT = limit  # 0: the cache is cleared before every insert, so every word is merged
        try:
            t = time.perf_counter()
            for ws in words:
                for w in ws:
                    tok.word_ids(w)
            out[label] = time.perf_counter() - t
        finally:
            openai_mod._CACHE_LIMIT = 1_000_000
    out["hit rate"] = 1 - out["distinct"] / out["words"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20000, help="rows of the MNLI-shaped train.tsv (MNLI: 393,000)")
    ap.add_argument("--word-cache-pairs", type=int, default=5000, help="pairs used for the word-cache measurement")
    args = ap.parse_args()
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
        platform.processor(),
    )
    print(f"CPU: {cpu}; cores available: {len(os.sched_getaffinity(0))}; python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="gpt1-encode-bench-") as d:
        folder = Path(d) / "MNLI"
        size = build_tsv(folder / "train.tsv", args.pairs)
        task = get_task("mnli")
        examples = task.read("train", folder, ReadOptions())
        text_mb = sum(len(t.encode()) for e in examples for t in e.texts) / 1e6
        print(f"input: {len(examples):,} pairs, {size / 1e6:.1f} MB TSV, {text_mb:.1f} MB of text")
        # spaCy's tokenizer loads once per process (seconds): load it before timing, so neither run pays it.
        fresh_tokenizer().encode_batch(["Warm up."])
        t1 = cold(task, examples, 1, Path(d) / "c1")
        print(f"cold encode, 1 worker : {t1:7.1f} s  ({text_mb / t1:.2f} MB/s)")
        t2 = cold(task, examples, 2, Path(d) / "c2")
        print(f"cold encode, 2 workers: {t2:7.1f} s  ({text_mb / t2:.2f} MB/s)   speed-up {t1 / t2:.2f}x")
        w = warm(task, folder, Path(d) / "c2")
        print("warm start (cache hit → first batch): " + ", ".join(f"{k} {v:.2f} s" for k, v in w.items()))
        wc = word_cache_effect(examples, args.word_cache_pairs)
        print(
            f"word cache ({args.word_cache_pairs:,} pairs, {wc['words']:,} words, {wc['distinct']:,} distinct, "
            f"hit rate {wc['hit rate']:.1%}): clean+spaCy {wc['clean+spaCy s']:.2f} s, BPE "
            f"{wc['BPE with cache s']:.2f} s with the cache vs {wc['BPE without cache s']:.2f} s without "
            f"({wc['BPE without cache s'] / max(wc['BPE with cache s'], 1e-9):.0f}x)"
        )


if __name__ == "__main__":
    main()
