"""Per-step metrics of the driver: data statistics, LUFFY's on/off-policy split, timing, throughput.

Names follow verl and LUFFY (docs/METHOD.md §1.5, §1.10): ``critic/score/*``, ``critic/rewards/*``,
``critic/advantages/*``, ``response_length/*``, ``prompt_length/*``, ``on_off_metrics/*``,
``batch/*``, ``timing_s/*``, ``timing_per_token_ms/*`` and ``perf/throughput`` (tokens / s / device).
Pure functions of the batch tensors, so they are unit-tested without Ray.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _mean_or_zero(values: torch.Tensor) -> float:
    return values.float().mean().item() if values.numel() else 0.0


def compute_data_metrics(batch: dict, response_length: int) -> dict[str, float]:
    """Score, reward, advantage and length statistics over a merged training batch.

    ``batch`` holds ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns``,
    ``responses``, ``attention_mask`` and (LUFFY) ``prefix_mask``. A row is off-policy when it has any
    prefix token.
    """
    resp_mask = batch["attention_mask"][:, -response_length:].bool()
    prompt_mask = batch["attention_mask"][:, :-response_length].bool()
    scores = batch["token_level_scores"].sum(-1)
    rewards = batch["token_level_rewards"].sum(-1)
    resp_len = resp_mask.sum(-1).float()
    prompt_len = prompt_mask.sum(-1).float()
    m = {}
    m.update(_stats("critic/score", scores))
    m.update(_stats("critic/rewards", rewards))
    m.update(_stats("critic/advantages", batch["advantages"][resp_mask]))
    m.update(_stats("critic/returns", batch["returns"][resp_mask]))
    m.update(_stats("response_length", resp_len))
    m["response_length/clip_ratio"] = _mean_or_zero((resp_len == response_length).float())
    m.update(_stats("prompt_length", prompt_len))
    # LUFFY: share of prompts that fill the whole prompt width (left-truncated or exactly max_prompt_length).
    m["prompt_length/clip_ratio"] = _mean_or_zero((prompt_len == prompt_mask.shape[-1]).float())
    if "prefix_mask" in batch:
        off = batch["prefix_mask"].bool().any(-1)
        on = ~off
        m["on_off_metrics/on_response_length_mean"] = _mean_or_zero(resp_len[on])
        m["on_off_metrics/off_response_length_mean"] = _mean_or_zero(resp_len[off])
        m["on_off_metrics/on_score"] = _mean_or_zero(scores[on])
        m["on_off_metrics/off_score"] = _mean_or_zero(scores[off])
        m["on_off_metrics/off_on_example_ratio"] = off.sum().item() / max(on.sum().item(), 1)
    return m


def compute_group_metrics(
    scores: torch.Tensor, uids, on_policy: torch.Tensor, fail_value: float = 0.0, success_value: float = 1.0
) -> dict[str, float]:
    """LUFFY's per-group solve statistics (logged only, docs/METHOD.md §1.5).

    ``batch/solve_none`` / ``solve_all`` / ``solve_none_format``: number of groups (LUFFY counts) whose every
    score equals fail / success / −1, and the same as fractions of the groups in ``batch/solve_*_frac``;
    ``batch/solved`` / ``failed``: fraction of rows; ``batch/on_solved`` / ``off_solved``: success rate among
    on- / off-policy rows.
    """
    groups = defaultdict(list)
    for i, uid in enumerate(uids):
        groups[uid].append(scores[i].item())
    n_groups = max(len(groups), 1)
    solve_none = sum(all(s == fail_value for s in g) for g in groups.values())
    solve_all = sum(all(s == success_value for s in g) for g in groups.values())
    solve_none_format = sum(all(s == -1 for s in g) for g in groups.values())
    solved = scores == success_value
    return {
        "batch/solve_none": solve_none,
        "batch/solve_all": solve_all,
        "batch/solve_none_format": solve_none_format,
        "batch/solve_none_frac": solve_none / n_groups,
        "batch/solve_all_frac": solve_all / n_groups,
        "batch/solve_none_format_frac": solve_none_format / n_groups,
        "batch/solved": _mean_or_zero(solved.float()),
        "batch/failed": _mean_or_zero((scores == fail_value).float()),
        "batch/on_solved": _mean_or_zero(solved[on_policy].float()),
        "batch/off_solved": _mean_or_zero(solved[~on_policy].float()),
    }


def compute_timing_metrics(
    timing: dict[str, float], num_prompt_tokens: int, num_response_tokens: int
) -> dict[str, float]:
    """``timing_s/<phase>`` plus ``timing_per_token_ms/<phase>`` over the tokens that phase touched."""
    m = {f"timing_s/{k}": v for k, v in timing.items()}
    all_tokens = num_prompt_tokens + num_response_tokens
    per_phase_tokens = {"gen": num_response_tokens}
    for k, v in timing.items():
        tokens = per_phase_tokens.get(k, all_tokens)
        if tokens > 0 and k != "step":
            m[f"timing_per_token_ms/{k}"] = 1000.0 * v / tokens
    return m


def compute_throughput_metrics(total_tokens: int, step_seconds: float, n_devices: int) -> dict[str, float]:
    """verl's ``perf/throughput`` (tokens / s / device) and ``perf/time_per_step``."""
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / max(step_seconds, 1e-9) / max(n_devices, 1),
    }


def reduce_metrics(metrics: dict[str, list]) -> dict[str, float]:
    """Mean of each metric list. The actor's lists hold one value per step (token means, already reduced over the
    micro-batches and ranks), one per optimizer step (``pg_loss``, ``grad_norm``), or, with
    ``actor.metric_aggregation=micro_batch_mean``, one per micro-batch (LUFFY); see verl/utils/step_metrics.py."""
    out = {}
    for k, v in metrics.items():
        arr = np.asarray(v, dtype=np.float64)
        out[k] = float(arr.mean()) if arr.size else 0.0
    return out
