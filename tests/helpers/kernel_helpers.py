"""The fast CPU kernels applied to a model in a test, whatever $GPT1_KERNELS says (``gptcli.model.kernels.apply``)."""

from __future__ import annotations

from typing import TypeVar

import torch.nn as nn

from gptcli.model import kernels

M = TypeVar("M", bound=nn.Module)


def applied(model: M) -> M:
    """``model`` with the kernels' forms swapped in (each computes by its kernel under ``auto``, by the reference
    under ``reference``)."""
    with kernels.use_kernels("auto"):
        kernels.apply(model, "cpu")
    return model
