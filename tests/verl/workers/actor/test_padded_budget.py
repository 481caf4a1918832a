"""REVIEW H1: dynamic micro-batches of an actor without varlen attention budget padded positions (rows x width),
an actor with flash-attention's varlen kernel keeps the valid-token budget unchanged."""

from __future__ import annotations

import types

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import get_reverse_idx, padded_micro_batches_indices, rearrange_micro_batches_indices
from verl.workers.actor.dp_actor import DataParallelPPOActor

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


class _Model(torch.nn.Module):
    def __init__(self, attn: str):
        super().__init__()
        self.config = types.SimpleNamespace(_attn_implementation=attn)
        self.lin = torch.nn.Linear(2, 2)


def _data(rows: int, width: int, valid: list[int]) -> DataProto:
    mask = torch.zeros(rows, width, dtype=torch.long)
    for r, v in enumerate(valid):
        mask[r, width - v :] = 1  # left padding, as a prompt + response row
    return DataProto.from_dict(
        tensors={"attention_mask": mask, "input_ids": torch.arange(rows * width).view(rows, width)}
    )


# train.sh's shapes scaled down by 256: width 9216/256 = 36, budget 32768/256 = 128; short rows (valid <= 12) are
# what let 11 token-budgeted micro-batches cover 3.7x the budget in padded positions.
VALID = [3, 5, 7, 9, 11, 12, 4, 6, 8, 10, 12, 3, 36, 20, 2, 7, 9, 11, 5, 6, 30, 1, 2, 3]
WIDTH, BUDGET = 36, 128


def test_padded_actor_keeps_rows_x_width_within_the_budget(caplog):
    with caplog.at_level("WARNING"):
        actor = DataParallelPPOActor(OmegaConf.create({}), _Model("sdpa"), use_remove_padding=True)
    assert not actor.use_remove_padding
    assert any("flash-attn" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    data = _data(len(VALID), WIDTH, VALID)
    micro, rev = actor._micro_batches(data, ["attention_mask", "input_ids"], 1, True, BUDGET)
    # 128 // 36 = 3 rows each: ceil(24 / 3) = 8 micro-batches, every one 3 x 36 = 108 <= 128 positions
    assert [tuple(m["attention_mask"].shape) for m in micro] == [(3, WIDTH)] * 8
    assert all(m["attention_mask"].numel() <= BUDGET for m in micro)
    # every row exactly once, and the reverse index restores the order
    ids = torch.cat([m["input_ids"] for m in micro])[torch.tensor(rev)]
    assert torch.equal(ids, data.batch["input_ids"])
    # the valid-token budget would have packed far more padded positions into one micro-batch
    old = rearrange_micro_batches_indices([int(v) for v in VALID], BUDGET)
    assert max(len(g) for g in old) * WIDTH > BUDGET


def test_varlen_actor_micro_batches_are_unchanged():
    actor = DataParallelPPOActor(OmegaConf.create({}), _Model("flash_attention_2"), use_remove_padding=True)
    assert actor.use_remove_padding
    data = _data(len(VALID), WIDTH, VALID)
    micro, rev = actor._micro_batches(data, ["attention_mask", "input_ids"], 1, True, BUDGET)
    groups = rearrange_micro_batches_indices(data.batch["attention_mask"].sum(-1).tolist(), BUDGET)
    assert len(micro) == len(groups)
    for m, g in zip(micro, groups):
        assert torch.equal(m["input_ids"], data.batch["input_ids"][g])
    assert rev == get_reverse_idx([j for g in groups for j in g])


def test_padded_split_sizes_and_refusal():
    assert padded_micro_batches_indices(7, 10, 30) == [[0, 1, 2], [3, 4], [5, 6]]
    assert padded_micro_batches_indices(4, 10, 100) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match=r"36 positions > ppo_max_token_len_per_gpu=32.*>=36"):
        padded_micro_batches_indices(4, 36, 32)


def test_padded_count_is_all_reduced_to_the_max(monkeypatch):
    import torch.distributed as dist

    def fake_all_reduce(t, op=None, group=None):
        t.fill_(4)  # another rank needs 4 micro-batches

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    monkeypatch.setattr("verl.utils.seqlen_balancing._collective_device", lambda g: "cpu")
    groups = padded_micro_batches_indices(6, 10, 30, dp_group=object())
    assert groups == [[0, 1], [2, 3], [4], [5]]
