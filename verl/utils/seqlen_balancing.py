"""Balance sequences by token count: across data-parallel ranks and into micro-batches.

The driver reorders a batch so every rank gets a similar number of tokens (docs/METHOD.md §1.8, equal row
counts), and the actor splits a mini-batch into token-budgeted micro-batches (docs/METHOD.md §1.9, dynamic batch
size). Both use the Karmarkar-Karp largest differencing method implemented here.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import Any, Optional

import torch

__all__ = [
    "karmarkar_karp",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "rearrange_micro_batches_indices",
    "rearrange_micro_batches",
    "padded_micro_batches_indices",
    "get_reverse_idx",
]


class _PartialSolution:
    """``k`` partitions, each a (token sum, item indices) pair, kept sorted by sum (descending)."""

    def __init__(self, partitions: list[tuple[int, list[int]]]):
        self.partitions = sorted(partitions, key=lambda p: p[0], reverse=True)

    @property
    def spread(self) -> int:
        return self.partitions[0][0] - self.partitions[-1][0]

    def merge(self, other: "_PartialSolution") -> "_PartialSolution":
        """Join the heaviest partition of ``self`` with the lightest of ``other``, and so on."""
        joined = [
            (mine[0] + theirs[0], mine[1] + theirs[1])
            for mine, theirs in zip(self.partitions, reversed(other.partitions))
        ]
        return _PartialSolution(joined)


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Split item indices into ``k_partitions`` groups with near-equal ``Σ seqlen`` (largest differencing).

    Every item (or, with ``equal_size``, every run of ``k`` consecutive items in sorted order, one per
    partition) starts as a partial solution; the two solutions with the largest spread
    (max sum − min sum) are repeatedly merged heaviest-with-lightest until one remains. With
    ``equal_size`` every partition gets exactly ``len(seqlen_list)/k`` items.
    """
    n_items = len(seqlen_list)
    if equal_size and n_items % k_partitions != 0:
        raise ValueError(f"equal_size needs len(seqlen_list)={n_items} divisible by k_partitions={k_partitions}")
    order = sorted(range(n_items), key=lambda i: (seqlen_list[i], i))
    starts: list[_PartialSolution] = []
    if equal_size:
        for first in range(0, n_items, k_partitions):
            chunk = order[first : first + k_partitions]
            starts.append(_PartialSolution([(seqlen_list[i], [i]) for i in chunk]))
    else:
        for i in order:
            starts.append(_PartialSolution([(seqlen_list[i], [i])] + [(0, []) for _ in range(k_partitions - 1)]))
    # Largest spread first; among equal spreads the one with the heaviest partition (as verl does).
    tiebreak = itertools.count()
    heap = [(-s.spread, -s.partitions[0][0], next(tiebreak), s) for s in starts]
    heapq.heapify(heap)
    while len(heap) > 1:
        first_sol = heapq.heappop(heap)[-1]
        second_sol = heapq.heappop(heap)[-1]
        merged = first_sol.merge(second_sol)
        heapq.heappush(heap, (-merged.spread, -merged.partitions[0][0], next(tiebreak), merged))
    if not heap:
        return [[] for _ in range(k_partitions)]
    return [sorted(indices) for _, indices in heap[0][-1].partitions]


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp partitions, validated: every index exactly once, no empty partition.

    Returns ``k_partitions`` lists of indices into ``seqlen_list`` (each sorted ascending); the order
    of the partitions themselves is by descending token sum.
    """
    if k_partitions < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions}")
    if len(seqlen_list) < k_partitions:
        raise ValueError(f"cannot split {len(seqlen_list)} sequences into {k_partitions} non-empty partitions")
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    used = sorted(i for part in partitions for i in part)
    if used != list(range(len(seqlen_list))):
        raise RuntimeError(f"balanced partitions do not use every index exactly once: {partitions}")
    empty = [p for p, part in enumerate(partitions) if not part]
    if empty:
        raise RuntimeError(f"balanced partitions {empty} are empty for seqlens {list(seqlen_list)}")
    return partitions


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], group_ids: Sequence[Any], k_partitions: int
) -> Optional[list[list[int]]]:
    """Karmarkar-Karp over whole groups (rows sharing a group id stay on one partition, in row order).

    Balances the groups' token sums with an equal number of groups per partition. Returns None when
    that cannot give every partition the same number of rows (group sizes differ, or the group count
    is not a multiple of ``k_partitions``): the caller then balances rows.
    """
    members: dict[Any, list[int]] = {}
    for row, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(row)
    groups = list(members.values())
    if len(groups) % k_partitions or len({len(g) for g in groups}) != 1:
        return None
    parts = get_seqlen_balanced_partitions(
        [sum(seqlen_list[i] for i in g) for g in groups], k_partitions, equal_size=True
    )
    return [[row for gi in part for row in groups[gi]] for part in parts]


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: list[list[int]], prefix: str) -> dict[str, float]:
    """Token-count balance before and after partitioning (docs/METHOD.md §1.8).

    ``{prefix}/min``, ``/max``, ``/minmax_diff``: over the original contiguous chunks of
    ``len/k`` rows; ``/balanced_min``, ``/balanced_max``: over ``partitions``; ``/mean``: total/k.
    """
    k_partitions = len(partitions)
    chunk = len(seqlen_list) // k_partitions
    if chunk == 0:
        raise ValueError(f"{len(seqlen_list)} sequences cannot form {k_partitions} contiguous chunks")
    chunk_sums = [sum(seqlen_list[r * chunk : (r + 1) * chunk]) for r in range(k_partitions)]
    balanced_sums = [sum(seqlen_list[i] for i in part) for part in partitions]
    return {
        f"{prefix}/min": min(chunk_sums),
        f"{prefix}/max": max(chunk_sums),
        f"{prefix}/minmax_diff": max(chunk_sums) - min(chunk_sums),
        f"{prefix}/balanced_min": min(balanced_sums),
        f"{prefix}/balanced_max": max(balanced_sums),
        f"{prefix}/mean": sum(seqlen_list) / k_partitions,
    }


def balance_batch_rows(batch: Any, k_partitions: int, group_ids: Optional[Sequence] = None) -> dict[str, float]:
    """Reorder ``batch`` (a ``DataProto``, in place) so each of ``k_partitions`` contiguous chunks holds a similar
    token count (``attention_mask``), whole groups kept together when ``group_ids`` is given and they split evenly;
    returns ``log_seqlen_unbalance``'s ``global_seqlen/*`` metrics."""
    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    parts = None if group_ids is None else get_group_balanced_partitions(seqlens, list(group_ids), k_partitions)
    if parts is None:
        parts = get_seqlen_balanced_partitions(seqlens, k_partitions=k_partitions, equal_size=True)
    batch.reorder(torch.tensor([i for p in parts for i in p]))
    return log_seqlen_unbalance(seqlens, parts, prefix="global_seqlen")


def _collective_device(group: Any) -> str:
    """Where a tensor for a collective on ``group`` must live: the current GPU for a pure NCCL group."""
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend(group))
    except (RuntimeError, ValueError, TypeError, AttributeError):
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"


def rearrange_micro_batches_indices(
    seq_lens: Sequence[int], max_token_len: int, dp_group: Any = None
) -> list[list[int]]:
    """Group row indices into ``ceil(Σ seq_lens / max_token_len)`` token-balanced micro-batches.

    With a ``torch.distributed`` process group the count is all-reduced to the maximum over the
    group, so every FSDP rank runs the same number of forward/backward passes. Rows are assigned by
    Karmarkar-Karp with unequal sizes, so a micro-batch may slightly exceed the budget. Raises
    ValueError if one sequence alone exceeds ``max_token_len`` or if there are fewer rows than
    micro-batches (an empty micro-batch would desynchronise the ranks).
    """
    seq_lens = [int(x) for x in seq_lens]
    if not seq_lens:
        raise ValueError("rearrange_micro_batches_indices: no sequences")
    longest = max(seq_lens)
    if longest > max_token_len:
        row = seq_lens.index(longest)
        raise ValueError(
            f"sequence {row} has {longest} tokens > max_token_len={max_token_len}; "
            "raise ppo_max_token_len_per_gpu (or log_prob_max_token_len_per_gpu)"
        )
    num_micro_batches = math.ceil(sum(seq_lens) / max_token_len)
    if dp_group is not None:
        import torch.distributed as dist

        count = torch.tensor([num_micro_batches], dtype=torch.long, device=_collective_device(dp_group))
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=dp_group)
        num_micro_batches = int(count.item())
    if num_micro_batches > len(seq_lens):
        raise ValueError(
            f"{num_micro_batches} micro-batches (max over ranks) but only {len(seq_lens)} rows on this rank; "
            "the token budget is too small for this mini-batch"
        )
    return get_seqlen_balanced_partitions(seq_lens, num_micro_batches, equal_size=False)


def padded_micro_batches_indices(
    n_rows: int, width: int, max_token_len: int, dp_group: Any = None, key: str = "ppo_max_token_len_per_gpu"
) -> list[list[int]]:
    """Dynamic micro-batches for a forward that keeps the padding (no varlen attention: sdpa/eager).

    Such a micro-batch computes ``rows x width`` positions whatever its valid tokens, so the budget counts
    padded positions: ``floor(max_token_len / width)`` rows each, in row order, split as evenly as the
    count allows. The count is all-reduced to the maximum over ``dp_group`` as in
    :func:`rearrange_micro_batches_indices`; a larger count only makes micro-batches smaller. ValueError
    naming ``key`` when one padded row alone is over the budget.
    """
    if n_rows < 1:
        raise ValueError("padded_micro_batches_indices: no rows")
    rows_per_micro = max_token_len // width
    if rows_per_micro < 1:
        raise ValueError(
            f"one padded row has {width} positions > {key}={max_token_len}: without remove-padding (no "
            f"flash-attn varlen kernel) a micro-batch computes at the full width; set {key}>={width}"
        )
    num_micro_batches = math.ceil(n_rows / rows_per_micro)
    if dp_group is not None:
        import torch.distributed as dist

        count = torch.tensor([num_micro_batches], dtype=torch.long, device=_collective_device(dp_group))
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=dp_group)
        num_micro_batches = int(count.item())
    if num_micro_batches > n_rows:
        raise ValueError(
            f"{num_micro_batches} micro-batches (max over ranks) but only {n_rows} rows on this rank; "
            "the token budget is too small for this mini-batch"
        )
    base, extra = divmod(n_rows, num_micro_batches)
    groups, start = [], 0
    for g in range(num_micro_batches):
        size = base + (1 if g < extra else 0)
        groups.append(list(range(start, start + size)))
        start += size
    return groups


def rearrange_micro_batches(batch: Any, max_token_len: int, dp_group: Any = None) -> tuple[list[Any], list[list[int]]]:
    """Split a TensorDict-like ``batch`` (with ``attention_mask``) into token-balanced micro-batches.

    Returns the micro-batches (``batch[indices]``) and the index lists; concatenating the outputs and
    applying :func:`get_reverse_idx` of the flattened indices restores the original row order.
    """
    seq_lens = batch["attention_mask"].sum(dim=-1).tolist()
    partitions = rearrange_micro_batches_indices(seq_lens, max_token_len, dp_group)
    micro_batches = [batch[torch.tensor(indices, dtype=torch.long)] for indices in partitions]
    return micro_batches, partitions


def get_reverse_idx(idx_list: Sequence[int]) -> list[int]:
    """Inverse permutation: ``reverse[idx_list[i]] = i`` (ValueError if not a permutation of 0..n-1)."""
    if sorted(idx_list) != list(range(len(idx_list))):
        raise ValueError(f"get_reverse_idx: {list(idx_list)} is not a permutation of 0..{len(idx_list) - 1}")
    reverse = [0] * len(idx_list)
    for position, idx in enumerate(idx_list):
        reverse[idx] = position
    return reverse
