"""Where each benchmark's data can be fetched from, and how it is written back in its official format.

The paper's datasets are on the Hugging Face Hub as parquet files (``nyu-mll/glue``, ``stanfordnlp/snli``,
``allenai/scitail``, ``ehovy/race``). :data:`SOURCES` says, per official task folder, which Hub files hold each
official file, how many rows the official release has (the check a download must pass) and how rows become the
official layout: GLUE's TSVs with their file names, headers and column order (columns the Hub lacks written
empty), SNLI 1.0's jsonl, SciTail 1.1's tsv_format, RACE's one JSON file per passage (details: docs/datasets.md).

Why the official layout rather than the Hub's: the loaders read one format whichever way the data arrived, so a
manual download and ``gpt1 fetch`` give the same examples. A tab or line break inside a text (which a TSV line
cannot hold) becomes a space and is counted. Story Cloze needs a request form (:data:`MANUAL`); DPRD and WSC273
are not on the Hub in their official form. Nothing here touches the network: :mod:`gptcli.interop.datasets`
downloads and calls :func:`write_file`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error


@dataclass(frozen=True)
class OfficialFile:
    """One file (or, for RACE, one folder of passage files) of a task's official layout."""

    path: str
    """Relative to the task folder, e.g. ``train.tsv`` or ``train/middle``."""
    config: str
    """The Hub dataset's config (its folder in the repo), e.g. ``rte``."""
    split: str
    """The Hub split holding its rows, e.g. ``validation_matched``."""
    rows: int
    """Rows (RACE: questions) in the official release — what a download must have."""
    columns: tuple[str, ...] = ()
    """TSV columns in the official order (GLUE, SciTail)."""
    header: bool = True
    """Whether the official file starts with a header row (not CoLA train/dev, not SciTail)."""
    bom: bool = False
    """Whether the official file starts with a UTF-8 byte order mark (MRPC train/dev)."""
    passages: int = 0
    """RACE: passage files in the official release (0: not checked)."""

    @property
    def hub_pattern(self) -> str:
        """The Hub files holding it (one or more shards), as a ``snapshot_download`` pattern."""
        return f"{self.config}/{self.split}-*.parquet"


@dataclass(frozen=True)
class Source:
    """How one official task folder is rebuilt from a Hub dataset."""

    folder: str
    repo: str
    format: str
    """``glue``, ``snli``, ``scitail`` or ``race``: which writer makes the files."""
    files: tuple[OfficialFile, ...]
    fields: dict[str, str] = field(default_factory=dict)
    """Official column → Hub column (GLUE); official columns not named here are written empty."""
    label: str = "label"
    """The official label column."""
    labels: tuple[str, ...] | None = None
    """Official label string of each Hub class id; None: a regression score (STS-B) or strings already."""


GLUE_REPO = "nyu-mll/glue"
NLI_HUB = (
    "entailment",
    "neutral",
    "contradiction",
)  # the Hub's class ids for MNLI and SNLI (GLUE's files order them differently)
MNLI_IDS = (
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
)
STSB = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")
MRPC = ("#1 ID", "#2 ID", "#1 String", "#2 String")


def _glue(
    folder: str,
    config: str,
    counts: tuple[int, int, int],
    columns: tuple[str, ...],
    test: tuple[str, ...],
    fields: dict[str, str],
    label: str,
    labels: tuple[str, ...] | None,
    **kw: Any,
) -> Source:
    """A GLUE task with ``train.tsv``, ``dev.tsv`` and ``test.tsv`` (``kw``: options of train/dev)."""
    train, dev, tst = counts
    files = (
        OfficialFile("train.tsv", config, "train", train, columns, **kw),
        OfficialFile("dev.tsv", config, "validation", dev, columns, **kw),
        OfficialFile("test.tsv", config, "test", tst, test),
    )
    return Source(folder, GLUE_REPO, "glue", files, {"index": "idx", **fields}, label, labels)


def _mnli() -> Source:
    train = (*MNLI_IDS, "label1", "gold_label")
    dev = (*MNLI_IDS, "label1", "label2", "label3", "label4", "label5", "gold_label")
    files = (
        OfficialFile("train.tsv", "mnli", "train", 392702, train),
        OfficialFile("dev_matched.tsv", "mnli", "validation_matched", 9815, dev),
        OfficialFile("dev_mismatched.tsv", "mnli", "validation_mismatched", 9832, dev),
        OfficialFile("test_matched.tsv", "mnli", "test_matched", 9796, MNLI_IDS),
        OfficialFile("test_mismatched.tsv", "mnli", "test_mismatched", 9847, MNLI_IDS),
    )
    return Source(
        "MNLI",
        GLUE_REPO,
        "glue",
        files,
        {"index": "idx", "sentence1": "premise", "sentence2": "hypothesis"},
        "gold_label",
        NLI_HUB,
    )


def _race() -> Source:
    counts = {
        "train": {"middle": (25421, 6409), "high": (62445, 18728)},
        "dev": {"middle": (1436, 368), "high": (3451, 1021)},
        "test": {"middle": (1436, 362), "high": (3498, 1045)},
    }
    hub_split = {"train": "train", "dev": "validation", "test": "test"}
    files = tuple(
        OfficialFile(f"{s}/{lv}", lv, hub_split[s], q, passages=p)
        for s, levels in counts.items()
        for lv, (q, p) in levels.items()
    )
    return Source("RACE", "ehovy/race", "race", files)


def _sources() -> dict[str, Source]:
    """Every fetchable folder. Row counts are the official releases' (GLUE paper Table 1 and the GLUE files; SNLI
    1.0; SciTail 1.1's tsv_format; RACE paper Table 2 — questions and passages per level)."""
    binary, nli2 = ("0", "1"), ("entailment", "not_entailment")
    pair = {"sentence1": "sentence1", "sentence2": "sentence2"}
    # fmt: off
    sources = [
        _glue("CoLA", "cola", (8551, 1043, 1063), ("source", "label", "star", "sentence"), ("index", "sentence"),
              {"sentence": "sentence"}, "label", binary, header=False),
        _glue("SST-2", "sst2", (67349, 872, 1821), ("sentence", "label"), ("index", "sentence"),
              {"sentence": "sentence"}, "label", binary),
        _glue("MRPC", "mrpc", (3668, 408, 1725), ("Quality", *MRPC), ("index", *MRPC),
              {"#1 String": "sentence1", "#2 String": "sentence2"}, "Quality", binary, bom=True),
        _glue("QQP", "qqp", (363846, 40430, 390965), ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
              ("id", "question1", "question2"), {"id": "idx", "question1": "question1", "question2": "question2"},
              "is_duplicate", binary),
        _glue("STS-B", "stsb", (5749, 1500, 1379), (*STSB, "score"), STSB, pair, "score", None),
        _mnli(),
        _glue("QNLI", "qnli", (104743, 5463, 5463), ("index", "question", "sentence", "label"),
              ("index", "question", "sentence"), {"question": "question", "sentence": "sentence"}, "label", nli2),
        _glue("RTE", "rte", (2490, 277, 3000), ("index", "sentence1", "sentence2", "label"),
              ("index", "sentence1", "sentence2"), pair, "label", nli2),
        _glue("WNLI", "wnli", (635, 71, 146), ("index", "sentence1", "sentence2", "label"),
              ("index", "sentence1", "sentence2"), pair, "label", binary),
        Source("snli_1.0", "stanfordnlp/snli", "snli", tuple(
            OfficialFile(f"snli_1.0_{s}.jsonl", "plain_text", h, n)
            for s, h, n in (("train", "train", 550152), ("dev", "validation", 10000), ("test", "test", 10000))),
            labels=NLI_HUB),
        Source("SciTailV1.1", "allenai/scitail", "scitail", tuple(
            OfficialFile(f"tsv_format/scitail_1.0_{s}.tsv", "tsv_format", h, n, ("premise", "hypothesis", "label"),
                         header=False)
            for s, h, n in (("train", "train", 23097), ("dev", "validation", 1304), ("test", "test", 2126)))),
        _race(),
    ]
    # fmt: on
    return {s.folder: s for s in sources}


SOURCES: dict[str, Source] = _sources()
"""Fetchable task folders (the registry's ``Task.folder``) → their Hub source."""

MANUAL: dict[str, str] = {
    "storycloze": "Story Cloze is given out through a request form, not on the Hub: fill it in at "
    "https://cs.rochester.edu/nlp/rocstories/ and put the spring 2016 val and test CSVs in "
    "<data root>/storycloze/",
}
"""Folders a person must ask for, and how (the others that cannot be fetched name their source in the task)."""


# --------------------------------------------------------------------------------------------------- writing
@dataclass
class Written:
    """What :func:`write_file` wrote: rows (RACE: questions), passages (RACE) and texts whose tabs or line
    breaks became spaces."""

    rows: int = 0
    passages: int = 0
    cleaned: int = 0


def write_file(source: Source, spec: OfficialFile, rows: list[dict[str, Any]], folder: Path) -> Written:
    """Write ``rows`` (the Hub split's records, in order) as ``spec``'s official file under ``folder`` after
    checking their number against the official release; raises :class:`GPT1Error` when it differs."""
    check_count(source, spec, len(rows), "rows" if source.format != "race" else "questions")
    out = folder / spec.path
    out.parent.mkdir(parents=True, exist_ok=True)
    if source.format == "race":
        return _write_race(spec, rows, out)
    lines, done = (_snli_lines if source.format == "snli" else _tsv_lines)(source, spec, rows)
    prefix = ("\ufeff" if spec.bom else "") + ("\t".join(spec.columns) + "\n" if spec.header and spec.columns else "")
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(prefix)
        for line in lines:
            f.write(line + "\n")
    return done


def check_count(source: Source, spec: OfficialFile, n: int, what: str, expected: int | None = None) -> None:
    """The download's size against the official release's: a truncated or changed file is an error."""
    want = spec.rows if expected is None else expected
    if n != want:
        raise GPT1Error(
            f"{source.repo} ({spec.config}/{spec.split}) has {n:,} {what} where the official "
            f"{source.folder}/{spec.path} has {want:,}: a truncated or changed download; nothing was "
            "written (try again, or pin a --revision)"
        )


def _clean(text: Any, done: Written) -> str:
    """A text cell: a TSV line cannot hold a tab or line break, so each becomes a space (counted)."""
    s = "" if text is None else str(text)
    if "\t" in s or "\n" in s or "\r" in s:
        done.cleaned += 1
        s = s.replace("\r\n", " ").replace("\t", " ").replace("\n", " ").replace("\r", " ")
    return s


def _label(source: Source, value: Any, where: str) -> str:
    """A Hub label as the official file writes it."""
    if source.labels is None:
        if isinstance(value, float):
            import numpy as np

            return str(np.float32(value))  # the shortest text that is the Hub's float32 (3.8, not 3.799999952)
        return str(value)
    if isinstance(value, str) and value in source.labels:
        return value
    try:
        return source.labels[int(value)]
    except (IndexError, TypeError, ValueError):
        raise GPT1Error(f"{source.repo}: label {value!r} in {where} is not one of {', '.join(source.labels)}") from None


def _tsv_lines(source: Source, spec: OfficialFile, rows: list[dict[str, Any]]) -> tuple[Iterable[str], Written]:
    done = Written(rows=len(rows))
    hub_cols = source.fields if source.format == "glue" else {c: c for c in spec.columns}
    _require(source, spec, rows, [h for c, h in hub_cols.items() if c in spec.columns and c != source.label])

    def line(r: dict[str, Any]) -> str:
        cells = []
        for c in spec.columns:
            if c == source.label:
                cells.append(_label(source, r.get("label"), spec.path))
            elif c in hub_cols:
                cells.append(_clean(r.get(hub_cols[c]), done))
            else:
                cells.append("")  # not in the Hub's copy
        return "\t".join(cells)

    return (line(r) for r in rows), done


def _snli_lines(source: Source, spec: OfficialFile, rows: list[dict[str, Any]]) -> tuple[Iterable[str], Written]:
    _require(source, spec, rows, ["premise", "hypothesis", "label"])

    def line(r: dict[str, Any]) -> str:
        gold = "-" if int(r["label"]) < 0 else _label(source, r["label"], spec.path)
        return json.dumps(
            {"gold_label": gold, "sentence1": r["premise"], "sentence2": r["hypothesis"]}, ensure_ascii=False
        )

    return (line(r) for r in rows), Written(rows=len(rows))


def _write_race(spec: OfficialFile, rows: list[dict[str, Any]], out: Path) -> Written:
    """One JSON file per passage, named as in the release (``high123.txt`` → ``high/123.txt``)."""
    source = SOURCES["RACE"]
    _require(source, spec, rows, ["example_id", "article", "question", "options", "answer"])
    passages: dict[str, dict[str, Any]] = {}
    for r in rows:
        p = passages.setdefault(
            r["example_id"],
            {"answers": [], "options": [], "questions": [], "article": r["article"], "id": r["example_id"]},
        )
        p["answers"].append(r["answer"])
        p["options"].append(list(r["options"]))
        p["questions"].append(r["question"])
    if spec.passages:
        check_count(source, spec, len(passages), "passages", spec.passages)
    level = out.name
    out.mkdir(parents=True, exist_ok=True)
    for pid, obj in passages.items():
        name = pid[len(level) :] if pid.startswith(level) else pid
        if not name.endswith(".txt"):
            name += ".txt"
        (out / Path(name).name).write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return Written(rows=len(rows), passages=len(passages))


def _require(source: Source, spec: OfficialFile, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """The Hub's columns must be the ones this table knows; a changed dataset is an error, not wrong files."""
    if not rows:
        return
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise GPT1Error(
            f"{source.repo} ({spec.config}/{spec.split}) has columns {', '.join(rows[0])}, not "
            f"{', '.join(missing)}: the Hub's copy changed (pin an older --revision, or fetch the "
            "official distribution)"
        )


__all__ = ["MANUAL", "SOURCES", "OfficialFile", "Source", "Written", "check_count", "write_file"]
