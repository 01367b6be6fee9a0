"""`gpt1 generate`: continue a prompt with a checkpoint's language model, streaming tokens to the terminal.

Options are derived from GenerateConfig (gptcli/model/generate.py); the run is gptcli/pipelines/generate.py. The
text goes to stdout as it is produced (``--samples N`` > 1: each sample under a header once the batch is done);
warnings and the closing statistics go to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gptcli.commands.options import Options, Parsed
from gptcli.commands.render import RichProgress, stderr_console
from gptcli.model.generate import GenerateConfig

OPTIONS = Options(
    GenerateConfig,
    panels={
        "Input": ("checkpoint", "prompt", "verify"),
        "Sampling": ("max_new_tokens", "greedy", "temperature", "top_k", "top_p", "seed", "samples"),
        "Runtime": ("device", "use_cache", "kernels"),
    },
    flags={
        "checkpoint": ("--checkpoint", "-c"),
        "prompt": ("--prompt", "-p"),
        "max_new_tokens": ("--max-new-tokens", "-n"),
        "greedy": ("--greedy/--sample",),
        "temperature": ("--temperature", "-t"),
        "use_cache": ("--cache/--no-cache",),
    },
)


def run(p: Parsed) -> None:
    """Generate text from a prompt (greedy, temperature, top-k, top-p), streaming it as it is produced."""
    from gptcli.commands import defaults
    from gptcli.pipelines.generate import start_generation

    cfg = p.resolve(GenerateConfig, p.base())
    err = stderr_console()
    if cfg.prompt:  # (no prompt: the library's one-line error, before any model is downloaded)
        cfg.checkpoint = Path(defaults.model(cfg.checkpoint, err))
    progress = RichProgress(err)
    gen = start_generation(cfg, progress)
    if cfg.samples > 1:
        n = _print_samples(gen, progress)
    else:
        n = _stream(gen)
    dt = gen.seconds
    rate = n / dt if dt > 0 else float("inf")
    mode = "greedy" if cfg.greedy else f"T={cfg.temperature} top-k={cfg.top_k} top-p={cfg.top_p}"
    batch = ""
    if cfg.samples > 1:
        batch = f", {cfg.samples} samples as " + ("one batch" if gen.batches == 1 else f"{gen.batches} batches")
    err.print(
        f"[dim]{n} tokens in {dt:.2f} s ({rate:.1f} tokens/s, {mode}{batch}, "
        f"{'KV cache' if cfg.use_cache else 'no cache'}, {gen.device})[/]",
        highlight=False,
        soft_wrap=True,
    )


def _stream(gen) -> int:
    """What the model sees (cleaned, lowercased), then each new piece of text as it is chosen; the tokens made."""
    out = sys.stdout
    out.write(gen.prompt_text)
    out.flush()
    for piece in gen.stream():
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    return len(gen.generated)


def _print_samples(gen, progress: RichProgress) -> int:
    """Every sample, prompt included, under a ``--- sample i/N ---`` header; the tokens made over all samples."""
    texts = gen.sample_texts(progress)
    out = sys.stdout
    for i, text in enumerate(texts, 1):
        out.write(f"--- sample {i}/{len(texts)} ---\n{gen.prompt_text}{text}\n")
    out.flush()
    return sum(len(row) for row in gen.rows)


command = OPTIONS.command(run)
