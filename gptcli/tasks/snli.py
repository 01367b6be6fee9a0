"""SNLI 1.0: ``snli_1.0/snli_1.0_{train,dev,test}.jsonl``, one JSON object per line.

Fields used: ``sentence1`` (premise), ``sentence2`` (hypothesis), ``gold_label``, ``pairID`` (uid). Rows whose
``gold_label`` is ``-`` (no annotator consensus) are left out by the dataset's own rule — counted in
``ReadOptions.excluded``, not errors. Labels use GLUE's MNLI order so an MNLI head maps onto SNLI unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptcli.tasks.base import Example, ReadOptions, Split, Task
from gptcli.tasks.glue import NLI3
from gptcli.tasks.registry import register
from gptcli.tasks.rows import BadRow, iter_lines, label_of, nonempty, reject


def field(obj: dict, name: str) -> str:
    if name not in obj:
        raise BadRow(f"missing field {name!r}")
    value = obj[name]
    if not isinstance(value, str):
        raise BadRow(f"field {name!r} is not a string")
    return value


def read_snli_jsonl(path: Path, opts: ReadOptions) -> list[Example]:
    out: list[Example] = []
    for n, text in iter_lines(path, opts):
        if not text.strip():
            continue
        try:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise BadRow(f"not a JSON object ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise BadRow("not a JSON object")
            gold = field(obj, "gold_label")
            if gold == "-":
                opts.excluded.append(f"{path}:{n}: gold_label '-' (no consensus label)")
                continue
            label = label_of(gold, NLI3, "gold_label")
            texts = (nonempty(field(obj, "sentence1"), "sentence1"), nonempty(field(obj, "sentence2"), "sentence2"))
        except BadRow as e:
            reject(path, n, str(e), opts)
            continue
        out.append(
            Example(
                texts=texts,
                label=label,
                uid=str(obj.get("pairID", n)),
                source=f"{path}:{n}",
                extra={"captionID": obj.get("captionID", "")},
            )
        )
    return out


register(
    Task(
        name="snli",
        title="SNLI (Stanford NLI)",
        kind="entailment",
        labels=NLI3,
        metric="accuracy",
        folder="snli_1.0",
        splits={s: Split((f"snli_1.0_{s}.jsonl",), read_snli_jsonl) for s in ("train", "dev", "test")},
        source_url="https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
        paper_score=89.9,
        notes="Truncation (done by fine-tuning): the longer of premise/hypothesis loses tokens from its end until "
        "<s> premise $ hypothesis <e> fits; captions are short, so it never triggers at 512. "
        "gold_label '-' rows are left out by rule (counted). Paper score is the public test set.",
    )
)
