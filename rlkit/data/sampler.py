"""Deterministic, resumable batches of prompt rows.

Each epoch visits every row once in an order drawn from ``(seed, epoch)``, so the order of epoch ``e`` does
not depend on how many batches came before: a run resumed from ``state_dict()`` (epoch, position, seed)
draws exactly the prompts the uninterrupted run would have drawn. A batch that reaches the end of an epoch
is completed from the start of the next one, so every batch has ``batch_size`` rows and no row is skipped
(the price: a row can appear twice in a batch that straddles epochs, or when ``batch_size`` exceeds the
dataset).

Deliberate simplifications: one process draws the prompts (data-parallel ranks receive rollouts, not
prompts); no weighting or curriculum.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
from datasets import Dataset

from rlkit.notebook.html import CodeRepr

Rows = Union[Dataset, Sequence[dict[str, Any]]]


class PromptSampler(CodeRepr):
    """``next_batch()`` returns ``batch_size`` row dicts (``next_batch(n)``: n of them, for a caller whose batch
    size changes mid-run); ``state_dict()`` / ``load_state_dict()`` resume it."""

    def __init__(self, dataset: Rows, batch_size: int, seed: int = 0):
        if len(dataset) == 0:
            raise ValueError("PromptSampler needs a non-empty dataset")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.epoch, self.position = 0, 0  # next row is order(epoch)[position]
        self._order_cache: tuple[int, np.ndarray] = (-1, np.empty(0, dtype=np.int64))

    def __len__(self) -> int:
        """Number of rows in the dataset."""
        return len(self.dataset)

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_cache[0] != epoch:
            self._order_cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self)))
        return self._order_cache[1]

    def next_indices(self, n: Optional[int] = None) -> list[int]:
        """The dataset indices of the next ``n`` rows (default ``batch_size``; advances the sampler)."""
        n = self.batch_size if n is None else n
        out: list[int] = []
        while len(out) < n:
            take = min(n - len(out), len(self) - self.position)
            out.extend(self._order(self.epoch)[self.position : self.position + take].tolist())
            self.position += take
            if self.position == len(self):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def next_batch(self, n: Optional[int] = None) -> list[dict[str, Any]]:
        """The next ``n`` rows (default ``batch_size``), as fresh dicts (editing them leaves the dataset untouched)."""
        indices = self.next_indices(n)
        if isinstance(self.dataset, Dataset):
            return self.dataset.select(indices).to_list()
        return [dict(self.dataset[i]) for i in indices]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_rows": len(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``; the dataset must have the same number of rows as when it was saved."""
        if state.get("num_rows", len(self)) != len(self):
            raise ValueError(f"this sampler state was saved over {state['num_rows']} rows but the dataset has "
                             f"{len(self)}; resume with the same dataset (same file, seed and split)")
        if not 0 <= state["position"] < len(self) or state["epoch"] < 0:
            raise ValueError(f"invalid sampler state {state}: need epoch >= 0 and 0 <= position < {len(self)}")
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        self._order_cache = (-1, self._order_cache[1])

    def __repr__(self) -> str:
        return (f"PromptSampler(rows={len(self)}, batch_size={self.batch_size}, seed={self.seed}, "
                f"epoch={self.epoch}, position={self.position})")
