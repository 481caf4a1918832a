"""Per-rank batch sizes of the actor update, derived from the prompt-level config (docs/METHOD.md §1.9, §5.4).

The config counts prompts; each worker sees rows (prompt x rollout.n) split over the data-parallel ranks.
These pure functions do that arithmetic once, for the worker (which uses the numbers) and for the config
checker (which rejects sizes that do not divide evenly), so both always agree. The config keys keep the
user's meaning (prompts); the per-rank row counts live only in ``RankBatchSizes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

_ACTOR = "actor_rollout_ref.actor"


class BatchSizeError(ValueError):
    """A batch size that does not split evenly over the ranks; the message names the config keys."""


def data_parallel_size(world_size: int, sp_size: int = 1) -> int:
    """Data-parallel ranks = world size / sequence-parallel degree (both must be positive and divide)."""
    if world_size < 1:
        raise BatchSizeError(f"world size (trainer.nnodes * trainer.n_gpus_per_node) must be >= 1, got {world_size}")
    if sp_size < 1 or world_size % sp_size:
        raise BatchSizeError(
            f"{_ACTOR}.ulysses_sequence_parallel_size={sp_size} must divide the world size {world_size}"
        )
    return world_size // sp_size


def rows_per_rank(train_batch_size: int, rollout_n: int, world_size: int) -> int:
    """Rows (responses) each rank receives per training step: B * n / world size, required to be exact."""
    rows = train_batch_size * rollout_n
    if rows % world_size:
        raise BatchSizeError(
            f"data.train_batch_size * actor_rollout_ref.rollout.n = {train_batch_size}*{rollout_n} = {rows} rows "
            f"do not split evenly over world size {world_size} (trainer.nnodes * trainer.n_gpus_per_node)"
        )
    return rows // world_size


def _prompt_count_per_rank(key: str, prompts: int, rollout_n: int, dp: int) -> int:
    """LUFFY's worker normalisation prompts * n // dp, with the remainder rejected instead of floored."""
    if prompts is None or prompts < 1:
        raise BatchSizeError(f"{key} must be a positive number of prompts, got {prompts}")
    rows = prompts * rollout_n
    if rows % dp:
        raise BatchSizeError(
            f"{key} * actor_rollout_ref.rollout.n = {prompts}*{rollout_n} = {rows} rows do not split evenly "
            f"over {dp} data-parallel ranks"
        )
    return rows // dp


@dataclass(frozen=True)
class RankBatchSizes:
    """Rows per data-parallel rank that the actor works in, derived once from the prompt-level config.

    ``ppo_mini_rows``: rows per optimizer step; ``ppo_micro_rows``: rows per forward/backward;
    ``gradient_accumulation``: the loss divisor mini / micro; ``log_prob_micro_rows``: rows per
    log-prob forward of the rollout and reference passes (None when no log-prob size was given).
    """

    ppo_mini_rows: int
    ppo_micro_rows: int
    gradient_accumulation: int
    log_prob_micro_rows: Optional[int] = None


def rank_batch_sizes(
    actor_cfg: Mapping[str, Any],
    rollout_n: int = 1,
    world_size: int = 1,
    sp_size: int = 1,
    log_prob_micro_batch_size: Optional[int] = None,
) -> RankBatchSizes:
    """``normalize_actor_batch_sizes`` as a frozen ``RankBatchSizes``. With the defaults (one rank, one
    response per prompt) a prompt is a row: the sizes of a standalone actor built outside a worker."""
    d = normalize_actor_batch_sizes(actor_cfg, rollout_n, world_size, sp_size, log_prob_micro_batch_size)
    return RankBatchSizes(
        ppo_mini_rows=d["ppo_mini_batch_size_per_rank"],
        ppo_micro_rows=d["ppo_micro_batch_size_per_rank"],
        gradient_accumulation=d["gradient_accumulation"],
        log_prob_micro_rows=d["log_prob_micro_batch_size_per_rank"],
    )


def normalize_actor_batch_sizes(
    actor_cfg: Mapping[str, Any],
    rollout_n: int,
    world_size: int,
    sp_size: int = 1,
    log_prob_micro_batch_size: Optional[int] = None,
) -> dict:
    """Per-rank sizes of the actor update, as LUFFY's worker computes them.

    ``ppo_mini_batch_size`` and ``ppo_micro_batch_size`` are prompts: each becomes ``x n / dp`` rows per
    rank (LUFFY: 64 * 8 / 8 = 64). ``ppo_micro_batch_size_per_gpu`` (upstream verl's name), when set, is
    already rows per rank and wins. ``gradient_accumulation`` = mini / micro after normalisation; it is
    the loss divisor even when dynamic batching makes a different number of micro-batches (LUFFY: 1).
    ``log_prob_micro_batch_size`` (rollout/ref) normalises as ``// dp * n`` (floored, like LUFFY).

    Returns ``ppo_mini_batch_size_per_rank``, ``ppo_micro_batch_size_per_rank``, ``gradient_accumulation``
    and ``log_prob_micro_batch_size_per_rank`` (None when no log-prob size was given).
    """
    dp = data_parallel_size(world_size, sp_size)
    if rollout_n < 1:
        raise BatchSizeError(f"actor_rollout_ref.rollout.n must be >= 1, got {rollout_n}")
    mini = _prompt_count_per_rank(f"{_ACTOR}.ppo_mini_batch_size", actor_cfg.get("ppo_mini_batch_size"), rollout_n, dp)

    micro_per_gpu = actor_cfg.get("ppo_micro_batch_size_per_gpu")
    if micro_per_gpu is not None:
        if micro_per_gpu < 1:
            raise BatchSizeError(f"{_ACTOR}.ppo_micro_batch_size_per_gpu must be >= 1 row, got {micro_per_gpu}")
        micro, micro_key = micro_per_gpu, f"{_ACTOR}.ppo_micro_batch_size_per_gpu"
    else:
        if actor_cfg.get("ppo_micro_batch_size") is None:
            raise BatchSizeError(
                f"set {_ACTOR}.ppo_micro_batch_size (prompts) or {_ACTOR}.ppo_micro_batch_size_per_gpu (rows)"
            )
        micro_key = f"{_ACTOR}.ppo_micro_batch_size"
        micro = _prompt_count_per_rank(micro_key, actor_cfg.get("ppo_micro_batch_size"), rollout_n, dp)
    if mini % micro:
        raise BatchSizeError(
            f"{micro_key} gives {micro} rows per rank, which does not divide the {mini} rows per rank of "
            f"{_ACTOR}.ppo_mini_batch_size"
        )

    log_prob_micro = None
    if log_prob_micro_batch_size is not None:
        log_prob_micro = (log_prob_micro_batch_size // dp) * rollout_n
        if log_prob_micro < 1:
            raise BatchSizeError(
                f"log_prob_micro_batch_size={log_prob_micro_batch_size} is smaller than the {dp} data-parallel ranks"
            )
    return {
        "ppo_mini_batch_size_per_rank": mini,
        "ppo_micro_batch_size_per_rank": micro,
        "gradient_accumulation": mini // micro,
        "log_prob_micro_batch_size_per_rank": log_prob_micro,
    }


def optimizer_steps_per_training_step(
    train_batch_size: int,
    rollout_n: int,
    world_size: int,
    mini_batch_rows_per_rank: int,
    ppo_epochs: int = 1,
    sp_size: int = 1,
) -> int:
    """Optimizer steps one training step makes: (B * n / dp) / mini-batch rows per rank, x ppo_epochs.

    LUFFY (B=128, n=8, 8 ranks, 64 rows per mini-batch): 128 rows per rank -> 2 optimizer steps.
    """
    rows_per_rank(train_batch_size, rollout_n, world_size)
    rows = train_batch_size * rollout_n // data_parallel_size(world_size, sp_size)
    if rows % mini_batch_rows_per_rank:
        raise BatchSizeError(
            f"data.train_batch_size={train_batch_size} is not a multiple of {_ACTOR}.ppo_mini_batch_size: "
            f"{rows} rows per rank do not split into mini-batches of {mini_batch_rows_per_rank} rows"
        )
    return rows // mini_batch_rows_per_rank * ppo_epochs
