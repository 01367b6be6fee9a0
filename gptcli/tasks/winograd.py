"""Winograd schemas: readers for DPRD (Rahman & Ng 2012) and WSC273 (Davis et al., XML), and the substitution.

Both become :class:`Schema` objects: the sentence split around the pronoun to resolve (``before``, ``pronoun``,
``after``), the two candidate referents and the index of the correct one. The zero-shot heuristic (paper §5)
replaces the pronoun by each candidate and compares the language model's average log-probability of ``after``.
Possessives (his, its, their, whose; ``her`` before a noun) become the candidate with ``'s``, as Trinh & Le (2018)
do; candidates keep their capitalisation, since every tokenizer here lowercases.

This module is also the registry family of the two data sets: tasks ``dprd`` (splits ``train``/``test``) and
``wsc`` (split ``test``), of kind ``pronoun_resolution``, which has no fine-tuning transformation because the paper
scores them zero-shot only. Through the registry a schema is an :class:`~gptcli.tasks.base.Example` with
``texts = (before, pronoun, after)`` and the candidates as ``choices``; :meth:`Schema.of` turns it back. A
malformed block always stops with its ``path:line:``: each schema is one half of a twin pair, so none is skipped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gptcli.errors import DataError
from gptcli.tasks.base import Example, ReadOptions, Split, Task
from gptcli.tasks.registry import register

POSSESSIVE = {"his", "its", "their", "whose", "hers", "theirs"}
# Words after "her" that show it is an object ("took her to …", "gave her a present"), not a determiner.
_OBJECT_FOLLOWERS = {
    "to",
    "in",
    "at",
    "on",
    "for",
    "with",
    "from",
    "by",
    "about",
    "into",
    "onto",
    "and",
    "but",
    "or",
    "so",
    "because",
    "that",
    "as",
    "up",
    "down",
    "out",
    "off",
    "over",
    "a",
    "an",
    "the",
    "this",
    "again",
    "away",
    "too",
    "when",
    "if",
    "since",
    "before",
    "after",
    "while",
    "until",
    "than",
    "what",
    "how",
    "why",
    "not",
    "anything",
    "something",
    "nothing",
    "everything",
    "some",
    "any",
    "very",
    "much",
    "all",
    "first",
}


@dataclass
class Schema:
    """One Winograd sentence with its pronoun located."""

    before: str
    pronoun: str
    after: str
    candidates: tuple[str, str]
    label: int
    """Index of the correct candidate in ``candidates``."""
    source: str = ""
    """``path:line`` of the schema."""
    uid: str = ""
    """The example's id (its index in the file), as in every task's predictions."""

    @classmethod
    def of(cls, example: Example) -> Schema:
        """The schema an :class:`Example` of task ``dprd``/``wsc`` holds (see :func:`as_example`)."""
        before, pronoun, after = example.texts
        first, second = example.choices
        label = int(example.label)  # type: ignore[arg-type]
        return cls(before, pronoun, after, (first, second), label, example.source, example.uid)

    @property
    def sentence(self) -> str:
        return f"{self.before}{self.pronoun}{self.after}"

    def substitute(self, candidate: int) -> tuple[str, str]:
        """``(before + candidate, after)``: the context and the continuation scored for one candidate."""
        return self.before + replacement(self.pronoun, self.candidates[candidate], self.after), self.after


def is_possessive(pronoun: str, after: str) -> bool:
    """Whether ``pronoun`` (followed by the text ``after``) is a possessive determiner."""
    p = pronoun.strip().lower()
    if p in POSSESSIVE:
        return True
    if p == "her":
        m = re.match(r"\s*([A-Za-z']+)", after)
        return m is not None and m.group(1).lower() not in _OBJECT_FOLLOWERS
    return False


def replacement(pronoun: str, candidate: str, after: str) -> str:
    """The text that replaces ``pronoun``: the candidate, with ``'s`` for a possessive."""
    c = candidate.strip()
    return c + "'s" if is_possessive(pronoun, after) else c


def _word(text: str) -> re.Pattern:
    # Whole word, case-insensitive; (?<!\w)/(?!\w) instead of \b so multi-word or punctuated pronouns work too.
    return re.compile(r"(?<!\w)" + re.escape(text.strip()) + r"(?!\w)", re.IGNORECASE)


def locate(sentence: str, pronoun: str, candidates: tuple[str, ...]) -> tuple[int, int] | None:
    """Span of the pronoun occurrence to substitute, or None if absent.

    The pronoun is matched as a whole word, case-insensitively. When it occurs more than once ("Ryan won … against Tom
    because he feels he was …"), the first occurrence after the later-mentioned candidate is taken, since the
    referring pronoun follows both antecedents in every such sentence of DPRD; when a candidate is not found in the
    sentence, the first occurrence."""
    hits = [m.span() for m in _word(pronoun).finditer(sentence)]
    if not hits:
        return None
    if len(hits) == 1:
        return hits[0]
    ends = []
    for c in candidates:
        m = _word(c).search(sentence)
        if m is None:
            return hits[0]
        ends.append(m.end())
    after_both = [h for h in hits if h[0] >= max(ends)]
    return after_both[0] if after_both else hits[0]


def read_dprd(path: str | Path) -> list[Schema]:
    """Rahman & Ng's format: blocks of sentence, pronoun, ``cand1,cand2``, correct candidate, then a blank line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise DataError(p, f"not UTF-8 text ({e.reason})") from None
    out: list[Schema] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        start = i + 1  # 1-based line of the block's sentence
        block = []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i].strip())
            i += 1
        if len(block) != 4:
            raise DataError(
                p, f"expected a block of 4 lines (sentence, pronoun, candidates, answer), got {len(block)}", start
            )
        sentence, pronoun, cands, answer = block
        parts = [c.strip() for c in cands.split(",")]
        if len(parts) != 2 or not all(parts):
            raise DataError(p, f"expected two comma-separated candidates, got {cands!r}", start + 2)
        # Compare case-insensitively: the answer line repeats a candidate, sometimes with other capitalisation.
        lower = [c.lower() for c in parts]
        if answer.lower() not in lower:
            raise DataError(p, f"answer {answer!r} is not one of the candidates {parts}", start + 3)
        span = locate(sentence, pronoun, tuple(parts))
        if span is None:
            raise DataError(p, f"pronoun {pronoun!r} does not occur in the sentence", start + 1)
        a, b = span
        out.append(
            Schema(
                sentence[:a],
                sentence[a:b],
                sentence[b:],
                (parts[0], parts[1]),
                lower.index(answer.lower()),
                f"{p}:{start}",
                str(len(out)),
            )
        )
    if not out:
        raise DataError(p, "no schemas found")
    return out


def _line_of(text: str, needle: str, start: int) -> tuple[int, int]:
    at = text.find(needle, start)
    return (text.count("\n", 0, at) + 1 if at >= 0 else 0), max(at, start)


def read_wsc(path: str | Path) -> list[Schema]:
    """WSC273's ``WSCollection.xml``: ``<txt1>``/``<pron>``/``<txt2>``, two ``<answer>``s, ``<correctAnswer>`` A/B."""
    p = Path(path)
    raw = p.read_bytes()
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as e:
        raise DataError(p, f"not valid XML: {e.msg}", e.position[0]) from None
    text = raw.decode("latin-1")  # only used to report line numbers
    out: list[Schema] = []
    cursor = 0
    for n, schema in enumerate(root.iter("schema"), 1):
        line, cursor = _line_of(text, "<schema>", cursor)
        cursor += 1
        need = partial(_need, schema, p=p, n=n, line=line)
        txt1, pron, txt2 = need("text/txt1"), need("text/pron"), need("text/txt2")
        answers = [" ".join((a.text or "").split()) for a in schema.findall("answers/answer")]
        if len(answers) != 2 or not all(answers):
            raise DataError(p, f"schema {n} must have exactly two non-empty <answer>s, got {len(answers)}", line)
        correct = need("correctAnswer").rstrip(".").strip().upper()
        if correct not in ("A", "B"):
            raise DataError(p, f"schema {n}: <correctAnswer> must be A or B, got {correct!r}", line)
        if not pron:
            raise DataError(p, f"schema {n}: empty <pron>", line)
        # Rebuild the sentence with single spaces; the XML splits it around the pronoun explicitly.
        before = (txt1 + " ") if txt1 else ""
        after = txt2 if txt2[:1] in (".", ",", "'", "?", "!", ";", ":") or not txt2 else " " + txt2
        out.append(
            Schema(before, pron, after, (answers[0], answers[1]), "AB".index(correct), f"{p}:{line}", str(len(out)))
        )
    if not out:
        raise DataError(p, "no <schema> elements found")
    return out


def _need(schema: ET.Element, xpath: str, *, p: Path, n: int, line: int) -> str:
    """The whitespace-normalised text at ``xpath`` of schema ``n`` (at ``line`` of ``p``); missing is an error."""
    el = schema.find(xpath)
    if el is None:
        raise DataError(p, f"schema {n} has no <{xpath.split('/')[-1]}>", line)
    return " ".join((el.text or "").split())


# --- the registry family -------------------------------------------------------------------------------------------


def as_example(schema: Schema, index: int) -> Example:
    """A schema as a registry :class:`Example`: ``texts = (before, pronoun, after)``, the candidates as choices."""
    return Example(
        texts=(schema.before, schema.pronoun, schema.after),
        label=schema.label,
        choices=schema.candidates,
        uid=str(index),
        source=schema.source,
    )


def read_dprd_examples(path: Path, opts: ReadOptions) -> list[Example]:
    return [as_example(s, k) for k, s in enumerate(read_dprd(path))]


def read_wsc_examples(path: Path, opts: ReadOptions) -> list[Example]:
    return [as_example(s, k) for k, s in enumerate(read_wsc(path))]


DPRD_FILES = {"train": "train.c.txt", "test": "test.c.txt"}
WSC_FILE = "WSCollection.xml"

register(
    Task(
        name="dprd",
        title="Definite Pronoun Resolution (Rahman & Ng 2012)",
        kind="pronoun_resolution",
        labels=("A", "B"),
        metric="accuracy",
        folder="dprd",
        splits={split: Split((name,), read_dprd_examples) for split, name in DPRD_FILES.items()},
        source_url="http://www.hlt.utdallas.edu/~vince/data/emnlp12/ (train.c.txt, test.c.txt)",
        n_choices=2,
        notes="Zero-shot only (paper §5, Figure 2). 1,322 train / 564 test sentences in twin pairs; label A/B = the "
        "first/second candidate. Zero-shot trains on nothing, so the train file is an unseen evaluation set "
        "too (scored when test.c.txt is absent).",
    )
)

register(
    Task(
        name="wsc",
        title="Winograd Schema Challenge (WSC273)",
        kind="pronoun_resolution",
        labels=("A", "B"),
        metric="accuracy",
        folder="wsc",
        splits={"test": Split((WSC_FILE,), read_wsc_examples)},
        source_url="https://cs.nyu.edu/~davise/papers/WinogradSchemas/WS.html (WSCollection.xml)",
        n_choices=2,
        notes="Zero-shot only (paper §5, Figure 2). The 273-schema collection; the XML marks the pronoun, and "
        "<correctAnswer> A/B is the label.",
    )
)
