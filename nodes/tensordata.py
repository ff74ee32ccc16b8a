"""In-memory map-style datasets and the DataLoader collate that keeps them fast.

This module imports torch at import time: node modules import it lazily, inside functions.

``XpuTensorDataset`` is an ordinary map-style dataset (``__len__`` / ``__getitem__``), so any sampler
(RandomSampler, and later DistributedSampler under ddp) works over it. It also implements
``__getitems__``, which torch's DataLoader calls with a whole batch of indices: one tensor gather per
batch instead of one ``__getitem__`` per sample plus a stack, which is what makes the data side of a
training step cheap. ``collate`` passes such a ready batch through and falls back to torch's
``default_collate`` for any other dataset.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate


class _ReadyBatch(tuple):
    """A batch ``(x, y)`` that ``__getitems__`` already gathered; ``collate`` unwraps it."""

    __slots__ = ()


class XpuTensorDataset(Dataset):
    """Inputs ``x`` (N, ...) and targets ``y`` (N, ...) held in memory, plus the dataset ``info``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, info: dict[str, Any]) -> None:
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
        self.x = x.contiguous()
        self.y = y.contiguous()
        self.info = dict(info)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]) -> _ReadyBatch:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return _ReadyBatch((self.x.index_select(0, idx), self.y.index_select(0, idx)))

    def __repr__(self) -> str:
        return (
            f"XpuTensorDataset({self.info.get('name', '?')}, split={self.info.get('split', '?')}, "
            f"n={len(self)}, x={tuple(self.x.shape[1:])}, y={self.y.dtype})"
        )


def collate(batch: Any) -> Any:
    """DataLoader ``collate_fn``: pass a gathered batch through, collate anything else as torch does."""
    if isinstance(batch, _ReadyBatch):
        return [batch[0], batch[1]]
    return default_collate(batch)
