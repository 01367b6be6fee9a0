"""The fast CPU kernels installed in a model or a lone layer in a test, whatever $GPT1_KERNELS says."""

from __future__ import annotations

from typing import TypeVar

import torch.nn as nn

M = TypeVar("M", bound=nn.Module)


def applied(model: M) -> M:
    """``model`` with the kernels' forms swapped in (each computes by its kernel under ``auto``, by the reference
    under ``reference``)."""
    from gptcli.model.kernels import layers

    layers.install(model)  # also a lone layer, which ``kernels.apply`` (for whole gpt1 models) leaves alone
    return model
