"""Throughput of `gpt1 prepare`, stage by stage and end to end, on the Gutenberg books in ../shared/data/books,
against the released GPT-1 pipeline and Hugging Face ``tokenizers``, in the same run.

1. **Ours, stage by stage** (one process): clean (ftfy + released standardization), spaCy words, BPE learning
   (sentencepiece, 4 threads as ``prepare`` runs it), BPE encode (one sentencepiece thread), shard write (Arrow
   IPC + sha256). Wall seconds and CPU seconds per stage; "MB/s per core" is MB per CPU second.
2. **The released pipeline** (openai/finetune-transformer-lm ``text_utils.py``, re-implemented faithfully here:
   ``ftfy.fix_text`` → ``text_standardize`` with the released regexes → spaCy's English tokenizer run through the
   whole ``nlp(text)`` call as ``spacy.load('en', disable=[parser, tagger, ner, textcat])`` ran it (here
   ``spacy.blank("en")``: the same rule tokenizer, no model to download; ``max_length`` raised, since books exceed
   spaCy's 10^6-character limit) → the released python BPE with its word → BPE-string cache, over the released
   files in ../shared/data/openai-gpt-bpe). Timed per stage and as the released ``TextEncoder.encode`` loop.
   ``gptcli.tokenizers.openai.OpenAIBPETokenizer`` IS that algorithm (same files, same merges, a word → ids
   cache); its BPE stage and its whole ``encode_batch`` are timed beside the released ones, and the ids of the
   two loops are checked to be identical. (``gpt1 prepare`` itself learns a new BPE, as the paper did; the
   released encoder is what ``gpt1`` uses with OpenAI's vocabulary.)
3. **Hugging Face tokenizers** (Rust, ``TOKENIZERS_PARALLELISM=false``: one core): a BPE trained at the same
   vocabulary size on the same word lines the sentencepiece BPE learns from (whitespace pre-tokenizer, ``</w>``
   suffix), then encoding those lines. Learning and encoding MB/s beside ours.
4. **End to end**: ``gptcli.data.prepare.prepare`` with 1 and 2 workers, its own per-stage times and CPU time,
   the speed-up 1 → 2 workers and whether the shards are identical.
5. **A projection** (clearly labelled; not a measurement) for BooksCorpus (~4.6 GB) on 16 and 64 cores from the
   1-worker stage rates and the measured 1 → 2 efficiency of each parallel stage.

MB are 10^6 bytes of book text after Gutenberg stripping, for every stage (the BPE stages see the cleaned word
lines, a little less text). The machine must be otherwise idle for the absolute figures; the ratios within one run
are robust to moderate noise.

    python benchmarks/prepare_throughput.py --json prepare.json            # all 56 books, 40,478-id vocabulary
    python benchmarks/prepare_throughput.py --limit-mb 0.5 --vocab-size 2000   # a quick check of every path
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # HF tokenizers on one core, set before any import
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _machine import machine_header, write_json  # noqa: E402  benchmarks/_machine.py

from gptcli.data.prepare import PrepareConfig, prepare  # noqa: E402
from gptcli.progress import Progress  # noqa: E402

BOOKSCORPUS_MB = 4600.0  # ≈ 4.6 GB of text (Zhu et al. 2015: 11,038 books, ~985M words)
SAMPLE_LINES = PrepareConfig().sample_lines  # the BPE is learned on at most this many lines


def _cpu() -> float:
    """User + system CPU seconds of this process and its finished children (the pool's workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *a, **kw):
    """(result, wall seconds, CPU seconds of this process, all its threads)."""
    c, t = time.process_time(), time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t, time.process_time() - c


class Timer(Progress):
    """Records how long each pipeline stage took (prepare's stages do not nest)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t0 = 0.0

    def stage(self, name, total=None, *, unit="", done=0):
        self._name, self._t0 = name, time.perf_counter()

    def end(self, summary=""):
        if self._name is not None:
            self.times[self._name] = time.perf_counter() - self._t0
            self._name = None


def pick_books(data: Path, limit_mb: float | None) -> list[Path]:
    books = sorted((data / "books").glob("*.txt"))
    if limit_mb is None:
        return books
    out, total = [], 0
    for b in sorted(books, key=lambda p: p.stat().st_size):  # smallest first: many documents in few MB
        if total + b.stat().st_size > limit_mb * 1e6 and out:
            break
        out.append(b)
        total += b.stat().st_size
    return out


# ------------------------------------------------------------------------------------ the released pipeline
# Written for this benchmark after openai/finetune-transformer-lm text_utils.py (MIT): the same operations in
# the same order, including its costs (per-call regexes, the list-scanning merge loop, a string cache).


def released_standardize(text: str) -> str:
    """The released ``text_standardize``. Its punctuation pattern is a non-raw string, so the regex engine sees
    ``gptcli.tokenizers.text.RELEASED_PUNCT`` (backslashes not split); ``re.sub`` with string patterns as there."""
    from gptcli.tokenizers.text import RELEASED_PUNCT

    for a, b in (("—", "-"), ("–", "-"), ("―", "-"), ("…", "..."), ("´", "'")):
        text = text.replace(a, b)
    text = re.sub(RELEASED_PUNCT, r" \1 ", text)
    text = re.sub(r"\s*\n\s*", " \n ", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    return text.strip()


def released_nlp():
    """spaCy's English pipeline with nothing but the tokenizer, called as ``nlp(text)``."""
    import spacy

    nlp = spacy.blank("en")
    nlp.max_length = 10**9  # books are longer than spaCy's default limit (the released code predates it)
    return nlp


class ReleasedBPE:
    """The released python BPE over ``encoder_bpe_40000.json`` + ``vocab_40000.bpe``, word → string cache."""

    def __init__(self, directory: Path) -> None:
        self.encoder = json.loads((directory / "encoder_bpe_40000.json").read_text(encoding="utf-8"))
        merges = (directory / "vocab_40000.bpe").read_text(encoding="utf-8").split("\n")[1:-1]
        self.ranks = {tuple(m.split()): r for r, m in enumerate(merges)}
        self.cache: dict[str, str] = {}

    @staticmethod
    def _pairs(word: tuple) -> set:
        return set(zip(word, word[1:]))

    def bpe(self, token: str) -> str:
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        if token in self.cache:
            return self.cache[token]
        pairs = self._pairs(word)
        if not pairs:
            return token + "</w>"  # not cached, as released
        while True:
            first, second = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if (first, second) not in self.ranks:
                break
            merged: list = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    merged.extend(word[i:])
                    break
                merged.extend(word[i:j])
                i = j
                if i < len(word) - 1 and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
            if len(word) == 1:
                break
            pairs = self._pairs(word)
        out = " ".join(word)
        if out == "\n  </w>":
            out = "\n</w>"
        self.cache[token] = out
        return out

    def ids(self, words) -> list[int]:
        get = self.encoder.get
        out: list[int] = []
        for w in words:
            out.extend(get(t, 0) for t in self.bpe(w.lower()).split(" "))
        return out


def released_encode(texts, nlp, bpe: ReleasedBPE) -> list[list[int]]:
    """The released ``TextEncoder.encode`` loop: fix, standardize, spaCy, lowercase, BPE, ids, per text."""
    import ftfy

    return [bpe.ids(t.text for t in nlp(released_standardize(ftfy.fix_text(text)))) for text in texts]


# ---------------------------------------------------------------------------------------------- measurements


def row(name: str, mb: float, wall: float, cpu: float, **extra) -> dict:
    return {
        "stage": name,
        "seconds": wall,
        "cpu_seconds": cpu,
        "mb_per_s": mb / wall,
        "mb_per_cpu_s": mb / cpu if cpu > 0 else float("nan"),
        **extra,
    }


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"{title:<44}{'seconds':>9}{'CPU s':>8}{'MB/s':>8}{'MB/s/core':>11}")
    for r in rows:
        print(
            f"{r['stage']:<44}{r['seconds']:>9.2f}{r['cpu_seconds']:>8.2f}{r['mb_per_s']:>8.2f}"
            f"{r['mb_per_cpu_s']:>11.2f}"
        )
    print()


def our_stages(docs: list[str], mb: float, args) -> tuple[list[dict], list[str], dict]:
    """Ours, one stage at a time; returns the rows, the word lines (what the BPE sees) and learning figures."""
    import numpy as np

    from gptcli.data.shards import write_shard
    from gptcli.tokenizers.learned import LearnedBPETokenizer
    from gptcli.tokenizers.text import clean, spacy_tokenizer, word_lines

    nlp = spacy_tokenizer()  # loaded outside the timing
    cleaned, w, c = timed(lambda: [clean(d) for d in docs])
    rows = [row("ours: clean (ftfy + standardize)", mb, w, c)]
    _, w, c = timed(lambda xs: [nlp(x) for x in xs], cleaned)
    rows.append(row("ours: spaCy words", mb, w, c))
    del cleaned
    lines = [line for d in docs for line in word_lines(d)]
    tok, w, c = timed(LearnedBPETokenizer.train, lines, vocab_size=args.vocab_size)
    rows.append(row(f"ours: BPE learning (sentencepiece, {args.vocab_size} ids)", mb, w, c, lines=len(lines)))
    ids, w, c = timed(tok.encode_lines, lines)
    rows.append(row("ours: BPE encode (sentencepiece)", mb, w, c, tokens=int(len(ids))))
    with tempfile.TemporaryDirectory() as tmp:
        _, w, c = timed(write_shard, Path(tmp) / "s.arrow", np.array_split(ids, len(docs)), np.dtype(np.uint16))
    rows.append(row("ours: shard write (+sha256)", mb, w, c))
    return rows, lines, {"lines": len(lines), "tokens": int(len(ids))}


def released_stages(docs: list[str], mb: float, bpe_dir: Path) -> tuple[list[dict], dict]:
    """The released pipeline stage by stage and as its whole loop, and the released encoder as gptcli has it."""
    import ftfy

    from gptcli.tokenizers.openai import OpenAIBPETokenizer
    from gptcli.tokenizers.text import clean, spacy_tokenizer

    nlp = released_nlp()
    nlp("warm up")
    fixed, w, c = timed(lambda: [released_standardize(ftfy.fix_text(d)) for d in docs])
    rows = [row("released: ftfy.fix_text + text_standardize", mb, w, c)]
    tokens, w, c = timed(lambda xs: [[t.text for t in nlp(x)] for x in xs], fixed)
    rows.append(row("released: spaCy nlp(text)", mb, w, c))
    del fixed
    bpe = ReleasedBPE(bpe_dir)
    _, w, c = timed(lambda xs: [bpe.ids(ws) for ws in xs], tokens)
    rows.append(row("released: BPE encode (python, string cache)", mb, w, c))
    ours_tok = OpenAIBPETokenizer.from_dir(bpe_dir)
    _, w, c = timed(lambda xs: [[i for t in ws for i in ours_tok.word_ids(t)] for ws in xs], tokens)
    rows.append(row("gptcli OpenAIBPETokenizer: BPE (ids cache)", mb, w, c))
    del tokens
    released_ids, w, c = timed(released_encode, docs, nlp, ReleasedBPE(bpe_dir))
    rows.append(row("released: whole TextEncoder.encode loop", mb, w, c))
    spacy_tokenizer()
    clean("warm up")
    our_ids, w, c = timed(OpenAIBPETokenizer.from_dir(bpe_dir).encode_batch, docs)
    rows.append(row("gptcli OpenAIBPETokenizer.encode_batch", mb, w, c))
    same = released_ids == our_ids
    n = sum(len(x) for x in released_ids)
    return rows, {"identical_ids": same, "tokens": n}


def hf_tokenizers(lines: list[str], mb: float, vocab_size: int) -> tuple[list[dict], dict]:
    """A Hugging Face ``tokenizers`` BPE learned at the same size on the same word lines, then encoding them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>"], end_of_word_suffix="</w>", show_progress=False
    )
    _, w, c = timed(tok.train_from_iterator, lines, trainer=trainer)
    rows = [row(f"HF tokenizers: BPE learning ({vocab_size} ids)", mb, w, c)]
    enc, w, c = timed(tok.encode_batch, lines, add_special_tokens=False)
    rows.append(row("HF tokenizers: BPE encode", mb, w, c))
    return rows, {
        "vocab": tok.get_vocab_size(),
        "tokens": sum(len(e.ids) for e in enc),
        "parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
    }


def end_to_end(books: list[Path], vocab_size: int) -> dict[int, dict]:
    """``prepare`` with 1 and 2 workers: wall and CPU seconds, its stage times, shard hashes, the BPE sample."""
    from gptcli.tokenizers.text import spacy_tokenizer

    spacy_tokenizer()  # both runs find spaCy loaded (the pool's workers inherit it when forked)
    results = {}
    for workers in (1, 2):
        tmp = Path(tempfile.mkdtemp(prefix="gpt1-bench-"))
        try:
            timer = Timer()
            cfg = PrepareConfig(
                inputs=[str(b) for b in books],
                out=tmp / "corpus",
                vocab_size=vocab_size,
                strip_gutenberg=True,
                workers=workers,
            )
            cpu0 = _cpu()
            res, total, _ = timed(prepare, cfg, progress=timer)
            results[workers] = {
                "seconds": total,
                "cpu_seconds": _cpu() - cpu0,
                "stages": timer.times,
                "shards": [s["sha256"] for s in res.manifest["shards"]],
                "sample": res.manifest["tokenizer"]["sample"],
            }
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def print_end_to_end(mb: float, results: dict[int, dict]) -> dict:
    print(f"{'end to end':<14}{'total s':>9}{'MB/s':>8}{'CPU s':>8}   stage seconds")
    for w, r in results.items():
        st = "  ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
        print(
            f"{str(w) + ' worker' + ('s' if w > 1 else ''):<14}{r['seconds']:>9.2f}{mb / r['seconds']:>8.2f}"
            f"{r['cpu_seconds']:>8.1f}   {st}"
        )
    r1, r2 = results[1], results[2]
    s1, s2 = r1["stages"], r2["stages"]
    summary = {
        "speedup_words": s1["words"] / s2["words"],
        "speedup_encode": s1["encode"] / s2["encode"],
        "speedup_total": r1["seconds"] / r2["seconds"],
        "cpu_ratio": r2["cpu_seconds"] / r1["cpu_seconds"],
        "identical_shards": r1["shards"] == r2["shards"],
    }
    print(f"CPU time with 2 workers / 1 worker: {summary['cpu_ratio']:.2f} (the cost of parallelism)")
    print(
        f"speed-up 2 vs 1 workers: words {summary['speedup_words']:.2f}x, encode {summary['speedup_encode']:.2f}x, "
        f"end to end {summary['speedup_total']:.2f}x; identical shards: {summary['identical_shards']}\n"
    )
    return summary


def projection(mb: float, results: dict[int, dict], shard_mb_per_s: float | None) -> dict:
    """BooksCorpus on 16 and 64 cores from the 1-worker stage rates and the measured 1 → 2 efficiency."""
    s1, s2 = results[1]["stages"], results[2]["stages"]
    rate = {k: mb / s1[k] for k in ("words", "encode")}  # MB/s of one worker
    eff = {k: min(1.0, s1[k] / s2[k] / 2) for k in ("words", "encode")}  # at 2 workers (noise can exceed 1)
    lines = (results[1]["sample"] or {}).get("lines") or 1
    learn = s1.get("learn BPE", 0.0) * SAMPLE_LINES / min(lines, SAMPLE_LINES)
    scan = BOOKSCORPUS_MB / (mb / s1["scan"])
    other = results[1]["seconds"] - sum(s1.values())  # pool start-up, manifest, moving into place
    shard = BOOKSCORPUS_MB / shard_mb_per_s if shard_mb_per_s else 0.0
    out = {
        "assumptions": {
            "bookscorpus_mb": BOOKSCORPUS_MB,
            "rate_mb_per_s_per_worker": rate,
            "efficiency_at_2_workers": eff,
            "bpe_sample_lines": SAMPLE_LINES,
            "measured_lines": lines,
        },
        "cores": {},
    }
    print(f"PROJECTION, not a measurement: BooksCorpus (~{BOOKSCORPUS_MB / 1000:.1f} GB) with `gpt1 prepare`.")
    print(
        f"  assumptions: parallel stages (words, encode) run at the 1-worker rates measured here "
        f"(words {rate['words']:.2f}, encode {rate['encode']:.2f} MB/s per worker) × N workers × the efficiency "
        f"measured at 2 workers (words {eff['words']:.2f}, encode {eff['encode']:.2f}; at most 1), held constant "
        f"up to N;"
    )
    print(
        f"  serial: scan at its measured rate ({mb / s1['scan']:.0f} MB/s), BPE learning on a {SAMPLE_LINES:,}-line "
        f"sample (measured {s1.get('learn BPE', 0.0):.1f} s on {lines:,} lines, scaled linearly: {learn:.0f} s), "
        + (
            f"shard writing in the main process ({shard:.0f} s at the measured rate; it overlaps encoding, so "
            f"encoding takes at least that long)"
            if shard
            else "shard writing not measured (--skip-stages)"
        )
        + f", other fixed costs {other:.1f} s; disk I/O and the main process's other work "
        f"assumed not to limit."
    )
    print(f"  {'cores':>6}{'scan s':>9}{'words s':>9}{'learn s':>9}{'encode s':>10}{'total s':>9}{'total min':>11}")
    for n in (16, 64):
        words = BOOKSCORPUS_MB / (rate["words"] * n * eff["words"])
        encode = max(BOOKSCORPUS_MB / (rate["encode"] * n * eff["encode"]), shard)
        total = scan + words + learn + encode + other
        out["cores"][n] = {"scan": scan, "words": words, "learn": learn, "encode": encode, "total": total}
        print(f"  {n:>6}{scan:>9.0f}{words:>9.0f}{learn:>9.0f}{encode:>10.0f}{total:>9.0f}{total / 60:>11.1f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="the shared data folder")
    ap.add_argument("--limit-mb", type=float, default=None, help="use only books up to this many MB")
    ap.add_argument("--vocab-size", type=int, default=40478, help="BPE vocabulary to learn")
    ap.add_argument("--skip-stages", action="store_true", help="skip ours stage by stage")
    ap.add_argument("--skip-released", action="store_true", help="skip the released pipeline")
    ap.add_argument("--skip-hf", action="store_true", help="skip Hugging Face tokenizers")
    ap.add_argument("--peak-seconds", type=float, default=2.0, help="time spent measuring each matmul peak")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()

    books = pick_books(args.data, args.limit_mb)
    if not books:
        sys.exit(f"no books under {args.data / 'books'}")
    from gptcli.tokenizers.text import strip_gutenberg, word_lines

    header, line = machine_header(args.peak_seconds)
    print(line)
    docs = [strip_gutenberg(b.read_text(encoding="utf-8-sig"))[0] for b in books]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    print(f"{len(books)} books, {mb:.2f} MB of text after Gutenberg stripping; every MB/s below is of that text\n")
    out: dict = {"books": len(books), "mb": mb, "args": vars(args)}
    lines = None
    if not args.skip_stages:
        rows, lines, info = our_stages(docs, mb, args)
        print_rows("ours, stage by stage (one process)", rows)
        out["ours"] = {"rows": rows, **info}
    if not args.skip_released:
        rows, info = released_stages(docs, mb, args.data / "openai-gpt-bpe")
        print_rows("released pipeline (one process)", rows)
        print(
            f"released loop and gptcli's encoder give identical ids: {info['identical_ids']} "
            f"({info['tokens']:,} tokens)\n"
        )
        out["released"] = {"rows": rows, **info}
    if not args.skip_hf:
        lines = lines if lines is not None else [x for d in docs for x in word_lines(d)]
        rows, info = hf_tokenizers(lines, mb, args.vocab_size)
        print_rows("Hugging Face tokenizers (one core, same word lines)", rows)
        out["hf_tokenizers"] = {"rows": rows, **info}
    del lines
    results = end_to_end(books, args.vocab_size)
    out["end_to_end"] = {"runs": results, **print_end_to_end(mb, results)}
    shard = next((r["mb_per_s"] for r in out.get("ours", {}).get("rows", []) if "shard" in r["stage"]), None)
    out["projection"] = projection(mb, results, shard)
    write_json(args.json, header, **out)


if __name__ == "__main__":
    main()
