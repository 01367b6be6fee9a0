"""gpt1: a faithful, end-to-end reproduction of GPT-1 (Radford et al. 2018).

The package is a library first; ``gptcli.cli`` is a thin command-line layer over it.
Heavy modules (torch, spaCy) are imported lazily so ``gpt1 --help`` stays fast.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Public names, resolved on first access (PEP 562) to keep `import gptcli` cheap.
_LAZY = {
    "GPT": "gptcli.model.gpt",
    "ModelConfig": "gptcli.model.gpt",
    "Tokenizer": "gptcli.tokenizers",
    "load_tokenizer": "gptcli.tokenizers",
    "load_checkpoint": "gptcli.checkpoint",
    "save_checkpoint": "gptcli.checkpoint",
    "open_corpus": "gptcli.data.shards",
    "get_task": "gptcli.tasks",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gptcli' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
