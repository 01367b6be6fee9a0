"""GLUE: SST-2, CoLA, MRPC, QQP, STS-B, MNLI (matched / mismatched), QNLI, RTE, WNLI.

Files as GLUE's ``download_glue_data.py`` writes them (``glue_data/<TASK>/{train,dev,test}.tsv``; MNLI
``dev_matched.tsv`` etc.). Columns are found by header name, so MNLI's 12 (train) / 16 (dev) / 10 (test)
columns and STS-B's 10 need no positional guessing. Only CoLA's train/dev have no header
(``source, label, star, sentence``). A file whose header lacks the label column but has the id column
(``index``, QQP ``id``) is an unlabeled test file: its examples have ``label=None`` and ``uid`` from that column.
Label strings and their order are GLUE's own (what the submission server expects).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gptcli.errors import DataError
from gptcli.tasks.base import Example, Kind, Reader, ReadOptions, Split, Task
from gptcli.tasks.registry import register
from gptcli.tasks.rows import (
    WRONG_FILE,
    BadRow,
    advised,
    check_columns,
    column_index,
    iter_tsv,
    label_of,
    nonempty,
    reject,
    score_of,
)

GLUE_URL = "https://gluebenchmark.com/tasks (download_glue_data.py from github.com/nyu-mll/GLUE-baselines)"
GLUE_PARENTS = ("glue_data", "glue")  # download_glue_data.py writes glue_data/<TASK>/


@dataclass(frozen=True)
class GlueFormat:
    """Where a GLUE task's fields are, by header name."""

    texts: tuple[str, ...]
    """Text columns in the order of ``Example.texts``."""
    label: str
    """Label column of train/dev files (absent from test files)."""
    labels: tuple[str, ...]
    """Allowed label strings; empty for the regression score."""
    id: str = "index"
    """Id column (always in test files, sometimes in train/dev)."""
    ruled_out: tuple[str, ...] = ()
    """Label values the dataset's own rule leaves out (``-`` = no annotator consensus), counted, not errors."""
    extra: tuple[str, ...] = ()
    """Columns kept in ``Example.extra`` when present."""


def read_glue_tsv(path: Path, opts: ReadOptions, fmt: GlueFormat) -> list[Example]:
    """Read one GLUE TSV file that has a header row (every GLUE file but CoLA train/dev)."""
    rows = iter_tsv(path, opts)
    first = next(rows, None)
    if first is None:
        raise DataError(path, advised("empty file (expected a header line)", WRONG_FILE), 1)
    hline, header = first
    return _read_with_header(path, opts, fmt, hline, header, rows)


def _read_with_header(
    path: Path, opts: ReadOptions, fmt: GlueFormat, hline: int, header: list[str], rows: Iterator[tuple[int, list[str]]]
) -> list[Example]:
    col = column_index(path, header, hline)
    missing = [t for t in fmt.texts if t not in col]
    if missing:
        raise DataError(
            path, advised(f"header lacks column {missing[0]!r} (found: {', '.join(header)})", WRONG_FILE), hline
        )
    labeled = fmt.label in col
    if not labeled and fmt.id not in col:
        raise DataError(
            path,
            advised(
                f"header has neither the label column {fmt.label!r} nor the id column "
                f"{fmt.id!r} of an unlabeled test file (found: {', '.join(header)})",
                WRONG_FILE,
            ),
            hline,
        )
    n_cols = len(header)
    out: list[Example] = []
    for k, (n, cols) in enumerate(rows):
        try:
            check_columns(cols, n_cols)
            texts = tuple(nonempty(cols[col[t]], t) for t in fmt.texts)
            label: int | float | None = None
            if labeled:
                raw = cols[col[fmt.label]]
                if raw in fmt.ruled_out:
                    opts.excluded.append(f"{path}:{n}: {fmt.label} {raw!r} (no consensus label)")
                    continue
                label = label_of(raw, fmt.labels, fmt.label) if fmt.labels else score_of(raw, 0.0, 5.0, fmt.label)
            uid = cols[col[fmt.id]] if fmt.id in col else str(k)
        except BadRow as e:
            reject(path, n, str(e), opts)
            continue
        extra = {c: cols[col[c]] for c in fmt.extra if c in col}
        out.append(Example(texts=texts, label=label, uid=uid, source=f"{path}:{n}", extra=extra))
    return out


COLA_TEST_HEADER = ["index", "sentence"]


def read_cola(path: Path, opts: ReadOptions) -> list[Example]:
    """CoLA train/dev: no header, ``source \\t label \\t star \\t sentence``; test: header ``index \\t sentence``."""
    rows = iter_tsv(path, opts)
    first = next(rows, None)
    if first is None:
        raise DataError(path, advised("empty file", WRONG_FILE), 1)
    if first[1] == COLA_TEST_HEADER:
        return _read_with_header(path, opts, COLA_FMT, first[0], first[1], rows)
    out: list[Example] = []

    def chain() -> Iterator[tuple[int, list[str]]]:
        yield first
        yield from rows

    for k, (n, cols) in enumerate(chain()):
        try:
            check_columns(cols, 4)
            label = label_of(cols[1], COLA_FMT.labels)
            text = nonempty(cols[3], "sentence")
        except BadRow as e:
            reject(path, n, str(e), opts)
            continue
        out.append(
            Example(
                texts=(text,), label=label, uid=str(k), source=f"{path}:{n}", extra={"source": cols[0], "star": cols[2]}
            )
        )
    return out


BINARY = ("0", "1")
NLI3 = ("contradiction", "entailment", "neutral")  # GLUE's order for MNLI (and its submission labels)
NLI2 = ("entailment", "not_entailment")

COLA_FMT = GlueFormat(("sentence",), "label", BINARY)
SST2_FMT = GlueFormat(("sentence",), "label", BINARY)
MRPC_FMT = GlueFormat(("#1 String", "#2 String"), "Quality", BINARY, extra=("#1 ID", "#2 ID"))
QQP_FMT = GlueFormat(("question1", "question2"), "is_duplicate", BINARY, id="id", extra=("qid1", "qid2"))
STSB_FMT = GlueFormat(("sentence1", "sentence2"), "score", (), extra=("genre", "filename", "year"))
MNLI_FMT = GlueFormat(
    ("sentence1", "sentence2"), "gold_label", NLI3, ruled_out=("-",), extra=("promptID", "pairID", "genre")
)
QNLI_FMT = GlueFormat(("question", "sentence"), "label", NLI2)
RTE_FMT = GlueFormat(("sentence1", "sentence2"), "label", NLI2)
WNLI_FMT = GlueFormat(("sentence1", "sentence2"), "label", BINARY)


def _splits(
    fmt: GlueFormat,
    train: str = "train.tsv",
    dev: str = "dev.tsv",
    test: str = "test.tsv",
    reader: Reader | None = None,
) -> dict[str, Split]:
    r = reader or partial(read_glue_tsv, fmt=fmt)
    return {"train": Split((train,), r), "dev": Split((dev,), r), "test": Split((test,), r, labeled=False)}


PAIR_TRUNC = (
    "Truncation (done by fine-tuning): the longer of the two texts loses tokens from its end until "
    "<s> a $ b <e> fits the context; "
)
SINGLE_TRUNC = "Truncation (done by fine-tuning): the text keeps its head so that <s> text <e> fits the context; "


def _glue(
    name: str,
    title: str,
    kind: Kind,
    fmt: GlueFormat,
    metric: str,
    folder: str,
    glue_name: str,
    paper: float | None,
    notes: str,
    extra_metrics: tuple[str, ...] = (),
    **split_kw,
) -> Task:
    """Register one GLUE task; ``split_kw`` overrides split file names or the reader."""
    return register(
        Task(
            name=name,
            title=title,
            kind=kind,
            labels=fmt.labels,
            metric=metric,
            folder=folder,
            splits=_splits(fmt, **split_kw),
            source_url=GLUE_URL,
            paper_score=paper,
            notes=notes,
            parent_folders=GLUE_PARENTS,
            glue_name=glue_name,
            extra_metrics=extra_metrics,
        )
    )


_glue(
    "cola",
    "CoLA (linguistic acceptability)",
    "classification",
    COLA_FMT,
    "mcc",
    "CoLA",
    "CoLA",
    45.4,
    SINGLE_TRUNC + "sentences are short. Train/dev have no header (source, label, star, sentence); "
    "dev = in_domain_dev + out_of_domain_dev. Paper score is GLUE test.",
    ("accuracy",),
    reader=read_cola,
)
_glue(
    "sst2",
    "SST-2 (sentiment)",
    "classification",
    SST2_FMT,
    "accuracy",
    "SST-2",
    "SST-2",
    91.3,
    SINGLE_TRUNC + "sentences are short (tokenized, lower-cased phrases). Paper score is GLUE test.",
)
_glue(
    "mrpc",
    "MRPC (paraphrase)",
    "similarity",
    MRPC_FMT,
    "f1",
    "MRPC",
    "MRPC",
    82.3,
    PAIR_TRUNC + "pairs are short. F1 of class '1' (paraphrase); files start with a UTF-8 BOM. "
    "Paper score is GLUE test.",
    ("accuracy",),
)
_glue(
    "qqp",
    "QQP (Quora question pairs)",
    "similarity",
    QQP_FMT,
    "f1",
    "QQP",
    "QQP",
    70.3,
    PAIR_TRUNC + "questions are short. F1 of class '1' (duplicate). Paper score is GLUE test.",
    ("accuracy",),
)
_glue(
    "stsb",
    "STS-B (semantic similarity)",
    "regression",
    STSB_FMT,
    "pearson",
    "STS-B",
    "STS-B",
    82.0,
    PAIR_TRUNC + "pairs are short. Label = the float score in [0, 5]; Pearson x100 reported, Spearman too. "
    "Paper score is GLUE test.",
    ("spearman",),
)
_glue(
    "mnli",
    "MNLI matched",
    "entailment",
    MNLI_FMT,
    "accuracy",
    "MNLI",
    "MNLI-m",
    82.1,
    PAIR_TRUNC + "premises can be long. dev = dev_matched.tsv, test = test_matched.tsv; fine-tune once on "
    "`mnli` and evaluate that run on `mnli-mm` for the mismatched number. gold_label '-' rows (none in GLUE's "
    "files) are left out by rule. Paper score is GLUE test.",
    dev="dev_matched.tsv",
    test="test_matched.tsv",
)
_glue(
    "mnli-mm",
    "MNLI mismatched",
    "entailment",
    MNLI_FMT,
    "accuracy",
    "MNLI",
    "MNLI-mm",
    81.4,
    PAIR_TRUNC + "same training file as `mnli`; dev = dev_mismatched.tsv, test = test_mismatched.tsv. "
    "Paper score is GLUE test.",
    dev="dev_mismatched.tsv",
    test="test_mismatched.tsv",
)
_glue(
    "qnli",
    "QNLI (question-answering NLI)",
    "entailment",
    QNLI_FMT,
    "accuracy",
    "QNLI",
    "QNLI",
    88.1,
    PAIR_TRUNC + "texts = (question, sentence) as in the file; sentences can be long. Paper score is GLUE test.",
)
_glue(
    "rte",
    "RTE (recognizing textual entailment)",
    "entailment",
    RTE_FMT,
    "accuracy",
    "RTE",
    "RTE",
    56.0,
    PAIR_TRUNC + "premises can exceed 300 tokens. Paper score is GLUE test.",
)
_glue(
    "wnli",
    "WNLI (Winograd NLI)",
    "entailment",
    WNLI_FMT,
    "accuracy",
    "WNLI",
    "WNLI",
    None,
    PAIR_TRUNC + "not reported in the paper (GLUE includes it; dev is adversarial to train, majority class "
    "is the usual baseline).",
)
