"""`gpt1 generate`: continue a prompt with a checkpoint's language model, streaming tokens to the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c", help="Checkpoint directory (or run directory: its newest "
                                    "checkpoint), e.g. one written by `gpt1 convert`."),
    prompt: str = typer.Option(..., "--prompt", "-p", help="Text to continue (cleaned and tokenized like training text)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", "-n", help="Tokens to generate at most "
                                                 "[default: 64]; fewer if the context fills up."),
    greedy: Optional[bool] = typer.Option(None, "--greedy/--sample", help="Argmax decoding instead of sampling."),
    temperature: Optional[float] = typer.Option(None, "--temperature", "-t", help="Sampling temperature > 0 (default 1.0)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Sample among the k most probable tokens (0 = all) (default 0)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling mass in (0, 1] (1 = off) (default 1.0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for reproducible sampling."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Re-run the whole sequence each step (slower; for checking)."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto (cuda when available)."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML/JSON file with SamplingConfig fields; options override it."),
) -> None:
    """Generate text from a prompt (greedy, temperature, top-k, top-p), streaming it as it is produced."""
    import sys
    import time

    import torch
    from rich.console import Console

    from gptcli.checkpoint import load_checkpoint
    from gptcli.config import from_dict, load_file
    from gptcli.errors import GPT1Error
    from gptcli.model.generate import SamplingConfig, generate

    err = Console(stderr=True)
    cfg = from_dict(SamplingConfig, load_file(config)) if config is not None else SamplingConfig()
    overrides = {"max_new_tokens": max_new_tokens, "greedy": greedy, "temperature": temperature, "top_k": top_k,
                 "top_p": top_p, "seed": seed}
    for k, v in overrides.items():
        if v is not None:
            setattr(cfg, k, v)
    if no_cache:
        cfg.use_cache = False
    try:
        cfg.validate()
    except ValueError as e:
        raise GPT1Error(str(e)) from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = load_checkpoint(checkpoint, map_location=device)
    tok = ckpt.tokenizer
    if tok is None:
        raise GPT1Error(f"{ckpt.path}: the checkpoint has no tokenizer/ directory; cannot turn the prompt into ids")
    ids = tok.encode(prompt)
    if not ids:
        raise GPT1Error("the prompt is empty after cleaning; GPT-1 needs at least one token to continue")
    n_ctx = ckpt.config.n_ctx
    if len(ids) >= n_ctx:
        err.print(f"[yellow]warning:[/] prompt has {len(ids)} tokens; keeping the last {n_ctx - 1} of the {n_ctx}-token context", soft_wrap=True)
        ids = ids[-(n_ctx - 1):]

    # Stream: print the decoded prompt (what the model sees: cleaned, lowercased), then each new piece of text as
    # the decoded continuation grows; decoding the whole sequence keeps spacing right for any tokenizer.
    prefix = tok.decode(ids)
    shown = len(prefix)
    out = sys.stdout
    out.write(prefix)
    out.flush()
    generated: list[int] = []

    def on_token(i: int) -> None:
        nonlocal shown
        generated.append(i)
        text = tok.decode(ids + generated)
        out.write(text[shown:])
        out.flush()
        shown = len(text)

    t0 = time.perf_counter()
    try:
        generate(ckpt.model, ids, cfg, vocab_limit=tok.vocab_size, on_token=on_token)
    except ValueError as e:
        raise GPT1Error(str(e)) from None
    dt = time.perf_counter() - t0
    out.write("\n")
    out.flush()
    rate = len(generated) / dt if dt > 0 else float("inf")
    mode = "greedy" if cfg.greedy else f"T={cfg.temperature} top-k={cfg.top_k} top-p={cfg.top_p}"
    err.print(f"[dim]{len(generated)} tokens in {dt:.2f} s ({rate:.1f} tokens/s, {mode}, "
              f"{'KV cache' if cfg.use_cache else 'no cache'}, {device})[/]", highlight=False, soft_wrap=True)
