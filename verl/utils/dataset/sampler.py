"""Samplers whose position can be checkpointed, so a resumed run sees exactly the same prompts.

``ResumableRandomSampler`` is LUFFY's sampler (docs/METHOD.md §1.1 item 5): a ``torch.randperm`` per epoch from
a ``torch.Generator`` seeded 47, walked with a cursor; ``ResumableSequentialSampler`` is the
``shuffle=False`` variant. The state (order, cursor, generator state, epoch) goes into ``data.pt``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Optional

import torch
from torch.utils.data import Sampler


class ResumableSequentialSampler(Sampler[int]):
    """Indices 0..N-1 every epoch, with a persisted cursor.

    The cursor counts indices handed out. With a ``DataLoader(num_workers=0)`` that is exactly the
    rows of the batches consumed so far; with worker processes the loader prefetches ahead, so save
    the state only with ``num_workers=0`` (the trainer's setting).

    ``batch_size``/``drop_last`` mirror the DataLoader's: when fewer than ``batch_size`` indices are
    left and they would be dropped, a new ``__iter__`` starts the next epoch right away. This makes a
    run resumed right after an epoch's last full batch continue exactly like an uninterrupted one.
    """

    def __init__(self, data_len: int, batch_size: Optional[int] = None, drop_last: bool = False):
        if data_len <= 0:
            raise ValueError(f"sampler needs a non-empty dataset, got data_len={data_len}")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self.data_len = data_len
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.epoch = 0
        self.perm_index = 0
        self.perm = self._new_order()

    def _new_order(self) -> torch.Tensor:
        return torch.arange(self.data_len)

    def _epoch_exhausted(self) -> bool:
        remaining = len(self.perm) - self.perm_index
        if remaining <= 0:
            return True
        return bool(self.drop_last and self.batch_size is not None and remaining < self.batch_size)

    def __iter__(self) -> Iterator[int]:
        if self._epoch_exhausted():
            self.perm = self._new_order()
            self.perm_index = 0
            self.epoch += 1
        while self.perm_index < len(self.perm):
            self.perm_index += 1
            yield int(self.perm[self.perm_index - 1])

    def __len__(self) -> int:
        return self.data_len

    def state_dict(self) -> dict[str, Any]:
        return {
            "perm": self.perm.clone(),
            "perm_index": self.perm_index,
            "epoch": self.epoch,
            "data_len": self.data_len,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("perm", "perm_index", "epoch"):
            if key not in state:
                raise ValueError(f"sampler state has no {key!r} key (keys: {sorted(state)})")
        if state.get("data_len", len(state["perm"])) != self.data_len:
            raise ValueError(
                f"sampler state is for a dataset of {state.get('data_len', len(state['perm']))} rows, this one has {self.data_len}"
            )
        self.perm = torch.as_tensor(state["perm"]).clone()
        self.perm_index = int(state["perm_index"])
        self.epoch = int(state["epoch"])


class ResumableRandomSampler(ResumableSequentialSampler):
    """A fresh ``torch.randperm`` per epoch from a seeded generator (LUFFY: seed 47)."""

    def __init__(self, data_len: int, seed: int = 47, batch_size: Optional[int] = None, drop_last: bool = False):
        self.seed = seed
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        super().__init__(data_len, batch_size=batch_size, drop_last=drop_last)

    def _new_order(self) -> torch.Tensor:
        return torch.randperm(self.data_len, generator=self.generator)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["generator_state"] = self.generator.get_state()
        state["seed"] = self.seed
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "generator_state" not in state:
            raise ValueError(
                "random sampler state has no 'generator_state' key (was it saved by the sequential sampler?)"
            )
        super().load_state_dict(state)
        self.generator.set_state(state["generator_state"])
        self.seed = state.get("seed", self.seed)


def build_sampler(
    data_len: int, shuffle: bool, seed: int = 47, batch_size: Optional[int] = None, drop_last: bool = False
):
    """``data.shuffle`` → the random sampler (seeded), else the sequential one."""
    if shuffle:
        return ResumableRandomSampler(data_len, seed=seed, batch_size=batch_size, drop_last=drop_last)
    return ResumableSequentialSampler(data_len, batch_size=batch_size, drop_last=drop_last)
