"""`gpt1 zeroshot`: the paper's zero-shot heuristics on a pretrained language model, and their learning curve.

Options come from :class:`gptcli.eval.zeroshot.ZeroShotConfig`; the command calls
:func:`gptcli.eval.zeroshot.zeroshot` (one checkpoint) or :func:`gptcli.eval.curve.run_curve` (``--task all`` over a
run directory, or several ``--checkpoint``), shows progress on stderr and the result tables on stdout.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gptcli.commands.options import CliOnly, Options, Parsed
from gptcli.commands.render import RichProgress, stderr_console, stdout_console
from gptcli.errors import GPT1Error
from gptcli.eval.zeroshot import ZeroShotConfig

OPTIONS = Options(
    ZeroShotConfig,
    panels={
        "Input": ("task", "data_dir", "verify"),
        "Evaluation": ("threshold", "limit"),
        "Runtime": ("batch_size", "precision", "device", "kernels"),
        "Output": ("out",),
    },
    # Both are repeatable on the command line (CliOnly below); the config file keeps their plain fields.
    hidden=("checkpoint", "split"),
    cli_only=[
        CliOnly(
            "checkpoint",
            list[Path],
            [],
            ("--checkpoint",),
            "Checkpoint directory, run directory or Hugging Face Hub id (openai-gpt, owner/name[@revision]: "
            "converted once); repeat for several (a curve). With --task all a run directory means every "
            "checkpoint in it. [default: the --config file's, else openai-gpt, OpenAI's released GPT-1]",
            why="repeatable: several checkpoints make the curve, while ZeroShotConfig.checkpoint is the one "
            "checkpoint of a single run (a --config file may set it)",
            panel="Input",
        ),
        CliOnly(
            "split",
            list[str],
            [],
            ("--split",),
            "Split to score: SPLIT for every task, or TASK=SPLIT (repeatable). Defaults: dev; dprd test (train "
            "when only train.c.txt exists); wsc test (its only file); storycloze val.",
            why="one repeatable option fills two fields: SPLIT sets ZeroShotConfig.split, TASK=SPLIT adds to "
            "ZeroShotConfig.splits",
            panel="Input",
        ),
        CliOnly(
            "curve",
            bool | None,
            None,
            ("--curve/--no-curve",),
            "Force or prevent the curve over checkpoints (default: on for --task all over a run directory, or "
            "several --checkpoint).",
            why="chooses between two library calls (zeroshot or run_curve); not a setting of the scoring",
            panel="Evaluation",
        ),
        CliOnly(
            "sota",
            list[str],
            [],
            ("--sota",),
            "Curve normalisation: TASK=SCORE replaces the state-of-the-art value (percent; CoLA MCC x100).",
            why="an argument of run_curve (the plot's normalisation), not of the scoring",
            panel="Evaluation",
        ),
    ],
)


def run(p: Parsed) -> None:
    """Score a pretrained (not fine-tuned) language model with the paper's zero-shot heuristics (§5)."""
    from gptcli.eval.curve import wants_curve

    sota = _sota_values(p.cli["sota"])  # every setting is checked before data or a model is fetched
    cfg, checkpoints = resolve(p)
    progress = RichProgress(stderr_console())
    if wants_curve(cfg.task, checkpoints, p.cli["curve"]):
        _run_curve(cfg, checkpoints, sota, progress)
    else:
        _run_one(cfg, progress)


command = OPTIONS.command(run)


def resolve(p: Parsed) -> tuple[ZeroShotConfig, list[str]]:
    """The config (defaults < --config < options typed) and the checkpoints to score."""
    from gptcli.commands import defaults
    from gptcli.eval.zeroshot import check_config, registry_task, task_list

    plain, pairs = _parse_pairs(p.cli["split"], "split")
    checkpoints = [str(c) for c in p.cli["checkpoint"]]
    # The command-line-only options fill config fields as if typed (``splits`` is merged over the --config file's
    # table by Parsed.resolve), in a copy: ``p`` stays as parsed.
    typed = {
        **({"split": plain} if plain is not None else {}),
        **({"splits": pairs} if pairs else {}),
        **({"checkpoint": checkpoints[0]} if checkpoints else {}),
    }
    p = dataclasses.replace(p, given={**p.given, **typed})
    cfg = p.resolve(ZeroShotConfig, p.base())
    check_config(cfg)  # a mistyped setting, or missing data, is one line before any model is downloaded
    names = task_list(cfg.task)
    console = stderr_console()
    specs = checkpoints or [cfg.checkpoint]
    if len(names) == 1:  # one task: its data first (fetched into the default data root when missing there)
        hub = defaults.hub_model(specs, "--checkpoint")
        defaults.task_data(registry_task(names[0]), cfg.data_dir, console, check=hub is not None, hub_model=hub)
    # No checkpoint anywhere: the paper's model (OpenAI's released GPT-1); Hub ids become converted checkpoints.
    checkpoints = [defaults.model(c, console) for c in specs]
    cfg.checkpoint = checkpoints[0]
    return cfg, checkpoints


def _parse_pairs(values: list[str], what: str) -> tuple[str | None, dict[str, str]]:
    """``["dev", "dprd=train"]`` → (``"dev"``, ``{"dprd": "train"}``)."""
    plain, pairs = None, {}
    for v in values:
        if "=" in v:
            k, _, x = v.partition("=")
            if not k.strip() or not x.strip():
                raise GPT1Error(f"--{what}: expected VALUE or TASK=VALUE, got {v!r}")
            pairs[k.strip().lower()] = x.strip()
        else:
            plain = v
    return plain, pairs


def _sota_values(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in _parse_pairs(values, "sota")[1].items():
        try:
            out[k] = float(v)
        except ValueError:
            raise GPT1Error(f"--sota {k}={v}: not a number") from None
    return out


def _run_one(cfg: ZeroShotConfig, progress: RichProgress) -> None:
    from rich.table import Table

    from gptcli.commands.render import escape
    from gptcli.eval.zeroshot import zeroshot

    results, _, meta = zeroshot(cfg, progress=progress)
    step = f" · step {meta['step']}" if meta.get("step") is not None else ""
    table = Table(title=f"zero-shot · {meta['checkpoint']}{step}")
    for h in ("task", "split", "metric", "score", "n", "examples/s", "notes"):
        table.add_column(h, justify="right" if h in ("score", "n", "examples/s") else "left")
    for name, r in results.items():
        table.add_row(
            name, r.split, r.metric, f"{r.score:.1f}", str(r.n), f"{r.examples_per_s:.1f}", escape("; ".join(r.notes))
        )
    console = stdout_console()
    console.print(table)
    if cfg.out:
        console.print(escape(f"wrote {Path(cfg.out) / 'results.json'}"), highlight=False)


def _run_curve(cfg: ZeroShotConfig, checkpoints: list[str], sota: dict[str, float], progress: RichProgress) -> None:
    from gptcli.commands.render import escape
    from gptcli.eval.curve import run_curve

    curve = run_curve(cfg, checkpoints, sota=sota, progress=progress)
    console = stdout_console()
    console.print(_curve_table(curve))
    for line in _curve_notes(curve, sota):
        console.print(line, highlight=False)
    if cfg.out:
        console.print(
            escape(f"wrote {Path(cfg.out) / 'curve.json'} and {Path(cfg.out) / 'curve.png'}"), highlight=False
        )


def _curve_table(curve: Any) -> Any:
    from rich.table import Table

    from gptcli.commands.render import escape

    table = Table(title="zero-shot curve: score (normalised: 0 = random, 1 = SOTA)")
    table.add_column("step", justify="right")
    table.add_column("checkpoint")
    for t in curve.tasks:
        table.add_column(t, justify="right")
    for p in curve.points:
        cells = [f"{p.scores[t]:.1f} ({p.normalized[t]:+.2f})" if t in p.scores else "—" for t in curve.tasks]
        table.add_row("" if p.step is None else str(p.step), escape(Path(p.checkpoint).name), *cells)
    return table


def _curve_notes(curve: Any, sota: dict[str, float]) -> list[str]:
    """The SST-2 multi-token note (once for the whole curve) and the normalisation constants used."""
    from gptcli.eval.curve import RANDOM, SOTA

    table_sota = {**SOTA, **sota}
    notes = sorted(
        {n for p in curve.points for ns in p.notes.values() for n in ns if n.startswith("multi-token words")}
    )
    return [f"note (sst2): {n}" for n in notes] + [
        "normalisation: " + "; ".join(f"{t}: random {RANDOM[t]:g}, SOTA {table_sota[t]:g}" for t in curve.tasks)
    ]
