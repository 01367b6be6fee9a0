"""RACE: ``RACE/{train,dev,test}/{middle,high}/<n>.txt``, each file one JSON object.

An object holds ``article``, ``questions`` (list), ``options`` (list of 4-answer lists), ``answers`` (letters
``A``–``D``) and ``id`` (e.g. ``middle12.txt``). Each question is one :class:`Example`:
``texts = (article, question)``, ``choices`` = its 4 options, ``label`` = index of the right letter,
``uid = "<id>-<question index>"``, ``extra["level"]`` = ``middle``/``high``. A problem in one question rejects
that question; a file that is not such an object is rejected whole (``path:1``).
``race`` reads both levels; ``race-m``/``race-h`` read one, so a model fine-tuned on ``race`` is evaluated
on each for the paper's RACE-m / RACE-h columns.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptcli.tasks.base import Example, ReadOptions, Split, Task
from gptcli.tasks.registry import register
from gptcli.tasks.rows import BadRow, label_of, nonempty, reject

LETTERS = ("A", "B", "C", "D")


def _file_order(p: Path):
    return (0, int(p.stem), p.name) if p.stem.isdigit() else (1, 0, p.name)


def _read_object(path: Path) -> dict:
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadRow(f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRow(f"not a JSON object ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(obj, dict):
        raise BadRow("not a JSON object")
    for key, typ in (("article", str), ("questions", list), ("options", list), ("answers", list)):
        if key not in obj:
            raise BadRow(f"missing field {key!r}")
        if not isinstance(obj[key], typ):
            raise BadRow(f"field {key!r} is not a {'string' if typ is str else 'list'}")
    nonempty(obj["article"], "article")
    nq, no, na = len(obj["questions"]), len(obj["options"]), len(obj["answers"])
    if not nq == no == na:
        raise BadRow(f"{nq} questions, {no} option lists and {na} answers (must be equal)")
    return obj


def read_race_file(path: Path, opts: ReadOptions, level: str) -> list[Example]:
    try:
        obj = _read_object(path)
    except BadRow as e:
        reject(path, 1, str(e), opts)
        return []
    rid = str(obj.get("id", f"{level}{path.name}"))
    out: list[Example] = []
    for qi, (q, opts_q, ans) in enumerate(zip(obj["questions"], obj["options"], obj["answers"])):
        try:
            if not isinstance(q, str):
                raise BadRow("question is not a string")
            nonempty(q, "question")
            if not isinstance(opts_q, list) or len(opts_q) != 4:
                n = len(opts_q) if isinstance(opts_q, list) else "no"
                raise BadRow(f"{n} options (expected 4)")
            if not all(isinstance(o, str) for o in opts_q):
                raise BadRow("an option is not a string")
            choices = tuple(nonempty(o, f"option {LETTERS[i]}") for i, o in enumerate(opts_q))
            label = label_of(ans if isinstance(ans, str) else repr(ans), LETTERS, "answer")
        except BadRow as e:
            reject(path, 1, f"question {qi}: {e}", opts)
            continue
        out.append(
            Example(
                texts=(obj["article"], q),
                choices=choices,
                label=label,
                uid=f"{rid}-{qi}",
                source=f"{path}:1",
                extra={"level": level, "question": qi},
            )
        )
    return out


def read_race_dir(path: Path, opts: ReadOptions) -> list[Example]:
    """All ``*.txt`` files of one ``<split>/<level>`` folder, in numeric file order."""
    level = path.name
    out: list[Example] = []
    for f in sorted(path.glob("*.txt"), key=_file_order):
        out.extend(read_race_file(f, opts, level))
    return out


URL = "https://www.cs.cmu.edu/~glai1/data/race/ (RACE.tar.gz, by request form)"
NOTES = (
    "Truncation (ours; the paper's is unpublished; done by fine-tuning): question and answer are kept "
    "whole and the article keeps its head, so that <s> article question $ answer <e> fits the context. "
    "Paper score is the test set. "
)


def _race(name: str, title: str, levels: tuple[str, ...], paper: float, note: str) -> None:
    register(
        Task(
            name=name,
            title=title,
            kind="multiple_choice",
            labels=LETTERS,
            metric="accuracy",
            folder="RACE",
            splits={s: Split(tuple(f"{s}/{lv}" for lv in levels), read_race_dir) for s in ("train", "dev", "test")},
            source_url=URL,
            paper_score=paper,
            n_choices=4,
            notes=NOTES + note,
        )
    )


_race(
    "race",
    "RACE (all)",
    ("middle", "high"),
    59.0,
    "Reads middle and high; fine-tune here, then evaluate on race-m and race-h.",
)
_race("race-m", "RACE middle school", ("middle",), 62.9, "Middle-school questions only.")
_race("race-h", "RACE high school", ("high",), 57.4, "High-school questions only.")
