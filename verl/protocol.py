"""DataProto: the batch container that travels between the single controller and its workers.

A DataProto holds equal-length rows in three parts: ``batch`` (a TensorDict of tensors whose first
dimension is the row), ``non_tensor_batch`` (numpy arrays, usually ``dtype=object``, same row count)
and ``meta_info`` (a plain dict of batch-level values). Worker groups chunk it across data-parallel
ranks and concatenate the answers; ``DataProtoFuture`` lets one group's output feed the next call
without passing through the driver.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from tensordict import TensorDict

from verl.protocol_values import (
    IndexLike,
    as_index_tensor,
    as_row_array,
    tensor_from_state,
    tensor_state,
    union_meta_info,
    union_numpy_dict,
    union_tensor_dict,
)

__all__ = [
    "DataProto",
    "DataProtoFuture",
    "DataProtoItem",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
    "union_tensor_dict",
    "union_numpy_dict",
]


@dataclasses.dataclass
class DataProtoItem:
    """One row of a DataProto (``data[i]``): a 0-dim TensorDict, the row's non-tensor values, meta."""

    batch: Optional[TensorDict] = None
    non_tensor_batch: dict = dataclasses.field(default_factory=dict)
    meta_info: dict = dataclasses.field(default_factory=dict)


class PerPart(list):
    """A ``meta_info`` value with one entry per part (e.g. per-rank worker timings): ``DataProto.concat`` joins
    these lists over the parts instead of keeping the first part's value. Any key may carry one."""


@dataclasses.dataclass
class DataProto:
    """Rows of tensors (``batch``) and numpy values (``non_tensor_batch``) plus batch-level ``meta_info``."""

    batch: Optional[TensorDict] = None
    non_tensor_batch: dict = dataclasses.field(default_factory=dict)
    meta_info: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    # ------------------------------------------------------------------ construction / checks
    @classmethod
    def from_dict(
        cls, tensors: Optional[dict] = None, non_tensors: Optional[dict] = None, meta_info: Optional[dict] = None
    ) -> "DataProto":
        """Build from ``{name: tensor}`` and ``{name: array|list}``; every entry needs the same row count."""
        tensors = dict(tensors or {})
        rows: Optional[int] = None
        first_key = None
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"tensor key '{key}' must be a torch.Tensor, got {type(value).__name__}")
            if value.ndim == 0:
                raise ValueError(f"tensor key '{key}' is a scalar; batch tensors need a leading row dimension")
            if rows is None:
                rows, first_key = value.shape[0], key
            elif value.shape[0] != rows:
                raise ValueError(f"tensor key '{key}' has {value.shape[0]} rows but '{first_key}' has {rows}")
        batch = TensorDict(tensors, batch_size=[rows]) if tensors else None
        arrays = {key: as_row_array(key, value) for key, value in (non_tensors or {}).items()}
        return cls(batch=batch, non_tensor_batch=arrays, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict, meta_info: Optional[dict] = None) -> "DataProto":
        """Split one dict into tensors (torch.Tensor) and non-tensors (numpy arrays, lists, tuples)."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(f"key '{key}': expected a tensor, numpy array or list, got {type(value).__name__}")
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    def check_consistency(self) -> None:
        """Raise a clear error unless every tensor and non-tensor entry has the same number of rows."""
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise TypeError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if len(self.batch.batch_size) != 1:
                raise ValueError(
                    f"DataProto.batch must have exactly one batch dimension, got {tuple(self.batch.batch_size)}"
                )
        if not isinstance(self.non_tensor_batch, dict):
            raise TypeError(f"DataProto.non_tensor_batch must be a dict, got {type(self.non_tensor_batch).__name__}")
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")
        reference = ("batch", self.batch.batch_size[0]) if self.batch is not None else None
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"non_tensor_batch['{key}'] must be a numpy array (use DataProto.from_dict to convert "
                    f"lists), got {type(value).__name__}"
                )
            if value.ndim == 0:
                raise ValueError(f"non_tensor_batch['{key}'] is a 0-d array; it needs one entry per row")
            if reference is None:
                reference = (f"non_tensor_batch['{key}']", value.shape[0])
            elif value.shape[0] != reference[1]:
                raise ValueError(
                    f"non_tensor_batch['{key}'] has {value.shape[0]} rows but {reference[0]} has {reference[1]}"
                )

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return int(next(iter(self.non_tensor_batch.values())).shape[0])
        return 0

    def __repr__(self) -> str:
        tensors = {k: tuple(v.shape) for k, v in self.batch.items()} if self.batch is not None else {}
        arrays = {k: v.dtype.name for k, v in self.non_tensor_batch.items()}
        return (
            f"DataProto(rows={len(self)}, tensors={tensors}, non_tensors={arrays}, "
            f"meta_info_keys={sorted(self.meta_info)})"
        )

    # ------------------------------------------------------------------ pickling (Ray, processes)
    def __getstate__(self) -> dict:
        batch_state = None
        if self.batch is not None:
            batch_state = {
                "tensors": {k: tensor_state(v) for k, v in self.batch.items()},
                "batch_size": list(self.batch.batch_size),
                "device": None if self.batch.device is None else str(self.batch.device),
            }
        return {"batch": batch_state, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict) -> None:
        batch_state = state["batch"]
        self.batch = (
            None
            if batch_state is None
            else TensorDict(
                {k: tensor_from_state(v) for k, v in batch_state["tensors"].items()},
                batch_size=batch_state["batch_size"],
                device=batch_state["device"],
            )
        )
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    # ------------------------------------------------------------------ row selection
    def __getitem__(self, item: Union[int, slice, IndexLike]) -> Union["DataProto", DataProtoItem]:
        """``int`` -> DataProtoItem; ``slice`` / index array / boolean mask -> DataProto."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            n = len(self)
            if not -n <= int(item) < n:
                raise IndexError(f"row {int(item)} is out of range for a DataProto of {n} rows")
            return DataProtoItem(
                batch=self.batch[int(item)] if self.batch is not None else None,
                non_tensor_batch={k: v[int(item)] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(f"DataProto indices must be int, slice or an index array, got {type(item).__name__}")

    def slice(self, start: Optional[int] = None, end: Optional[int] = None, step: Optional[int] = None) -> "DataProto":
        """Rows ``start:end:step`` (tensors are views of this DataProto's tensors)."""
        rows = slice(start, end, step)
        return DataProto(
            batch=self.batch[rows] if self.batch is not None else None,
            non_tensor_batch={k: v[rows] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def select_idxs(self, idxs: IndexLike) -> "DataProto":
        """Rows picked by integer indices (any order, repeats allowed) or by a boolean mask."""
        index = as_index_tensor(idxs, len(self))
        index_np = index.cpu().numpy()
        return DataProto(
            batch=self.batch[index] if self.batch is not None else None,
            non_tensor_batch={k: v[index_np] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def reorder(self, indices: torch.Tensor) -> None:
        """Permute the rows in place (e.g. the balanced order computed by seqlen balancing)."""
        index = as_index_tensor(indices, len(self))
        if index.numel() != len(self):
            raise ValueError(f"reorder needs {len(self)} indices (one per row), got {index.numel()}")
        reordered = self.select_idxs(index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    # ------------------------------------------------------------------ key selection
    def _require_keys(self, batch_keys, non_tensor_batch_keys, meta_info_keys, op: str) -> None:
        available = list(self.batch.keys()) if self.batch is not None else []
        for key in batch_keys or []:
            if key not in available:
                raise KeyError(f"DataProto.{op}: batch has no tensor '{key}' (available: {available})")
        for key in non_tensor_batch_keys or []:
            if key not in self.non_tensor_batch:
                raise KeyError(
                    f"DataProto.{op}: non_tensor_batch has no key '{key}' (available: {list(self.non_tensor_batch)})"
                )
        for key in meta_info_keys or []:
            if key not in self.meta_info:
                raise KeyError(f"DataProto.{op}: meta_info has no key '{key}' (available: {list(self.meta_info)})")

    def select(
        self,
        batch_keys: Optional[Sequence[str]] = None,
        non_tensor_batch_keys: Optional[Sequence[str]] = None,
        meta_info_keys: Optional[Sequence[str]] = None,
        deepcopy: bool = False,
    ) -> "DataProto":
        """A DataProto with only the named keys (``None`` keeps all of that part); ``deepcopy`` copies data."""
        self._require_keys(batch_keys, non_tensor_batch_keys, meta_info_keys, "select")
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = batch.select(*batch_keys)
        non_tensors = (
            self.non_tensor_batch
            if non_tensor_batch_keys is None
            else {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys}
        )
        meta = self.meta_info if meta_info_keys is None else {k: self.meta_info[k] for k in meta_info_keys}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensors, meta = copy.deepcopy(non_tensors), copy.deepcopy(meta)
        elif batch is self.batch and batch is not None:
            batch = batch.select(*batch.keys())
        return DataProto(batch=batch, non_tensor_batch=dict(non_tensors), meta_info=dict(meta))

    def pop(
        self,
        batch_keys: Optional[Sequence[str]] = None,
        non_tensor_batch_keys: Optional[Sequence[str]] = None,
        meta_info_keys: Optional[Sequence[str]] = None,
    ) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one (same rows)."""
        self._require_keys(batch_keys, non_tensor_batch_keys, meta_info_keys, "pop")
        batch = None
        if batch_keys:
            batch = TensorDict({k: self.batch.pop(k) for k in batch_keys}, batch_size=self.batch.batch_size)
        return DataProto(
            batch=batch,
            non_tensor_batch={k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys or []},
            meta_info={k: self.meta_info.pop(k) for k in meta_info_keys or []},
        )

    def rename(self, old_keys: Union[str, Sequence[str]], new_keys: Union[str, Sequence[str]]) -> "DataProto":
        """Rename batch tensors in place; returns self."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename: {len(old)} old keys but {len(new)} new keys")
        self._require_keys(old, None, None, "rename")
        for before, after in zip(old, new):
            self.batch.rename_key_(before, after)
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Merge other's keys into self (in place, returns self); a shared key must hold equal values."""
        if not isinstance(other, DataProto):
            raise TypeError(f"union expects a DataProto, got {type(other).__name__}")
        self_has_rows = self.batch is not None or bool(self.non_tensor_batch)
        other_has_rows = other.batch is not None or bool(other.non_tensor_batch)
        if self_has_rows and other_has_rows and len(self) != len(other):
            raise ValueError(f"union: DataProtos have different row counts ({len(self)} vs {len(other)})")
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            self.batch = union_tensor_dict(self.batch, other.batch)
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = union_meta_info(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ splitting / joining
    def chunk(self, chunks: int) -> list["DataProto"]:
        """``chunks`` equal consecutive pieces; the row count must be divisible (pad first otherwise)."""
        if not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
        if len(self) % chunks != 0:
            raise ValueError(
                f"chunk: {len(self)} rows cannot be split into {chunks} equal chunks; "
                f"use pad_dataproto_to_divisor(data, {chunks}) first"
            )
        size = len(self) // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive pieces of ``split_size`` rows (the last one may be shorter)."""
        if not isinstance(split_size, int) or split_size <= 0:
            raise ValueError(f"split: split_size must be a positive int, got {split_size!r}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"]) -> "DataProto":
        """Stack DataProtos row-wise; all must have the same keys. meta_info comes from the first, except
        ``PerPart`` values, whose lists are joined over the parts."""
        data = list(data)
        if not data:
            raise ValueError("concat needs at least one DataProto")
        for i, item in enumerate(data):
            if not isinstance(item, DataProto):
                raise TypeError(f"concat: item {i} is a {type(item).__name__}, not a DataProto")
        first = data[0]
        first_tensor_keys = set(first.batch.keys()) if first.batch is not None else None
        for i, item in enumerate(data[1:], start=1):
            keys = set(item.batch.keys()) if item.batch is not None else None
            if keys != first_tensor_keys:
                raise ValueError(
                    f"concat: item {i} has tensor keys {sorted(keys or [])} but item 0 has "
                    f"{sorted(first_tensor_keys or [])}"
                )
            if item.non_tensor_batch.keys() != first.non_tensor_batch.keys():
                raise ValueError(
                    f"concat: item {i} has non-tensor keys {sorted(item.non_tensor_batch)} but item 0 "
                    f"has {sorted(first.non_tensor_batch)}"
                )
        batch = torch.cat([d.batch for d in data], dim=0) if first.batch is not None else None
        non_tensors = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in first.non_tensor_batch}
        meta = dict(first.meta_info)
        for key, value in first.meta_info.items():  # per-rank lists: keep every part's entries, in order
            if isinstance(value, PerPart):
                meta[key] = PerPart(entry for d in data for entry in d.meta_info.get(key, []))
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Repeat every row: interleaved ``a a b b`` (GRPO groups) or tiled ``a b a b``."""
        if not isinstance(repeat_times, int) or repeat_times <= 0:
            raise ValueError(f"repeat: repeat_times must be a positive int, got {repeat_times!r}")
        n = len(self)
        if interleave:
            index = torch.arange(n).repeat_interleave(repeat_times)
        else:
            index = torch.arange(n).repeat(repeat_times)
        return self.select_idxs(index) if n else self.slice()

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: Optional[int] = None, dataloader_kwargs: Optional[dict] = None
    ) -> Iterator["DataProto"]:
        """Yield mini-batches for ``epochs`` passes; ``dataloader_kwargs={'shuffle': True}`` reshuffles each
        epoch with a generator seeded by ``seed``."""
        if not isinstance(mini_batch_size, int) or mini_batch_size <= 0:
            raise ValueError(f"make_iterator: mini_batch_size must be a positive int, got {mini_batch_size!r}")
        if len(self) % mini_batch_size != 0:
            raise ValueError(f"make_iterator: {len(self)} rows are not divisible by mini_batch_size={mini_batch_size}")
        from torch.utils.data import DataLoader

        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        loader = DataLoader(
            range(len(self)),
            batch_size=mini_batch_size,
            collate_fn=torch.tensor,
            generator=generator,
            **(dataloader_kwargs or {}),
        )

        def batches() -> Iterator[DataProto]:
            for _ in range(epochs):
                for index in loader:
                    yield self.select_idxs(index)

        return batches()

    def to(self, device: Union[str, torch.device]) -> "DataProto":
        """Move the tensors to ``device`` (in place); returns self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the leading rows until the row count divides ``size_divisor``; returns (data, pad)."""
    if not isinstance(size_divisor, int) or size_divisor <= 0:
        raise ValueError(f"size_divisor must be a positive int, got {size_divisor!r}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    if n == 0:
        raise ValueError("cannot pad an empty DataProto: there are no rows to repeat")
    pieces = [data]
    remaining = pad_size
    while remaining > 0:
        take = min(remaining, n)
        pieces.append(data.slice(0, take))
        remaining -= take
    return DataProto.concat(pieces), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the ``pad_size`` trailing rows added by ``pad_dataproto_to_divisor``."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size {pad_size} is out of range for {len(data)} rows")
    return data.slice(0, len(data) - pad_size) if pad_size else data


def _take_chunk(
    data: DataProto, index: int, chunks: int, previous: Optional[Callable[[DataProto], DataProto]] = None
) -> DataProto:
    if previous is not None:
        data = previous(data)
    return data.chunk(chunks)[index]


@dataclasses.dataclass
class DataProtoFuture:
    """A DataProto still being computed by Ray actors: ``futures`` are their ObjectRefs, ``collect_fn``
    merges the results and ``dispatch_fn`` (if set) picks this rank's share. ``group_name``,
    ``method_name`` and ``ranks`` name the producers in error messages.

    Passed as an argument of a worker-group call, it travels to the workers unresolved and each worker
    resolves it there (see ``register(materialize_futures=True)``), so the data skips the driver.
    """

    collect_fn: Callable[[list], DataProto]
    futures: list
    dispatch_fn: Optional[Callable[[DataProto], DataProto]] = None
    group_name: str = "DataProtoFuture"
    method_name: str = "(unknown method)"
    ranks: Optional[list] = None

    @staticmethod
    def concat(
        data: list,
        group_name: str = "DataProtoFuture",
        method_name: str = "(unknown method)",
        ranks: Optional[list] = None,
    ) -> "DataProtoFuture":
        """A future of the row-wise concatenation of the DataProtos the ``data`` refs resolve to."""
        return DataProtoFuture(
            collect_fn=DataProto.concat, futures=list(data), group_name=group_name, method_name=method_name, ranks=ranks
        )

    def chunk(self, chunks: int) -> list["DataProtoFuture"]:
        """``chunks`` futures, the i-th resolving to chunk i of this future's DataProto."""
        return [
            dataclasses.replace(
                self, dispatch_fn=functools.partial(_take_chunk, index=i, chunks=chunks, previous=self.dispatch_fn)
            )
            for i in range(chunks)
        ]

    def get(self, timeout_s: Optional[float] = None) -> DataProto:
        """Wait for every producer; a failed or dead producer raises WorkerGroupError naming it."""
        from verl.utils.ray_utils import get_ranked

        ranks = self.ranks if self.ranks is not None else list(range(len(self.futures)))
        outputs = get_ranked(
            self.futures, ranks, group_name=self.group_name, method_name=self.method_name, timeout_s=timeout_s
        )
        for rank, output in zip(ranks, outputs):
            if not isinstance(output, DataProto):
                raise TypeError(
                    f"worker group '{self.group_name}' method '{self.method_name}': rank {rank} "
                    f"returned {type(output).__name__}, expected a DataProto"
                )
        data = self.collect_fn(outputs)
        return self.dispatch_fn(data) if self.dispatch_fn is not None else data
