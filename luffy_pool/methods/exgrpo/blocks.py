"""ExGRPO's pure blocks (arXiv 2510.02245): replay of the model's own successes, sampled by correctness-rate
bucket; luffy_pool/methods/exgrpo/__init__.py wires them into the trainer.

Mirrors ElliottYan/LUFFY (commit 01f4ae06), ``ExGRPO/exgrpo/verl/verl/mix_src/``:
``experience/weighted_bucket_sampler.py`` ``WeightedBucketSampler`` -> :func:`bucket_weights`,
:func:`bucket_probabilities`, :func:`sample_from_buckets`; ``experience/experience_helpers.py``
``sample_experience_uids`` -> :func:`sample_experience_uids`; the batch-mixing arithmetic of
``experience/experience_collate_fn.py`` ``ExperienceMixCollateFn.__call__`` -> :func:`eligible_uids`,
:func:`experience_count`; the collection, retirement and phase rules inlined in ``mix_trainer_experience.py``
``fit`` and ``experience_trainer_ops.collect_experience_entries`` -> :func:`collect_group`, :func:`retire_group`,
:func:`switch_to_mixed`; ``compute_postcal_metrics`` ->
:func:`trajectory_metric_original` (and :func:`trajectory_metric_paper`), ``select_best_experiences`` ->
:func:`select_best`; ``experience/experience_bucket_manager.py`` ``ExperienceBucketManager`` ->
:class:`BucketManager`; ``experience/experience_trainer_ops.py`` ``replace_recorded_old_log_probs`` ->
:func:`swap_recorded_log_probs`; ``mix_core_alg.py`` ``compute_token_on_off_policy_loss`` ->
:func:`exgrpo_token_loss`.

Randomness: the authors draw from the global ``numpy.random`` and ``random`` modules; here the caller passes a
``numpy.random.RandomState`` and a ``random.Random`` (seeded alike they give the same draws, and their state
can be checkpointed).

Quirks kept: bucket order is the dict's insertion order (it fixes which multinomial cell is which bucket);
the over-subscription is re-assigned one draw at a time; ``sample_experience_uids`` falls back to
``random.sample`` (uniform) without a weighting. The loss's off-policy ratio is ``exp(ℓ − ℓ_old)`` shaped by
``w/(w+γ)`` where ``ℓ_old`` of replayed rows is the *recorded* log-prob (:func:`swap_recorded_log_probs`);
the means are the plain ``Σv·m/Σm`` (``on_pg_loss`` is NaN without on-policy tokens, as theirs).
Trajectory metric: ``original`` reproduces the authors' ``compute_postcal_metrics`` mask (``responses == pad`` of the
candidate at the same position of the *last* sub-batch of 8, all-pad rows filling that sub-batch), ``paper`` (default)
is the per-trajectory mean of the trajectory's own token entropies. Fixed: the ``n_exp <= 0`` branch of
``sample_experience_uids`` returns one empty list (theirs a tuple ``([], [])``); the sampler stops short instead of
dividing by zero when the over-subscribed excess can only go to zero-weight buckets (bucket 0).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Hashable, Optional, Sequence

import numpy as np
import torch

from luffy_pool.methods.loss_helpers import aggregate, clipped_on_losses, masked_mean_plain, shape_off_ratio
from luffy_pool.methods.loss_inputs import FamilyLossInputs


WEIGHTINGS = ("linear", "normal", "sqrt", "linear_clip")
TRAJECTORY_METRICS = ("ent", "ppl")


# ----------------------------------------------------------------------------------------------------
# Bucket sampler
# ----------------------------------------------------------------------------------------------------
def bucket_weight(k: int, n_rollout: int, method: str) -> float:
    """Weight of bucket ``k`` (successes out of ``n_rollout``): ``linear`` k/K; ``normal`` N(k; K/2, 1);
    ``sqrt`` √(k/K); ``linear_clip`` k/K, 0.5 above K/2."""
    if method == "linear":
        return k / n_rollout
    if method == "normal":
        return (1 / np.sqrt(2 * np.pi * 1**2)) * np.exp(-((k - n_rollout / 2) ** 2) / (2 * 1**2))
    if method == "sqrt":
        return np.sqrt(k / n_rollout)
    if method == "linear_clip":
        return 0.5 if k > n_rollout / 2 else k / n_rollout
    raise ValueError(f"unknown bucket weighting {method!r}; valid: {list(WEIGHTINGS)}")


def bucket_probabilities(buckets: dict[int, Sequence[Any]], n_rollout: int, method: str) -> dict[int, float]:
    """Sampling probability of each non-empty bucket (weights normalised over them), in ``buckets`` order."""
    valid = {k: bucket_weight(k, n_rollout, method) for k, items in buckets.items() if len(items) > 0}
    total = sum(valid.values())
    if total == 0:
        raise ValueError("all buckets are empty or have zero weight")
    return {k: w / total for k, w in valid.items()}


def sample_from_buckets(
    buckets: dict[int, Sequence[Any]],
    n: int,
    n_rollout: int,
    method: str,
    np_rng: np.random.RandomState,
    py_rng: random.Random,
) -> list[Any]:
    """``n`` items: bucket counts from one multinomial over :func:`bucket_probabilities`; a count above its
    bucket's size is capped and the excess re-assigned one at a time (``np_rng.choice``) among buckets with room,
    with renormalised probabilities; then ``py_rng.sample`` without replacement inside each bucket (all items
    when the count reaches the size). Fewer than ``n`` items only when every bucket is exhausted."""
    probabilities = bucket_probabilities(buckets, n_rollout, method)
    names = list(probabilities)
    sizes = [len(buckets[k]) for k in names]
    counts = np_rng.multinomial(n, [probabilities[k] for k in names])
    adjusted = [min(int(c), s) for c, s in zip(counts, sizes)]
    excess = sum(int(c) - a for c, a in zip(counts, adjusted))
    while excess > 0:
        room = [i for i in range(len(names)) if adjusted[i] < sizes[i]]
        room_probs = [probabilities[names[i]] for i in room]
        total = sum(room_probs)
        # Fixed: theirs divides by this total even when only zero-weight buckets (k = 0 under linear, sqrt,
        # linear_clip) have room, and crashes; here, as when no bucket has room, the draw stops short.
        if not room or total == 0:
            break
        chosen = np_rng.choice(room, p=[p / total for p in room_probs])
        adjusted[chosen] += 1
        excess -= 1
    samples: list[Any] = []
    for name, count in zip(names, adjusted):
        if count <= 0:
            continue
        items = buckets[name]
        samples.extend(list(items) if count >= len(items) else py_rng.sample(list(items), count))
    return samples


def sample_experience_uids(
    bucket_manager: Optional["BucketManager"],
    valid_uids: Sequence[Hashable],
    n_exp: int,
    n_rollout: int,
    method: Optional[str],
    np_rng: np.random.RandomState,
    py_rng: random.Random,
) -> list[Hashable]:
    """The replayed question ids of one step: bucket sampling over the manager's buckets restricted to
    ``valid_uids`` (bucket order = the manager's), or ``py_rng.sample(valid_uids, n_exp)`` when ``method`` is
    None or no bucket holds a valid id."""
    if n_exp <= 0:
        return []
    if method and bucket_manager is not None:
        valid = set(valid_uids)
        buckets = {}
        for key in bucket_manager.experience_bucket.keys():
            kept = [uid for uid in bucket_manager.get_bucket_uids(key) if uid in valid]
            if kept:
                buckets[key] = kept
        if buckets:
            return sample_from_buckets(buckets, n_exp, n_rollout, method, np_rng, py_rng)
    return py_rng.sample(list(valid_uids), n_exp)


def eligible_uids(pool: dict[Hashable, Sequence[Any]], skip_uids: set, sample_range: str = "all") -> list:
    """Pool ids (insertion order) not retired and with at least one stored trace, cut to the oldest
    (``first_half``) or newest (``last_half``) half, or ``all``."""
    uids = [uid for uid in pool if uid not in skip_uids and len(pool[uid]) > 0]
    half = len(uids) // 2
    if sample_range == "first_half":
        return uids[:half]
    if sample_range == "last_half":
        return uids[half:]
    if sample_range == "all":
        return uids
    raise ValueError(f"unknown exp_sample_range {sample_range!r}; valid: ['all', 'first_half', 'last_half']")


def experience_count(batch_size: int, experience_ratio: float, n_eligible: int) -> int:
    """Replayed prompts in a mixed batch: ``min(n_eligible, int(batch_size · experience_ratio))``; the batch is
    completed with the first ``batch_size − n`` freshly drawn prompts (the rest are dropped this step)."""
    return min(n_eligible, int(batch_size * experience_ratio))


def collect_group(num_success: int, group_size: int, lbound: int = 0, rbound: int = 7) -> bool:
    """Whether a mixed-phase group's successes enter the pool: not all ``group_size`` correct and
    ``lbound < num_success ≤ rbound`` (a replayed row counts as one of them, as in the authors' code)."""
    return num_success != group_size and lbound < num_success <= rbound


def retire_group(num_success: int, group_size: int) -> bool:
    """All rollouts correct: the question leaves the dataset and the pool (checked in warm-up too)."""
    return num_success == group_size


def switch_to_mixed(is_mixed: bool, solved_ratio: float, start_solved_ratio: float = 0.35) -> bool:
    """The phase after a step: mixed once the share of correct responses in the batch exceeds
    ``start_solved_ratio`` (strictly), and mixed for good."""
    return is_mixed or solved_ratio > start_solved_ratio


# ----------------------------------------------------------------------------------------------------
# Bucket manager
# ----------------------------------------------------------------------------------------------------
class BucketManager:
    """Question id -> latest success count, and bucket lists ``k -> [ids]`` in insertion order (which the
    sampler's bucket order follows). ``CONSTANT_DATA_UID`` ids are ignored, as in ExGRPO."""

    CONSTANT_DATA_UID = -90000

    def __init__(self) -> None:
        self.experience_bucket: dict[int, list] = defaultdict(list)
        self.uid_to_bucket: dict[Hashable, int] = {}

    def update_bucket(self, uid: Hashable, num_success: int | torch.Tensor) -> None:
        """Move ``uid`` to bucket ``num_success`` (appended at the end of that bucket if new there)."""
        if uid == self.CONSTANT_DATA_UID:
            return
        k = num_success if isinstance(num_success, int) else int(num_success.item())
        old = self.uid_to_bucket.get(uid)
        if old is not None and old != k and uid in self.experience_bucket[old]:
            self.experience_bucket[old].remove(uid)
        if uid not in self.experience_bucket[k]:
            self.experience_bucket[k].append(uid)
        self.uid_to_bucket[uid] = k

    def remove_from_bucket(self, uid: Hashable) -> None:
        """Forget ``uid`` (retired question)."""
        if uid in self.uid_to_bucket:
            k = self.uid_to_bucket[uid]
            if uid in self.experience_bucket[k]:
                self.experience_bucket[k].remove(uid)
            del self.uid_to_bucket[uid]

    def cleanup_consistency(self, experience_pool: dict) -> None:
        """Drop every id that is no longer a key of ``experience_pool`` (empty buckets stay, as theirs)."""
        for k, uids in self.experience_bucket.items():
            for uid in [u for u in uids if u not in experience_pool]:
                uids.remove(uid)
                self.uid_to_bucket.pop(uid, None)
        for uid in [u for u in self.uid_to_bucket if u not in experience_pool]:
            del self.uid_to_bucket[uid]

    def get_bucket_uids(self, k: int) -> list:
        return self.experience_bucket.get(k, [])

    def get_bucket_stats(self) -> dict[str, int]:
        """``{'bucket/<k>_count': n}`` for every bucket key seen (empty ones included), as theirs."""
        return {f"bucket/{k}_count": len(v) for k, v in self.experience_bucket.items()}

    def state_dict(self) -> dict:
        """Checkpointable state (bucket order preserved)."""
        return {
            "experience_bucket": [(k, list(v)) for k, v in self.experience_bucket.items()],
            "uid_to_bucket": list(self.uid_to_bucket.items()),
        }

    def load_state_dict(self, state: dict) -> None:
        self.experience_bucket = defaultdict(list, {k: list(v) for k, v in state["experience_bucket"]})
        self.uid_to_bucket = dict(state["uid_to_bucket"])


# ----------------------------------------------------------------------------------------------------
# Trajectory selection metric (the authors' compute_postcal_metrics and the paper's mean)
# ----------------------------------------------------------------------------------------------------
def trajectory_metric_paper(values: torch.Tensor, response_mask: torch.Tensor, kind: str = "ent") -> list[float]:
    """Per candidate: ``ent`` = mean token entropy over its own tokens; ``ppl`` = exp(−mean log-prob).
    ``values`` [N, T] are entropies (``ent``) or log-probs (``ppl``) aligned with ``response_mask``."""
    if kind not in TRAJECTORY_METRICS:
        raise ValueError(f"unknown trajectory metric {kind!r}; valid: {list(TRAJECTORY_METRICS)}")
    means = masked_mean_plain(values, response_mask.to(values.dtype), axis=-1)
    return [float(np.exp(-m)) if kind == "ppl" else float(m) for m in means.tolist()]


def trajectory_metric_original(
    values: torch.Tensor, responses: torch.Tensor, pad_token_id: int, kind: str = "ent", batch_size: int = 8
) -> list[float]:
    """The authors' ``compute_postcal_metrics`` reduction (not the paper's per-trajectory mean), given the actor's
    per-position ``values`` [N, T] (entropies or log-probs of the last T positions of the left-padded prompt+trajectory)
    and the candidates' right-padded trajectory ids ``responses`` [N, T]: candidate ``i`` averages ``values[i]`` over
    the positions where row ``i mod batch_size`` of the *last* sub-batch is pad (that sub-batch completed with all-pad
    rows). An all-False mask gives NaN, as theirs."""
    if kind not in TRAJECTORY_METRICS:
        raise ValueError(f"unknown trajectory metric {kind!r}; valid: {list(TRAJECTORY_METRICS)}")
    n = values.shape[0]
    if n == 0:
        return []
    last_start = ((n - 1) // batch_size) * batch_size
    last = responses[last_start:]
    if last.shape[0] < batch_size:
        last = torch.cat(
            [last, torch.full((batch_size - last.shape[0], responses.shape[1]), pad_token_id, dtype=responses.dtype)]
        )
    out = []
    for i in range(n):
        mask = ~(last[i % batch_size] != pad_token_id)
        mean = values[i][mask].mean().item()
        out.append(float(np.exp(-mean)) if kind == "ppl" else mean)
    return out


def select_best(metrics: Sequence[float], mode: str = "argmin") -> int:
    """Index of the chosen candidate (``np.argmin``/``np.argmax``: the first NaN wins, as theirs)."""
    if mode == "argmin":
        return int(np.argmin(metrics))
    if mode == "argmax":
        return int(np.argmax(metrics))
    raise ValueError(f"unknown exp_select_mode {mode!r}; valid: ['argmin', 'argmax']")


# ----------------------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------------------
def swap_recorded_log_probs(
    old_log_prob: torch.Tensor, recorded_log_prob: torch.Tensor, off_rows: torch.Tensor
) -> torch.Tensor:
    """``old_log_prob`` with the rows of replayed traces (``off_rows`` and a recorded vector whose sum is not
    0, i.e. present) replaced by their recorded log-probs (right-padded with 0), as ``exp_is_correct=True``."""
    out = old_log_prob.clone()
    if recorded_log_prob.sum().item() == 0.0:
        return out
    for i in range(out.shape[0]):
        if bool(off_rows[i]) and recorded_log_prob[i].sum().item() != 0.0:
            out[i] = recorded_log_prob[i].to(out.device, out.dtype)
    return out


def row_var_max(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row over its masked tokens: the unbiased variance (rows with at least 2 tokens) and the maximum (rows
    with at least 1), each averaged over those rows; 0 where no row qualifies. The authors'
    ``compute_per_batch_variance`` (``mix_core_alg.py`` lines 7-34), vectorised over the rows."""
    values, mask = values.detach(), mask.detach().bool()
    count = mask.sum(-1)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    has_max, has_var = count >= 1, count >= 2
    row_max = values.masked_fill(~mask, float("-inf")).amax(-1)
    mean = (values * mask).sum(-1) / count.clamp(min=1)
    row_var = (((values - mean.unsqueeze(-1)) ** 2) * mask).sum(-1) / (count - 1).clamp(min=1)
    avg_var = row_var[has_var].mean() if bool(has_var.any()) else zero
    avg_max = row_max[has_max].mean() if bool(has_max.any()) else zero
    return avg_var, avg_max


def _or_zero(value: torch.Tensor) -> torch.Tensor:
    """A detached diagnostic, 0 for the NaN of a mean over no token."""
    value = torch.as_tensor(value).detach()
    return torch.zeros_like(value) if bool(torch.isnan(value)) else value


@dataclass(frozen=True)
class ExgrpoLossConfig:
    """The actor knobs ExGRPO's loss reads (``run_exgrpo.sh``: reshape p_div_p_0.1, no clip in mixed mode,
    sum / width)."""

    clip_ratio: float = 0.2
    clip_upper_bound: float = 1.0
    loss_remove_clip: bool = True
    loss_remove_token_mean: bool = True
    off_policy_reshape: str = "p_div_p_0.1"
    off_policy_max_clip: Optional[float] = None
    off_policy_min_clip: Optional[float] = None
    all_max_clip: Optional[float] = None


def exgrpo_token_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """ExGRPO's mixed token loss: on-policy tokens ``−A·ρ`` (PPO clip ``[1−ε, max(clip_upper_bound, 1+ε)]``
    unless ``loss_remove_clip``), off-policy (prefix) tokens ``−A·f(w)`` with ``w = exp(ℓ − ℓ_old)`` and
    ``f(w) = w/(w+γ)`` (``p_div_p_γ``; ``no_reshape``: f(w) = w), then the optional clamps; aggregated as
    ``Σ/width`` or the token mean. ``inputs.old_log_prob`` must already carry the recorded log-probs of the
    replayed rows (:func:`swap_recorded_log_probs`). Only the off-policy reshapes the ExGRPO scripts use are
    accepted.

    Diagnostics: the 15 the authors' function returns besides ``pg_loss``, under their names: the two terms'
    means, the clip fractions (``off_pg_clipfrac`` always 0), ``ppo_kl``, ``off_policy_prob`` (``π_θ`` on the
    replayed tokens) and ``on_policy_prob`` (``π_old`` on the fresh ones), the ratio means, the two clamp
    fractions, and the ``*_var_m`` / ``*_max_m`` per-row variance and maximum of each ratio averaged over the rows
    (:func:`row_var_max`), all over the tokens before ``all_max_clip``. A mean over no token is 0 as theirs, except ``on_pg_loss``
    (NaN, as theirs) and the two clamp fractions (0 here, NaN in theirs)."""
    if inputs.prefix_mask is None:
        raise ValueError("the exgrpo_token loss needs inputs.prefix_mask (the replayed tokens)")
    log_prob, old_log_prob = inputs.log_prob, inputs.old_log_prob
    adv, eos_mask = inputs.advantages, inputs.response_mask
    prefix = inputs.prefix_mask.bool()
    log_ratio = log_prob - old_log_prob
    ppo_kl = masked_mean_plain(-log_ratio, eos_mask)
    ratio = torch.exp(log_ratio)
    on_losses, on_clipfrac = clipped_on_losses(adv, ratio, ratio, eos_mask, cfg)
    off_mask, on_mask = prefix * eos_mask, (~prefix) * eos_mask
    on_pg_loss = masked_mean_plain(on_losses, on_mask)
    off_ratio = shape_off_ratio(torch.exp(log_ratio), cfg.off_policy_reshape, "exgrpo_token")
    max_clip_frac = min_clip_frac = torch.tensor(0.0)
    if cfg.off_policy_max_clip is not None:
        off_ratio = torch.clamp(off_ratio, max=cfg.off_policy_max_clip)
        max_clip_frac = masked_mean_plain((off_ratio == cfg.off_policy_max_clip).float(), off_mask)
    if cfg.off_policy_min_clip is not None:
        off_ratio = torch.clamp(off_ratio, min=cfg.off_policy_min_clip)
        min_clip_frac = masked_mean_plain((off_ratio == cfg.off_policy_min_clip).float(), off_mask)
    off_ratio_mean = masked_mean_plain(off_ratio, off_mask)
    off_ratio_var, off_ratio_max = row_var_max(off_ratio, off_mask)
    on_ratio_var, on_ratio_max = row_var_max(ratio, on_mask)
    off_losses = -adv * off_ratio
    off_pg_loss = masked_mean_plain(off_losses, off_mask)
    prefix_f = prefix.float()
    pg_losses = off_losses * prefix_f + on_losses * (1 - prefix_f)
    if cfg.all_max_clip is not None:
        keep = (torch.exp(log_prob) <= cfg.all_max_clip).float()
        eos_mask = eos_mask * keep
        pg_losses = pg_losses * keep
    pg_loss = aggregate(pg_losses, eos_mask, cfg.loss_remove_token_mean)
    return pg_loss, {
        "off_pg_loss": _or_zero(off_pg_loss),
        "on_pg_loss": on_pg_loss.detach(),
        "off_pg_clipfrac": torch.tensor(0.0),  # the off-policy term is never clipped; theirs returns it as 0
        "on_pg_clipfrac": on_clipfrac,
        "ppo_kl": ppo_kl.detach(),
        "off_policy_prob": _or_zero(masked_mean_plain(torch.exp(log_prob), off_mask)),
        "on_policy_prob": _or_zero(masked_mean_plain(torch.exp(old_log_prob), on_mask)),
        "off_ratio_mean": _or_zero(off_ratio_mean),
        "on_ratio_mean": _or_zero(masked_mean_plain(ratio, on_mask)),
        "off_ratio_max_clip_frac": _or_zero(max_clip_frac),
        "off_ratio_min_clip_frac": _or_zero(min_clip_frac),
        "off_ratio_var_m": off_ratio_var,
        "on_ratio_var_m": on_ratio_var,
        "off_ratio_max_m": off_ratio_max,
        "on_ratio_max_m": on_ratio_max,
    }
