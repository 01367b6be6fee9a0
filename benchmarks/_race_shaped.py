"""A RACE-shaped evaluation set for the throughput benchmarks: RACE has no real file in ``../shared/data``.

Written in RACE's official layout (``RACE/dev/{middle,high}/<n>.txt``, one JSON object per file: ``article``,
``questions``, ``options`` (4 per question), ``answers`` (letters), ``id``), so ``gptcli.tasks.race`` reads it as it
reads the real files. The text is real English from the Gutenberg books in ``../shared/data/books``; only its
*shape* follows RACE, from the averages in Table 1 of the RACE paper (Lai et al., 2017): passages of 231 words
(middle school) and 353 (high school), questions of 9.0 / 10.4 words, options of 3.9 / 5.8 words, about 3.5
questions per passage, the dev split's 1,436 middle and 3,451 high questions in that proportion. Lengths vary
around those means (±30 %, uniform); labels are uniform over A–D. Speed depends on the lengths, not the words, and
accuracy on this set means nothing (the answers are random).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SHAPE = {"middle": (231, 9.0, 3.9), "high": (353, 10.4, 5.8)}
"""Level → mean words of (passage, question, option), RACE paper Table 1."""
HIGH_SHARE = 3451 / (1436 + 3451)
"""The dev split's share of high-school questions."""


def _words(books: Path) -> list[str]:
    text = " ".join(
        p.read_text(encoding="utf-8-sig", errors="replace")[20000:220000] for p in sorted(books.glob("*.txt"))[:8]
    )
    return text.split()


def _span(words: list[str], mean: float, rng: random.Random) -> str:
    n = max(1, round(mean * rng.uniform(0.7, 1.3)))
    at = rng.randrange(len(words) - n)
    return " ".join(words[at : at + n])


def write_race_shaped(root: Path, books: Path, questions: int, seed: int = 0) -> Path:
    """``root/RACE`` holding a dev split of about ``questions`` RACE-shaped questions (see the module docstring)."""
    rng = random.Random(seed)
    words = _words(books)
    made = {"middle": 0, "high": 0}
    total = 0
    while total < questions:
        level = "high" if rng.random() < HIGH_SHARE else "middle"
        passage, q_len, o_len = SHAPE[level]
        k = min(questions - total, rng.choice((3, 3, 4, 4)))
        obj = {
            "answers": [rng.choice("ABCD") for _ in range(k)],
            "options": [[_span(words, o_len, rng) for _ in range(4)] for _ in range(k)],
            "questions": [_span(words, q_len, rng) + "?" for _ in range(k)],
            "article": _span(words, passage, rng),
        }
        made[level] += 1
        obj["id"] = f"{level}{made[level]}.txt"
        folder = root / "RACE" / "dev" / level
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{made[level]}.txt").write_text(json.dumps(obj))
        total += k
    for level in SHAPE:  # the reader expects both levels' folders
        (root / "RACE" / "dev" / level).mkdir(parents=True, exist_ok=True)
    return root / "RACE"
