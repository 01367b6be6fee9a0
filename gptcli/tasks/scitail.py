"""SciTail 1.1: ``SciTailV1.1/tsv_format/scitail_1.0_{train,dev,test}.tsv``.

No header; three tab-separated columns ``premise, hypothesis, label`` with labels ``entails`` / ``neutral``.
Read with no quote processing, like GLUE.
"""

from __future__ import annotations

from pathlib import Path

from gptcli.tasks.base import Example, ReadOptions, Split, Task
from gptcli.tasks.registry import register
from gptcli.tasks.rows import BadRow, check_columns, iter_tsv, label_of, nonempty, reject

LABELS = ("entails", "neutral")


def read_scitail_tsv(path: Path, opts: ReadOptions) -> list[Example]:
    out: list[Example] = []
    for k, (n, cols) in enumerate(iter_tsv(path, opts)):
        try:
            check_columns(cols, 3)
            texts = (nonempty(cols[0], "premise"), nonempty(cols[1], "hypothesis"))
            label = label_of(cols[2], LABELS)
        except BadRow as e:
            reject(path, n, str(e), opts)
            continue
        out.append(Example(texts=texts, label=label, uid=str(k), source=f"{path}:{n}"))
    return out


register(
    Task(
        name="scitail",
        title="SciTail (science entailment)",
        kind="entailment",
        labels=LABELS,
        metric="accuracy",
        folder="SciTailV1.1",
        splits={s: Split((f"tsv_format/scitail_1.0_{s}.tsv",), read_scitail_tsv) for s in ("train", "dev", "test")},
        source_url="https://allenai.org/data/scitail (http://data.allenai.org.s3.amazonaws.com/downloads/SciTailV1.1.zip)",
        paper_score=88.3,
        notes="Truncation (done by fine-tuning): the longer of premise/hypothesis loses tokens from its end until "
        "<s> premise $ hypothesis <e> fits; sentences are short. Paper score is the test set.",
    )
)
