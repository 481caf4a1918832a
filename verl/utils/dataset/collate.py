"""Batch collation for the RL datasets (verl convention).

Tensors are stacked along a new batch axis; every other field becomes a 1-D ``np.ndarray`` of
``dtype=object`` with one entry per row, which is what ``DataProto.from_single_dict`` expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def collate_fn(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack tensor fields, pack the rest into object arrays; all rows must have the same keys."""
    if not rows:
        raise ValueError("collate_fn: empty batch")
    keys = list(rows[0].keys())
    for i, row in enumerate(rows[1:], start=1):
        if set(row.keys()) != set(keys):
            raise ValueError(f"collate_fn: row {i} has keys {sorted(row.keys())}, row 0 has {sorted(keys)}")
    out: dict[str, Any] = {}
    for key in keys:
        values = [row[key] for row in rows]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values, dim=0)
        else:
            # Filling an empty object array keeps list/dict values as single entries (np.array would
            # turn equal-length lists into a 2-D array).
            packed = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                packed[i] = value
            out[key] = packed
    return out
