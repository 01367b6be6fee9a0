"""A fine-tuned model: the language-model body (GPT-1, or the LSTM baseline) and its task head as one module,
and batched inference with it (paper §3.2).

Training and evaluation share this module: ``gptcli.train.finetune`` optimises a :class:`FinetuneModel` (one
optimizer, one state dict for body + head) and scores the dev split after every epoch with :func:`predict`;
``gptcli.eval.tasks`` rebuilds the same module from a fine-tuned checkpoint and predicts with the same function,
so a run's dev score and a later ``gpt1 eval`` of it agree exactly.

:func:`predict` takes ready batches (``gptcli.data.batching.iterate``) rather than examples, so the model room
needs nothing from the data room.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.nn as nn

from gptcli.model.gpt import GPT
from gptcli.model.heads import TaskHead
from gptcli.model.packed import Packing
from gptcli.model.packed_eval import final_states_at
from gptcli.progress import SILENT, Progress
from gptcli.system.runtime import autocast


class FinetuneModel(nn.Module):
    """The body (anything with ``forward(ids) → hidden`` and ``lm_logits``: GPT or LSTMLM) and its task head as one
    module (one optimizer, one state dict). The body is ``.gpt`` whatever its architecture: the name is part of the
    fine-tuning code's vocabulary (``run.model.gpt``) and of the best epoch's saved weights."""

    def __init__(self, gpt: nn.Module, head: TaskHead) -> None:
        super().__init__()
        self.gpt = gpt
        self.head = head

    def forward(
        self, ids: torch.Tensor, n_seqs: int, packing: Packing | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(head outputs, final hidden states): the states also feed the auxiliary LM loss while training. With
        ``packing``, ``ids`` is one row of the batch's sequences end to end (``gptcli.model.packed``); packed and
        in eval mode, the states are the extract tokens' only."""
        if packing is not None and not self.training:
            # Evaluation reads nothing but the extract tokens' final states: the last block computes only those
            # (``hidden`` is then their (1, B·S, d) states, in the head's order).
            hidden = final_states_at(cast(GPT, self.gpt), ids, packing, packing.extract)
            return self.head.score(hidden[0], n_seqs), hidden
        hidden = self.gpt(ids) if packing is None else self.gpt(ids, packing=packing)
        return self.head(hidden, ids, n_seqs, packing), hidden


@torch.no_grad()
def predict(
    model: FinetuneModel,
    batches: Iterable[Any],
    device: torch.device,
    precision: str = "fp32",
    progress: Progress | None = None,
) -> tuple[list[Any], list[list[float]]]:
    """Predictions (class/answer index, or score) and raw head outputs, ordered by the examples' ``index``.

    ``batches`` yields :class:`gptcli.data.batching.Batch`-like objects (``ids``, ``n_seqs``, ``index``, ``to``),
    usually ``iterate(encoded, batch_size, shuffle=False)``, which sorts by length: the ``index`` of each example
    (its position in the encoded list) puts the answers back in order. ``progress`` is advanced by the number of
    examples of every batch (the caller opens the stage).
    """
    report = progress or SILENT
    model.eval()
    preds: dict[int, Any] = {}
    outs: dict[int, list[float]] = {}
    # One autocast region for every batch: it keeps the low-precision copy of each weight it makes for the first
    # batch (the weights do not change here), where a region per batch would cast the whole model again each time.
    with autocast(device, precision):  # type: ignore[arg-type]
        for batch in batches:
            b = batch.to(device)
            out, _ = model(b.ids, b.n_seqs, b.packing)
            p = model.head.predict(out).cpu().tolist()
            o = out.float().cpu()
            o = o.unsqueeze(-1) if o.dim() == 1 else o
            for k, idx in enumerate(batch.index.tolist()):
                preds[idx] = p[k]
                outs[idx] = [round(v, 6) for v in o[k].tolist()]
            report.advance(len(p))
    order = sorted(preds)
    return [preds[i] for i in order], [outs[i] for i in order]


__all__ = ["FinetuneModel", "predict"]
