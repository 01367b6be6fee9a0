"""Throughput of `gpt1 prepare`, stage by stage and end to end, on the Gutenberg books in ../shared/data/books.

Stages, each timed alone on one core: clean (ftfy + released standardization), spaCy words, BPE encode
(sentencepiece, after learning the vocabulary), shard write (Arrow IPC + sha256). Then the whole pipeline
(`gptcli.data.prepare.prepare`) with 1 and 2 workers, with its own per-stage times, so the speed-up of the parallel
stages is a ratio measured in the same run. MB are 10^6 bytes of input text (after Gutenberg stripping).

    python benchmarks/prepare_throughput.py                 # all 45 MB, 40,478-id vocabulary
    python benchmarks/prepare_throughput.py --limit-mb 5 --vocab-size 8000

The machine is shared: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gptcli.data.prepare import PrepareConfig, prepare  # noqa: E402
from gptcli.progress import Progress  # noqa: E402


def _cpu() -> float:
    """User + system CPU seconds of this process and its finished children (the pool's workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="the shared data folder")
    ap.add_argument("--limit-mb", type=float, default=None, help="use only books up to this many MB")
    ap.add_argument("--vocab-size", type=int, default=40478, help="BPE vocabulary to learn")
    ap.add_argument("--skip-stages", action="store_true", help="only the end-to-end runs")
    args = ap.parse_args()

    books = pick_books(args.data, args.limit_mb)
    if not books:
        sys.exit(f"no books under {args.data / 'books'}")
    from gptcli.tokenizers.text import clean, spacy_tokenizer, strip_gutenberg, word_lines

    docs = [strip_gutenberg(b.read_text(encoding="utf-8-sig"))[0] for b in books]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    print(f"{len(books)} books, {mb:.1f} MB of text after Gutenberg stripping; cores: {os.cpu_count()}; "
          f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    print(f"load average at start: {os.getloadavg()[0]:.1f} (on a shared machine other jobs take CPU; with load "
          f"above the core count, absolute figures and even the worker speed-up are mostly contention)\n")

    rows = []
    if not args.skip_stages:
        import numpy as np

        from gptcli.data.shards import write_shard
        from gptcli.tokenizers.learned import LearnedBPETokenizer

        spacy_tokenizer()  # load outside the timing
        t = time.perf_counter()
        cleaned = [clean(d) for d in docs]
        rows.append(("clean (ftfy + standardize)", time.perf_counter() - t))
        nlp = spacy_tokenizer()
        t = time.perf_counter()
        for c in cleaned:
            nlp(c)
        rows.append(("spaCy words", time.perf_counter() - t))
        del cleaned
        lines = [line for d in docs for line in word_lines(d)]
        t = time.perf_counter()
        tok = LearnedBPETokenizer.train(lines, vocab_size=args.vocab_size)
        learn_s = time.perf_counter() - t
        t = time.perf_counter()
        ids = tok.encode_lines(lines)
        rows.append(("BPE encode", time.perf_counter() - t))
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            write_shard(Path(tmp) / "s.arrow", np.array_split(ids, len(docs)), np.dtype(np.uint16))
            rows.append(("shard write (+sha256)", time.perf_counter() - t))
        print(f"{'stage (1 core)':<28}{'seconds':>9}{'MB/s':>9}")
        for name, s in rows:
            print(f"{name:<28}{s:>9.2f}{mb / s:>9.2f}")
        print(f"{'BPE learning (' + str(args.vocab_size) + ' ids)':<28}{learn_s:>9.2f}{'':>9}  "
              f"({len(lines):,} lines, {len(ids) / 1e6:.2f}M tokens)")
        slow = min(rows, key=lambda r: mb / r[1])
        print(f"slowest stage: {slow[0]}\n")

    spacy_tokenizer()  # both runs find spaCy loaded (the pool's workers inherit it when forked)
    results = {}
    for workers in (1, 2):
        tmp = Path(tempfile.mkdtemp(prefix="gpt1-bench-"))
        try:
            timer = Timer()
            cfg = PrepareConfig(
                inputs=[str(b) for b in books], out=tmp / "corpus", vocab_size=args.vocab_size,
                strip_gutenberg=True, workers=workers,
            )
            cpu0 = _cpu()
            t = time.perf_counter()
            res = prepare(cfg, progress=timer)
            total = time.perf_counter() - t
            cpu = _cpu() - cpu0
            results[workers] = (total, timer.times, [s["sha256"] for s in res.manifest["shards"]], cpu)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'end to end':<14}{'total s':>9}{'MB/s':>8}{'CPU s':>8}   stage seconds")
    for w, (total, times, _, cpu) in results.items():
        st = "  ".join(f"{k} {v:.1f}" for k, v in times.items())
        print(f"{str(w) + ' worker' + ('s' if w > 1 else ''):<14}{total:>9.1f}{mb / total:>8.2f}{cpu:>8.1f}   {st}")
    (t1, s1, h1, c1), (t2, s2, h2, c2) = results[1], results[2]
    print(f"CPU time with 2 workers / 1 worker: {c2 / c1:.2f} (the cost of parallelism, robust to other jobs; "
          f"wall-clock ratios below need an idle machine)")
    print(f"\nspeed-up 2 vs 1 workers: words {s1['words'] / s2['words']:.2f}x, "
          f"encode {s1['encode'] / s2['encode']:.2f}x, end to end {t1 / t2:.2f}x "
          f"(aim: >= 1.8x for encoding); identical shards: {h1 == h2}")
    print(f"whole run with 2 workers: {t2:.0f} s (aim: < 300 s for all 45 MB with a 40k vocabulary); "
          f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
