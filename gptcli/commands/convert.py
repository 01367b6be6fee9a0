"""`gpt1 convert`: import Hugging Face or original OpenAI GPT-1 weights, or export a checkpoint to Hugging Face."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

FORMATS_IN = ("hf", "openai")
FORMATS_OUT = ("hf",)


def command(
    src: str = typer.Argument(..., help="What to convert: a Hugging Face directory or hub id (--from hf), an original "
                              "release directory (--from openai), or a gpt1 checkpoint (--to hf)."),
    from_: Optional[str] = typer.Option(None, "--from", help="Import from: 'hf' (openai-gpt checkpoint: config.json + "
                                        "model.safetensors/pytorch_model.bin + vocab.json + merges.txt) or 'openai' "
                                        "(params_*.npy + params_shapes.json + the two BPE files)."),
    to: Optional[str] = typer.Option(None, "--to", help="Export to: 'hf' (a directory transformers can load)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write: a gpt1 checkpoint (--from) or a Hugging Face "
                             "directory (--to)."),
    n_head: int = typer.Option(12, "--n-head", help="Attention heads (--from openai only; the release does not record "
                               "it; GPT-1 has 12)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Directory with the BPE files if they are not next "
                                             "to the weights (--from openai only)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it already exists."),
) -> None:
    """Convert GPT-1 weights: [bold]--from hf|openai SRC --out CKPT[/] or [bold]--to hf CKPT --out DIR[/]."""
    from rich.console import Console
    from rich.markup import escape

    from gptcli.errors import GPT1Error

    console = Console(stderr=True)
    if (from_ is None) == (to is None):
        raise GPT1Error("give exactly one of --from (hf, openai) or --to (hf)")
    if from_ is not None and from_ not in FORMATS_IN:
        raise GPT1Error(f"--from {from_!r}: expected one of {', '.join(FORMATS_IN)}")
    if to is not None and to not in FORMATS_OUT:
        raise GPT1Error(f"--to {to!r}: expected one of {', '.join(FORMATS_OUT)}")
    if out.exists() and not overwrite:
        raise GPT1Error(f"{out}: already exists (pass --overwrite to replace it)")

    from gptcli.interop import convert as conv

    if to == "hf":
        path, warnings = conv.to_hf(src, out)
        for w in warnings:
            console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
        console.print(f"wrote Hugging Face openai-gpt directory [bold]{escape(str(path))}[/]", highlight=False, soft_wrap=True)
        return
    with console.status(f"reading {src} …"):
        converted = conv.from_hf(src) if from_ == "hf" else conv.from_openai(src, n_head=n_head, tokenizer_dir=tokenizer)
    for w in converted.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    path = conv.convert_to_checkpoint(converted, out)
    c = converted.model.config
    console.print(
        f"wrote gpt1 checkpoint [bold]{escape(str(path))}[/] ({converted.model.num_params():,} parameters, {c.n_layer} layers, "
        f"d={c.n_embd}, vocab {c.vocab_size}+{c.n_special}, context {c.n_ctx})",
        highlight=False, soft_wrap=True,
    )
