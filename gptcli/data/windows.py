"""Random contiguous token windows for pretraining: without replacement within an epoch, resumable, rank-aware.

Paper (reference §3): minibatches of randomly sampled contiguous sequences. Each shard's flat token array is cut
into windows of ``seq_len + 1`` tokens (inputs plus the shifted targets) on a grid of stride ``seq_len``, shifted by
a random offset in ``[0, seq_len)`` each epoch so that successive epochs see different boundaries. Every shard has
the same number of windows whatever the offset, so the run's step count is known up front (the cosine schedule
needs it).

An epoch is one permutation of all windows of the split, drawn from ``(seed, epoch)`` alone, so the sampler's whole
state is ``{"seed", "epoch", "position"}`` (the *global* position in that permutation). Rank ``r`` of ``W`` takes
the ``r``-th of ``W`` equal slices of each global batch: ranks draw disjoint windows and a run can resume with
another world size as long as the global batch is unchanged. Windows may cross documents inside a shard, never
shards; an epoch's final partial batch is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gptcli.errors import GPT1Error


class WindowSampler:
    """Draws global batches of ``(n, seq_len + 1)`` windows from memory-mapped token arrays."""

    def __init__(
        self,
        arrays: Sequence[np.ndarray],
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size % world_size != 0:
            raise GPT1Error(f"global batch {batch_size} is not divisible by the world size {world_size}")
        self.arrays = list(arrays)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.per_shard = np.array([max(0, len(a) // seq_len - 1) for a in self.arrays], dtype=np.int64)
        self.cum = np.concatenate([[0], np.cumsum(self.per_shard)])
        self.num_windows = int(self.cum[-1])
        self.steps_per_epoch = self.num_windows // batch_size
        if self.steps_per_epoch == 0:
            raise GPT1Error(
                f"the training split has {self.num_windows} windows of {seq_len + 1} tokens, fewer than one batch of "
                f"{batch_size}: use a larger corpus or a smaller --batch-size/--seq-len"
            )
        self.epoch = 0
        self.position = 0  # global index into this epoch's permutation
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None
        self._offset = 0

    # --- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise GPT1Error(f"sampler seed {state['seed']} in the checkpoint differs from the run's seed {self.seed}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])

    # --- drawing ----------------------------------------------------------------------------------------------
    def _epoch_plan(self) -> tuple[np.ndarray, int]:
        if self._perm_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._offset = int(rng.integers(0, self.seq_len))
            self._perm = rng.permutation(self.num_windows)
            self._perm_epoch = self.epoch
        assert self._perm is not None  # drawn with _perm_epoch, which starts as no epoch
        return self._perm, self._offset

    def window_starts(self, indices: np.ndarray, offset: int) -> list[tuple[int, int]]:
        """(shard, start token) of global window indices under a grid ``offset``."""
        shard = np.searchsorted(self.cum, indices, side="right") - 1
        local = indices - self.cum[shard]
        return [(int(s), int(offset + k * self.seq_len)) for s, k in zip(shard, local)]

    def next_indices(self) -> tuple[np.ndarray, int]:
        """This rank's window indices of the next global batch and the grid offset; advances the state."""
        if self.position + self.batch_size > self.steps_per_epoch * self.batch_size:
            self.epoch += 1
            self.position = 0
        perm, offset = self._epoch_plan()
        per_rank = self.batch_size // self.world_size
        lo = self.position + self.rank * per_rank
        idx = perm[lo : lo + per_rank]
        self.position += self.batch_size
        return idx, offset

    def next_batch(self) -> torch.Tensor:
        """This rank's share of the next global batch as an int64 tensor ``(batch/world, seq_len + 1)``."""
        idx, offset = self.next_indices()
        out = np.empty((len(idx), self.seq_len + 1), dtype=np.int64)
        for row, (s, start) in enumerate(self.window_starts(idx, offset)):
            out[row] = self.arrays[s][start : start + self.seq_len + 1]
        return torch.from_numpy(out)
