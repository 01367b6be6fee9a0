"""`gpt1 convert`: import Hugging Face or original OpenAI GPT-1 weights, or export a checkpoint to Hugging Face.

Options are derived from ConvertConfig (gptcli/interop/convert.py); the conversion itself is ``convert(cfg)``.
"""

from __future__ import annotations

from rich.console import Console

from gptcli.commands.options import Options, Parsed
from gptcli.commands.render import stderr_console
from gptcli.errors import GPT1Error
from gptcli.interop.convert import ConvertConfig, ConvertResult

OPTIONS = Options(
    ConvertConfig,
    panels={
        "Input": ("from_format", "to_format", "tokenizer"),
        "Model": ("n_head",),
        "Output": ("out", "overwrite"),
    },
    flags={"from_format": ("--from",), "to_format": ("--to",), "out": ("--out", "-o"), "overwrite": ("--overwrite",)},
    arguments=("src",),
    # A conversion is one action on named files, all on the command line; there is nothing to keep in a file.
    config_option=False,
)


def run(p: Parsed) -> None:
    """Convert GPT-1 weights: [bold]--from hf|openai SRC --out CKPT[/] or [bold]--to hf CKPT --out DIR[/]."""
    from gptcli.interop.convert import convert
    from gptcli.interop.hub import convert_from_hub, hub_id_of

    cfg = p.resolve(ConvertConfig)
    console = stderr_console()
    cfg.check()  # before the spinner: a usage error is one line, not a spinner and a line
    if cfg.tokenizer is not None and cfg.from_format != "openai":  # read by --from openai alone: never ignored
        raise GPT1Error(
            "--tokenizer is read with --from openai only (leave it out: a Hugging Face directory brings its own "
            "tokenizer files, and --to hf exports the checkpoint's)"
        )
    hub = hub_id_of(cfg.src) if cfg.from_format == "hf" and cfg.src else None
    if hub is not None:  # a local path of the same spelling would have won; huggingface_hub shows the download
        result = convert_from_hub(cfg, hub)
    else:
        with console.status(f"reading {cfg.src} …"):
            result = convert(cfg)
    render(console, result)


command = OPTIONS.command(run)


def render(console: Console, result: ConvertResult) -> None:
    """Warnings first, then what was written."""
    from gptcli.commands.render import escape

    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    if result.format == "hf":
        console.print(
            f"wrote Hugging Face openai-gpt directory [bold]{escape(str(result.path))}[/]",
            highlight=False,
            soft_wrap=True,
        )
        return
    c = result.config
    assert c is not None  # an import always reports its model
    console.print(
        f"wrote gpt1 checkpoint [bold]{escape(str(result.path))}[/] ({result.params:,} parameters, {c.n_layer} layers, "
        f"d={c.n_embd}, vocab {c.vocab_size}+{c.n_special}, context {c.n_ctx})",
        highlight=False,
        soft_wrap=True,
    )
