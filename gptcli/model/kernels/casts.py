"""The kernels' low-precision copies of the weights, made once per update rather than once per micro-batch.

Autocast keeps the bf16 copy of each weight it casts until its outermost region ends, and the trainer holds one region
open across an update's micro-batches (``gptcli.system.runtime.shared_casts``), so a weight is cast once per update. The
AMX forms (``linear.py``'s ``_AmxLinear``, ``tied.py``'s ``_AmxPaddedProduct``) and, under bf16 autocast on any CPU, the
tied output layer's linked product (``tied.py``'s ``_LinkedProduct``) cast their weights themselves, outside autocast,
where its cache does not reach: without this module each micro-batch cast all of GPT-1's weights again
(docs/performance.md, "Kernels"). :func:`shared_copies` is the same cache for them, opened by the trainer around the
same micro-batches (``kernels.shared_weight_casts``); outside it :func:`copy_of` casts every time, as before.

A copy is reused only for the very tensor it was made from and only while that tensor's version counter is
unchanged, so a weight written in place within the region (by anything that goes through autograd's version
counting) is cast again. The copies are released when the outermost region ends — as autocast's are — after the
update's last backward pass has used them, before the optimizer changes the weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

_copies: dict[tuple[int, str], tuple[torch.Tensor, int, torch.Tensor]] | None = None
"""(id of the weight, which copy) → (the weight, its version when copied, the copy); None outside a region."""


@contextlib.contextmanager
def shared_copies() -> Iterator[None]:
    """A region (nestable) within which :func:`copy_of` makes each weight's copy once."""
    global _copies
    outermost = _copies is None
    if outermost:
        _copies = {}
    try:
        yield
    finally:
        if outermost:
            _copies = None


def copy_of(weight: torch.Tensor, kind: str, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``make(weight)`` — inside :func:`shared_copies`, the one made earlier for this weight and ``kind`` while the
    weight has not been written since."""
    if _copies is None:
        return make(weight)
    key = (id(weight), kind)
    hit = _copies.get(key)
    if hit is not None and hit[0] is weight and hit[1] == weight._version:
        return hit[2]
    copy = make(weight)
    _copies[key] = (weight, weight._version, copy)
    return copy
