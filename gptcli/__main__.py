"""`python -m gptcli` — the same entry point as the `gpt1` console script (and what torchrun launches)."""

from gptcli.cli import main

if __name__ == "__main__":
    main()
