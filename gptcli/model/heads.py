"""Task heads: a linear layer ``W_y`` on the final block's state at the first extract token (paper §3.2–3.3).

- classification / entailment: ``softmax(h_e · W_y)`` over the task's labels;
- similarity: the two orders' extract states are *summed* element-wise before ``W_y`` (§3.3);
- regression (STS-B): as similarity with a 1-output ``W_y`` trained with squared error on the score scaled to
  [0, 1] by ``target_range`` (predictions are mapped back and clipped to the range);
- multiple choice: a shared 1-output ``W_y`` scores every answer's sequence; softmax over the answers.

Classifier dropout (0.1) sits before ``W_y``. For multiple choice one dropout mask is shared by an example's
answers, as the released code does (``noise_shape [B, 1, d]``), so answers are compared under the same mask.
``W_y`` is initialised N(0, 0.02) with a zero bias, like the released ``clf`` layer.

The extract position is found from the ids (``argmax(ids == extract_id)``, the first occurrence, as the
released code's ``pool_idx``), so the head never depends on how a batch was padded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model.dropout import Dropout
from gptcli.model.packed import Packing


@dataclass
class HeadConfig:
    kind: str
    """Task kind: classification, entailment, similarity, multiple_choice or regression."""
    n_embd: int
    """Width of the model's hidden states."""
    n_labels: int = 2
    """Classes (classification/entailment/similarity); ignored by multiple choice and regression (1 output)."""
    extract_id: int = 0
    """Id of the extract token ``<e>``."""
    pdrop: float = 0.1
    """Classifier dropout before ``W_y`` (paper: 0.1)."""
    init_std: float = 0.02
    """Std of the N(0, σ) init of ``W_y``."""
    target_range: tuple[float, float] = (0.0, 5.0)
    """Regression only: the label range, scaled to [0, 1] for training (STS-B: 0–5)."""

    @property
    def n_out(self) -> int:
        return 1 if self.kind in ("multiple_choice", "regression") else self.n_labels

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_range"] = list(self.target_range)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> HeadConfig:
        d = dict(d)
        if "target_range" in d:
            d["target_range"] = tuple(d["target_range"])
        return cls(**d)


def first_extract_positions(ids: torch.Tensor, extract_id: int) -> torch.Tensor:
    """(N,) index of the first ``extract_id`` in each row of ``ids`` (N, T).

    A row without one is refused where that costs nothing: on the CPU. On a GPU the check would make the host wait
    for the device in every forward pass; there the rows come from gpt1's own input transformations, which end
    every sequence with the extract token."""
    hit = ids == extract_id
    if ids.device.type == "cpu" and not bool(hit.any(1).all()):
        raise ValueError("every sequence must contain the extract token")
    return hit.to(torch.int8).argmax(1)


class TaskHead(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.drop = Dropout(config.pdrop)  # a module, so that the CPU kernels can replace it (kernels.apply)
        self.linear = nn.Linear(config.n_embd, config.n_out)
        nn.init.normal_(self.linear.weight, 0.0, config.init_std)
        nn.init.zeros_(self.linear.bias)

    @property
    def drop_p(self) -> float:
        """The classifier dropout's probability."""
        return self.drop.p

    @drop_p.setter
    def drop_p(self, p: float) -> None:
        self.drop.p = p

    def pooled(self, hidden: torch.Tensor, ids: torch.Tensor, packing: Packing | None = None) -> torch.Tensor:
        """(N, d) final states at the first extract token of each sequence (of a packed row: where ``packing``
        located them on the host)."""
        if packing is not None:
            return hidden[0].index_select(0, packing.extract)
        pos = first_extract_positions(ids, self.config.extract_id)
        return hidden[torch.arange(hidden.size(0), device=hidden.device), pos]

    def forward(
        self, hidden: torch.Tensor, ids: torch.Tensor, n_seqs: int, packing: Packing | None = None
    ) -> torch.Tensor:
        """Logits (B, n_labels), answer scores (B, n_choices) or regression outputs (B,) in [0, 1] units."""
        return self.score(self.pooled(hidden, ids, packing), n_seqs)

    def score(self, h: torch.Tensor, n_seqs: int) -> torch.Tensor:
        """:meth:`forward` from the extract states ``h`` (B·S, d), every example's sequences in turn."""
        B = h.size(0) // n_seqs
        kind = self.config.kind
        if kind in ("similarity", "regression"):
            h = h.view(B, n_seqs, -1).sum(1)
        elif kind == "multiple_choice":
            h = h.view(B, n_seqs, -1)
            if self.training and self.drop_p > 0:
                # One mask per example, shared by its choices (as the released code's dropout noise_shape).
                h = self.drop(h, noise_shape=(B, 1, h.size(-1)))
            return self.linear(h).squeeze(-1)  # (B, S)
        h = self.drop(h)
        out = self.linear(h)
        return out.squeeze(-1) if kind == "regression" else out

    def loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean task loss: cross-entropy over classes/answers, squared error for regression."""
        if self.config.kind == "regression":
            return F.mse_loss(out.float(), self.scale_target(labels).float())
        return F.cross_entropy(out.float(), labels)

    def scale_target(self, y: torch.Tensor) -> torch.Tensor:
        lo, hi = self.config.target_range
        return (y - lo) / (hi - lo)

    def predict(self, out: torch.Tensor) -> torch.Tensor:
        """Predicted class / answer index, or the regression score in label units clipped to the range."""
        if self.config.kind == "regression":
            lo, hi = self.config.target_range
            return (out.float() * (hi - lo) + lo).clamp(lo, hi)
        return out.argmax(-1)
