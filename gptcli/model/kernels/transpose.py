"""Dense transposed copies of 2-D CPU matrices by ``transpose.cpp``'s 16 × 16 AVX-512 tiles.

Reference: ``x.t().contiguous()``, PyTorch's strided copy, element by element, several times slower than these
tiles on bf16 weights and on the tied output layer's float32 logit gradient (docs/performance.md, "Kernels"). Two
kinds of products take their operands so: the AMX bf16 weight gradients (``linear.py``, ``tied.py``), which oneDNN
runs far slower from a transposed view, and oneDNN's float32 gradient products (``onednn.py``), whose op copies a
transposed view itself by PyTorch's copy. The copy is exact either way.
"""

from __future__ import annotations

import torch

from gptcli.model.kernels import native


def transposed(x: torch.Tensor, dtype: torch.dtype | None = None, columns: int | None = None) -> torch.Tensor:
    """A dense ``x[:, :columns].t()`` (all columns by default) of a 2-D bf16 or float32 CPU ``x``, in ``dtype``
    (default ``x``'s; a bf16 ``x`` also into float32), by ``transpose.cpp``; PyTorch's copy where the library is not
    built (the AMX head's plain-PyTorch form, ``tied.py``, on any CPU). A fresh tensor, not a view: autograd may
    then add another gradient into it in place."""
    dtype = x.dtype if dtype is None else dtype
    columns = x.size(1) if columns is None else columns
    out = torch.empty(columns, x.size(0), dtype=dtype, device=x.device)
    lib = native.library_for(x.device, x.dtype)
    if lib is None or (x.dtype == torch.float32 and dtype != torch.float32):
        return out.copy_(x[:, :columns].t())
    if x.dtype == torch.float32:
        return lib.transpose_f32(x.contiguous(), out)
    return lib.transpose_bf16(x.contiguous(), out)
