"""Story Cloze Test (spring 2016): the two CSV files as distributed by the ROCStories team.

Columns (by header name): ``InputStoryid, InputSentence1..4, RandomFifthSentenceQuiz1, RandomFifthSentenceQuiz2,
AnswerRightEnding`` (``1``/``2``); a file without ``AnswerRightEnding`` is read as unlabeled. Proper CSV quoting.
Each row is one :class:`Example`: ``texts = (story,)`` with the four sentences joined by single spaces (as the
released code does), ``choices`` = the two endings, ``label`` = 0/1, ``uid`` = ``InputStoryid``.

Splits follow the released code (openai/finetune-transformer-lm ``datasets.py``): GPT-1 fine-tuned on the 2016
*validation* file, split by ``sklearn.model_selection.train_test_split(test_size=374, random_state=3535999445)``
into 1,497 train / 374 dev rows, and reported accuracy on the 2016 *test* file. That call draws
``numpy.random.RandomState(3535999445).permutation(n)``; the first 374 indices are dev, the rest train, both in
permutation order — reproduced here with numpy alone. ``val`` is the whole validation file (used by zero-shot).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gptcli.errors import DataError
from gptcli.tasks.base import Example, ReadOptions, Split, Task
from gptcli.tasks.registry import register
from gptcli.tasks.rows import BadRow, column_index, label_of, nonempty, reject

VAL_FILE = "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
TEST_FILE = "cloze_test_test__spring2016 - cloze_test_ALL_test.csv"
SPLIT_SEED = 3535999445  # the released code's module-level ``seed``
N_DEV = 374
LABELS = ("1", "2")
SENTENCES = ("InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4")
ENDINGS = ("RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2")
REQUIRED = ("InputStoryid", *SENTENCES, *ENDINGS)
ANSWER = "AnswerRightEnding"


def _read_csv(path: Path, opts: ReadOptions) -> tuple[list[Example], int, list[tuple[int, int, str]]]:
    """All examples of one Story Cloze CSV, its number of data rows (bad ones included) and its bad rows as (row
    index, line, reason), not yet put to the bad-row policy: the train and dev splits read the same file, so each
    split applies the policy to its own rows and a bad row is counted once. Lines are counted on ``\\n`` alone, as
    every reader counts them (:mod:`gptcli.tasks.rows`)."""
    out: list[Example] = []
    bad: list[tuple[int, int, str]] = []
    k = -1
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(path, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    reader = csv.reader(io.StringIO(text, newline="\n"))
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(path, "empty file (expected a header line)", 1)
        col = column_index(path, header, 1)
        missing = [c for c in REQUIRED if c not in col]
        if missing:
            raise DataError(path, f"header lacks column {missing[0]!r} (found: {', '.join(header)})", 1)
        labeled = ANSWER in col
        while True:
            start = reader.line_num + 1  # a quoted field may span lines: report where the record starts
            row = next(reader, None)
            if row is None:
                break
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line
            k += 1
            try:
                if len(row) != len(header):
                    raise BadRow(f"expected {len(header)} comma-separated columns, found {len(row)}")
                sents = [nonempty(row[col[c]], c) for c in SENTENCES]
                choices = tuple(nonempty(row[col[c]], c) for c in ENDINGS)
                label = label_of(row[col[ANSWER]], LABELS, ANSWER) if labeled else None
            except BadRow as e:
                bad.append((k, start, str(e)))
                continue
            out.append(
                Example(
                    texts=(" ".join(sents),),
                    choices=choices,
                    label=label,
                    uid=row[col["InputStoryid"]],
                    source=f"{path}:{start}",
                    extra={"row": k},
                )
            )
    except csv.Error as e:
        raise DataError(path, f"malformed CSV ({e})", reader.line_num) from None
    return out, k + 1, bad


def read_storycloze(path: Path, opts: ReadOptions) -> list[Example]:
    """Every row of a Story Cloze CSV, in file order."""
    examples, _, bad = _read_csv(path, opts)
    for _, line, reason in bad:
        reject(path, line, reason, opts)
    return examples


def released_split(n_rows: int, n_dev: int = N_DEV, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
    """(train rows, dev rows) of the released code's ``train_test_split`` over ``n_rows`` rows."""
    import numpy as np

    perm = np.random.RandomState(seed).permutation(n_rows).tolist()
    n_dev = min(n_dev, n_rows)
    return perm[n_dev:], perm[:n_dev]


def _split_reader(part: int):
    def read(path: Path, opts: ReadOptions) -> list[Example]:
        examples, n_rows, bad = _read_csv(path, opts)
        by_row = {ex.extra["row"]: ex for ex in examples}
        mine = released_split(n_rows)[part]
        ours = set(mine)
        for row, line, reason in bad:  # only this split's bad rows: each is counted once, by its own split
            if row in ours:
                reject(path, line, reason, opts)
        # Rows rejected under --skip-bad-rows keep their place in the permutation, so the rest of the
        # split stays the released one.
        return [by_row[r] for r in mine if r in by_row]

    read.__doc__ = f"The released code's {'train' if part == 0 else 'dev'} part of the 2016 validation file."
    return read


register(
    Task(
        name="storycloze",
        title="Story Cloze Test (2016)",
        kind="multiple_choice",
        labels=LABELS,
        metric="accuracy",
        folder="storycloze",
        shape="<s> story $ ending <e> per ending, softmax over the two endings",
        splits={
            "train": Split((VAL_FILE,), _split_reader(0)),
            "dev": Split((VAL_FILE,), _split_reader(1)),
            "test": Split((TEST_FILE,), read_storycloze),
            "val": Split((VAL_FILE,), read_storycloze),
        },
        source_url="https://cs.rochester.edu/nlp/rocstories/ (request form; the spring 2016 val and test CSVs)",
        paper_score=86.5,
        n_choices=2,
        notes="Splits as the released code: train/dev = 1,497/374 rows of the 2016 validation file (its "
        "train_test_split, random_state 3535999445); test = the 2016 test file; val = the whole validation "
        "file. Truncation as the released code (done by fine-tuning): story and ending each keep their first "
        "n_ctx//2 - 2 tokens (254 at 512).",
    )
)
