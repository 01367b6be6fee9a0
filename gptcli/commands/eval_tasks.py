"""The body of `gpt1 eval --task ...`: score fine-tuned checkpoints on task splits and render the tables.

``gptcli/commands/evaluate.py`` owns the option parsing of `gpt1 eval`; it calls :func:`task_eval_command` when
``--task`` is given (or when every ``--checkpoint`` is a fine-tuned one), passing its options through. Each
(task, checkpoint) pair writes ``results.json``, ``predictions.jsonl`` and, for unlabeled test splits, the GLUE
submission file into ``OUT/<run>/<task>-<split>/`` (``--out``) or ``RUN/eval/<task>-<split>/``. With several
checkpoints and/or tasks the summary is one combined table like the paper's Tables 2–4, with GPT-1's numbers
in the first row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def parse_tasks(task: str | Sequence[str] | None) -> list[str | None]:
    """``"mnli,mnli-mm"`` or a list → task names; None → each checkpoint's own task."""
    if task is None:
        return [None]
    items = [task] if isinstance(task, str) else list(task)
    names = [t.strip() for item in items for t in str(item).split(",") if t.strip()]
    return names or [None]


def task_eval_command(
    task: str | Sequence[str] | None,
    checkpoints: Sequence[str | Path],
    split: str | None = "dev",
    data_dir: str | Path | None = None,
    out: str | Path | None = None,
    *,
    batch_size: int = 64,
    device: str = "auto",
    precision: str = "auto",
    skip_bad_rows: bool = False,
    max_examples: int | None = None,
    details: bool = True,
    console: Any | None = None,
) -> list[dict[str, Any]]:
    """Evaluate every checkpoint on every task's ``split`` and print the results; returns the results dicts.

    ``task`` may be None (each checkpoint's fine-tuning task), one name, a comma-separated list or a list.
    ``split`` None means ``dev``. ``data_dir`` is the task's official folder (only sensible with one task);
    otherwise ``$GPT1_DATA/<folder>`` is used.
    """
    from rich.console import Console
    from rich.markup import escape

    from gptcli.errors import GPT1Error
    from gptcli.commands.render import details_table, results_table
    from gptcli.eval.tasks import evaluate_task, run_label

    if not checkpoints:
        raise GPT1Error("no checkpoint to evaluate: give --checkpoint RUN_DIR (repeatable)")
    tasks = parse_tasks(task)
    if data_dir is not None and len(tasks) > 1:
        raise GPT1Error("--data-dir names one task's folder; with several tasks set GPT1_DATA instead")
    split = split or "dev"
    console = console or Console()
    results = []
    labels_seen: dict[str, int] = {}
    for ck in checkpoints:
        from gptcli.checkpoint import resolve_checkpoint

        path = resolve_checkpoint(ck)
        label = run_label(path)
        # Two runs with the same directory name stay apart in the table and on disk.
        labels_seen[label] = labels_seen.get(label, 0) + 1
        if labels_seen[label] > 1:
            label = f"{label}#{labels_seen[label]}"
        for t in tasks:
            name = t or _trained_task(path)
            target = Path(out) / label / f"{name}-{split}" if out is not None else None
            with console.status(f"evaluating {label} on {name} ({split})", spinner="dots"):
                r = evaluate_task(name, path, split, data_dir=data_dir, out=target, batch_size=batch_size,
                                  device=device, precision=precision, skip_bad_rows=skip_bad_rows,
                                  max_examples=max_examples)
            r["run"] = label
            results.append(r)
            if r.get("skipped_rows"):
                console.print(f"[yellow]skipped {len(r['skipped_rows'])} bad rows[/] (first: {escape(r['skipped_rows'][0])})")
    console.print(results_table(results))
    if details:
        console.print(details_table(results))
    for r in results:
        where = r.get("submission") or r.get("out_dir")
        console.print(f"{r['run']} · {r['task']} ({r['split']}): {where}", highlight=False, markup=False)
    return results


def _trained_task(checkpoint: Path) -> str:
    """The task a fine-tuned checkpoint was trained on (from its config.json)."""
    import json

    from gptcli.checkpoint import CONFIG
    from gptcli.errors import GPT1Error

    meta = json.loads((checkpoint / CONFIG).read_text(encoding="utf-8")).get("meta", {})
    if not meta.get("task"):
        raise GPT1Error(f"{checkpoint}: not a fine-tuned checkpoint; pass --task to say what to evaluate")
    return meta["task"]
