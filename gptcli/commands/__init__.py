"""One module per `gpt1` subcommand, each exposing a Typer function named ``command``.

Rule for this package: parse options into config dataclasses, call the library, render results. No training,
data or model logic lives here.
"""
