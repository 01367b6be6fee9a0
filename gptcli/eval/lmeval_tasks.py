"""lm-eval task configs over local files: the benchmarks ``gpt1 zeroshot`` and ``gpt1 eval`` score, offline.

lm-eval's own tasks download their data from the Hugging Face Hub. :func:`write_local_tasks` writes a folder lm-eval
reads with ``--include_path`` instead: one JSON-lines file per task, made from the official files *through gpt1's task
registry* (so lm-eval sees exactly the examples ``gpt1 zeroshot`` reads), and one YAML config per task whose
``dataset_path: json`` + ``data_files`` point at it. :func:`write_local_tasks` lists the tasks (each a
``validation`` split), what each scores and how it compares with gpt1's own figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import write_text_atomic

WIKITEXT = Path("wikitext-2") / "wiki.valid.tokens"
"""WikiText-2's validation file under a data root (as ``../shared/data`` holds it)."""
_ARTICLE = re.compile(r"^ = [^=].* = $")


def wikitext_articles(path: Path) -> list[str]:
    """The articles of a WikiText ``*.tokens`` file: each starts at a top-level `` = Title = `` line and runs to the
    next, lines kept as they are (blank lines included)."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except OSError as e:
        raise GPT1Error(f"{path}: cannot read ({e.strerror or e})") from None
    articles: list[list[str]] = []
    for line in lines:
        if _ARTICLE.match(line) or not articles:
            articles.append([])
        articles[-1].append(line)
    return [t for t in ("\n".join(a).strip("\n") for a in articles) if t.strip()]


def _sst2_rows(root: Path) -> list[dict[str, Any]]:
    from gptcli.eval.zeroshot import read_labeled, registry_task

    task = registry_task("sst2")
    return [
        {"sentence": ex.texts[0], "label": int(ex.label)}  # type: ignore[arg-type]
        for ex in read_labeled(task, "dev", task.data_dir(root=root), None)
    ]


def _storycloze_rows(root: Path) -> list[dict[str, Any]]:
    from gptcli.eval.zeroshot import read_labeled, registry_task

    task = registry_task("storycloze")
    return [
        {"story": ex.texts[0], "endings": list(ex.choices), "label": int(ex.label), "uid": ex.uid}  # type: ignore[arg-type]
        for ex in read_labeled(task, "val", task.data_dir(root=root), None)
    ]


def _wikitext_rows(root: Path) -> list[dict[str, Any]]:
    return [{"page": a} for a in wikitext_articles(root / WIKITEXT)]


_COMMON = {"output_type": "multiple_choice", "test_split": "validation", "target_delimiter": " "}
TASKS: dict[str, tuple[Callable[[Path], list[dict[str, Any]]], dict[str, Any]]] = {
    "gpt1_sst2": (
        _sst2_rows,
        {
            **_COMMON,
            "doc_to_text": "{{sentence}} very",
            "doc_to_target": "{{label}}",
            "doc_to_choice": ["negative", "positive"],
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        },
    ),
    "gpt1_storycloze": (
        _storycloze_rows,
        {
            **_COMMON,
            "doc_to_text": "{{story}}",
            "doc_to_target": "{{label}}",
            "doc_to_choice": "{{endings}}",
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")
            ],
        },
    ),
    "gpt1_wikitext2": (
        _wikitext_rows,
        {
            "output_type": "loglikelihood_rolling",
            "test_split": "validation",
            "doc_to_text": "",
            "doc_to_target": "{{page}}",
            "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
        },
    ),
}
"""Local task name → (rows from a data root, the rest of its lm-eval config)."""


def write_local_tasks(
    data_root: str | Path, out: str | Path, tasks: list[str] | None = None, limit: int | None = None
) -> list[str]:
    """Write the local lm-eval tasks whose data is under ``data_root`` into ``out`` (for ``--include_path out``);
    returns the task names written. ``tasks`` (default: every one whose files exist) picks some; ``limit`` keeps the
    first N rows of each. A task asked for by name whose files are missing is an error; with ``tasks`` unset it is
    left out.

    The tasks:

    - ``gpt1_sst2`` — SST-2 dev as a two-choice task the way the paper scores it zero-shot (§5): the context is the
      sentence followed by ``very``, the choices ``negative``/``positive``. Both are one token, so lm-eval's ``acc``
      (highest summed log-probability) is ``gpt1 zeroshot --task sst2``'s accuracy.
    - ``gpt1_storycloze`` — the Story Cloze 2016 val file: the four sentences, then each ending. ``acc`` picks the
      highest *summed* log-probability and ``acc_norm`` the highest per *character*; ``gpt1 zeroshot`` picks the highest
      per *token* (the paper's heuristic), which lm-eval's multiple-choice metrics cannot express — compare the
      per-choice log-likelihoods (``--log_samples``) instead, which are the same numbers.
    - ``gpt1_wikitext2`` — WikiText-2's validation file (tokenized, as ../shared has it) cut into its articles (the
      `` = Title = `` lines), scored by ``loglikelihood_rolling``: lm-eval reports word and byte perplexity and bits per
      byte; ``gpt1 eval`` reports token perplexity over the same log-likelihoods.
    """
    root, d = Path(data_root), Path(out)
    if not root.is_dir():
        raise GPT1Error(f"{root}: not a directory (the data root holding SST-2/, storycloze/, wikitext-2/)")
    wanted = list(TASKS) if tasks is None else tasks
    unknown = [t for t in wanted if t not in TASKS]
    if unknown:
        raise GPT1Error(f"unknown local lm-eval task {unknown[0]!r} (known: {', '.join(TASKS)})")
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for name in wanted:
        rows_of, config = TASKS[name]
        try:
            rows = rows_of(root)[:limit]
        except GPT1Error:
            if tasks is not None:
                raise
            continue
        data = d / f"{name}.jsonl"
        write_text_atomic(data, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        body = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"validation": str(data.resolve())}},
            **config,
        }
        # JSON is YAML: lm-eval's loader reads it as is, and no YAML writer is needed here.
        write_text_atomic(d / f"{name}.yaml", json.dumps(body, indent=2, ensure_ascii=False) + "\n")
        written.append(name)
    if not written:
        raise GPT1Error(
            f"{root}: none of the local lm-eval tasks' files found (SST-2/dev.tsv, the Story Cloze val csv, {WIKITEXT})"
        )
    return written
