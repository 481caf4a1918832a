"""Karmarkar-Karp partitions, balance metrics and token-budgeted micro-batches on hand cases."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from verl.utils.seqlen_balancing import (
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    karmarkar_karp,
    log_seqlen_unbalance,
    rearrange_micro_batches,
    rearrange_micro_batches_indices,
)

EIGHT = [8, 7, 6, 5, 4, 3, 2, 1]


def test_karmarkar_karp_equal_size_balances_hand_case():
    # sorted pairs {1,2},{3,4},{5,6},{7,8} (spread 1 each; heaviest first on ties):
    # {8|7}+{6|5} -> 8+5 | 7+6 = 13|13, {4|3}+{2|1} -> 5|5, then 13+5 | 13+5 = 18|18:
    # values {8,5,3,2} = indices {0,3,5,6} and {7,6,4,1} = indices {1,2,4,7}
    parts = karmarkar_karp(EIGHT, k_partitions=2, equal_size=True)
    assert sorted(map(tuple, parts)) == [(0, 3, 5, 6), (1, 2, 4, 7)]
    assert [sum(EIGHT[i] for i in p) for p in parts] == [18, 18]


def test_karmarkar_karp_unequal_sizes_reaches_perfect_split():
    lens = [10, 1, 1, 1, 1, 6]
    # 10|0 + 6|0 -> 10|6, then each 1 is added to the lighter side: 10|7, 10|8, 10|9, 10|10
    parts = karmarkar_karp(lens, k_partitions=2, equal_size=False)
    assert sorted(sum(lens[i] for i in p) for p in parts) == [10, 10]
    assert [0] in parts


def test_balanced_partitions_use_every_index_once_with_equal_counts():
    lens = [31, 4, 17, 9, 9, 22, 3, 12, 40, 1, 7, 15]
    parts = get_seqlen_balanced_partitions(lens, k_partitions=4, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(12))
    assert all(len(p) == 3 for p in parts)
    sums = [sum(lens[i] for i in p) for p in parts]
    # total 170 -> ideal 42.5 per rank; the contiguous split 52/40/62/16 has spread 46, LDM gets 50..38
    assert sum(sums) == 170 and max(sums) - min(sums) <= 12


def test_balanced_partitions_reject_bad_requests():
    with pytest.raises(ValueError, match="non-empty partitions"):
        get_seqlen_balanced_partitions([3, 4], k_partitions=3, equal_size=False)
    with pytest.raises(ValueError, match="divisible"):
        get_seqlen_balanced_partitions([1, 2, 3], k_partitions=2, equal_size=True)
    with pytest.raises(ValueError, match="k_partitions"):
        get_seqlen_balanced_partitions([1, 2, 3], k_partitions=0, equal_size=False)


def test_log_seqlen_unbalance_metrics():
    parts = karmarkar_karp(EIGHT, 2, equal_size=True)
    metrics = log_seqlen_unbalance(EIGHT, parts, prefix="global_seqlen")
    # contiguous halves: 8+7+6+5 = 26, 4+3+2+1 = 10; balanced 18/18; mean 36/2
    assert metrics == {
        "global_seqlen/min": 10,
        "global_seqlen/max": 26,
        "global_seqlen/minmax_diff": 16,
        "global_seqlen/balanced_min": 18,
        "global_seqlen/balanced_max": 18,
        "global_seqlen/mean": 18.0,
    }


def test_micro_batches_count_is_ceil_of_tokens_over_budget():
    lens = [5, 3, 4, 2, 6]
    # 20 tokens / budget 10 -> 2 micro-batches, balanced 10 | 10
    parts = rearrange_micro_batches_indices(lens, max_token_len=10)
    assert len(parts) == 2
    assert sorted(sum(lens[i] for i in p) for p in parts) == [10, 10]
    # budget 7 -> ceil(20/7) = 3 micro-batches, all non-empty
    parts = rearrange_micro_batches_indices(lens, max_token_len=7)
    assert len(parts) == 3 and all(parts)
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]


def test_micro_batches_reject_sequence_longer_than_budget():
    with pytest.raises(ValueError, match="sequence 1 has 12 tokens > max_token_len=10"):
        rearrange_micro_batches_indices([3, 12, 4], max_token_len=10)


def test_rearrange_micro_batches_splits_tensordict_and_reverse_idx_restores_order():
    mask = torch.zeros(5, 6, dtype=torch.long)
    for row, length in enumerate([5, 3, 4, 2, 6]):
        mask[row, :length] = 1
    batch = TensorDict({"attention_mask": mask, "row": torch.arange(5)}, batch_size=[5])
    micro_batches, parts = rearrange_micro_batches(batch, max_token_len=10)
    assert [mb["attention_mask"].sum().item() for mb in micro_batches] == [10, 10]
    flat = [i for p in parts for i in p]
    rows = torch.cat([mb["row"] for mb in micro_batches])
    restored = rows[torch.tensor(get_reverse_idx(flat))]
    assert torch.equal(restored, torch.arange(5))


def test_get_reverse_idx():
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]
    with pytest.raises(ValueError, match="not a permutation"):
        get_reverse_idx([0, 0, 1])


def _two_rank_worker(rank: int, store_path: str, out_dir: str) -> None:
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        # rank 0 needs ceil(10/10) = 1 micro-batch, rank 1 needs ceil(30/10) = 3 -> both use 3
        lens = [4, 3, 2, 1] if rank == 0 else [10, 10, 5, 5]
        parts = rearrange_micro_batches_indices(lens, max_token_len=10, dp_group=dist.group.WORLD)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(parts, f)
    finally:
        dist.destroy_process_group()


def test_micro_batch_count_uses_all_reduced_max(monkeypatch):
    calls = []

    def fake_all_reduce(tensor, op, group):
        # another rank needs 3 micro-batches
        calls.append((int(tensor.item()), op, group))
        tensor.fill_(max(int(tensor.item()), 3))

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    parts = rearrange_micro_batches_indices([4, 3, 2, 1], max_token_len=10, dp_group="dp")
    assert calls == [(1, dist.ReduceOp.MAX, "dp")]
    assert len(parts) == 3 and all(parts)
    with pytest.raises(ValueError, match="3 micro-batches .* only 2 rows"):
        rearrange_micro_batches_indices([4, 3], max_token_len=10, dp_group="dp")


def test_micro_batch_count_is_all_reduced_to_max_over_two_gloo_ranks(tmp_path):
    # fork: the children need no re-import of torch (spawn costs seconds per rank on a busy CPU)
    mp.start_processes(
        _two_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, start_method="fork"
    )
    parts0 = json.loads((tmp_path / "rank0.json").read_text())
    parts1 = json.loads((tmp_path / "rank1.json").read_text())
    assert len(parts0) == len(parts1) == 3
    assert all(parts0) and sorted(i for p in parts0 for i in p) == [0, 1, 2, 3]


def test_group_balanced_partitions_keep_groups_whole_and_balance_tokens():
    from verl.utils.seqlen_balancing import get_group_balanced_partitions

    # 4 groups of 2 rows (uids a..d, rows interleaved); group sums a=10, b=30, c=20, d=20.
    seqlens = [5, 10, 5, 20, 10, 10, 10, 10]
    uids = ["a", "b", "a", "b", "c", "c", "d", "d"]
    parts = get_group_balanced_partitions(seqlens, uids, k_partitions=2)
    assert sorted(len(p) for p in parts) == [4, 4]
    for part in parts:
        assert len({uids[i] for i in part}) == 2  # two whole groups per partition
        for uid in {uids[i] for i in part}:
            assert [i for i in part if uids[i] == uid] == [i for i, u in enumerate(uids) if u == uid]
    assert sorted(sum(seqlens[i] for i in p) for p in parts) == [40, 40]  # {a,b} vs {c,d}


def test_group_balanced_partitions_decline_uneven_splits():
    from verl.utils.seqlen_balancing import get_group_balanced_partitions

    assert get_group_balanced_partitions([1, 2, 3], ["a", "b", "c"], 2) is None  # 3 groups over 2 ranks
    assert get_group_balanced_partitions([1, 2, 3, 4], ["a", "a", "a", "b"], 2) is None  # sizes differ
