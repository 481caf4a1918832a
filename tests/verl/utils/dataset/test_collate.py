"""collate_fn: tensors stacked, everything else one object entry per row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.utils.dataset import collate_fn


def test_tensors_are_stacked_and_lists_stay_single_entries():
    rows = [
        {"ids": torch.tensor([1, 2]), "tags": [1, 2], "info": {"index": 0}, "source": "a"},
        {"ids": torch.tensor([3, 4]), "tags": [3, 4], "info": {"index": 1}, "source": "b"},
    ]
    batch = collate_fn(rows)
    assert batch["ids"].tolist() == [[1, 2], [3, 4]]
    assert batch["tags"].shape == (2,) and batch["tags"].dtype == object and batch["tags"][1] == [3, 4]
    assert batch["info"][0] == {"index": 0} and batch["source"].tolist() == ["a", "b"]
    assert isinstance(batch["source"], np.ndarray)


def test_rows_with_different_keys_are_rejected():
    with pytest.raises(ValueError, match="row 1 has keys"):
        collate_fn([{"a": 1}, {"b": 2}])
