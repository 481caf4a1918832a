"""Rollout correction: truncated importance weights and rejection masks for the rollout/trainer mismatch.

The engine samples from pi_rollout (vLLM's kernels, bf16, possibly an older weight version); the PPO ratio is
taken against pi_old, the actor's own recomputation. Their per-token log-ratio ``log pi_old - log pi_rollout``
gives (verl's algorithm.rollout_correction, verl/trainer/ppo/rollout_corr_helper.py, docs/algo/rollout_corr.md):

- ``rollout_is`` (null | token | sequence): weights pi_old / pi_rollout per token, or their product per sequence,
  truncated from above at ``rollout_is_threshold`` (TIS), detached; the loss multiplies its per-token terms by them.
- ``rollout_is_batch_normalize``: the truncated weights divided by their batch mean, so they average 1 over the
  batch's valid tokens (token level) or over its sequences (sequence level, one weight each).
- ``rollout_rs`` (null | comma-separated options): a rejection mask. Each option is an estimator of the
  divergence (k1 = -log_ratio, k2 = log_ratio^2 / 2, k3 = exp(log_ratio) - 1 - log_ratio) at token level or
  aggregated per sequence (sum, mean, max); tokens or whole sequences beyond ``rollout_rs_threshold`` leave the
  response mask. k1 options take ratio bounds ``"lower_upper"`` (one number u means [1/u, u]); the others an
  upper bound. verl's older names map as token -> token_k1, sequence -> seq_sum_k1, geometric -> seq_mean_k1.
- metrics under ``rollout_corr/`` with verl's names: weight mean/max/min and the fractions beyond the
  thresholds (before truncation), the rejected fractions, and KL(pi_rollout || pi_old) estimates (kl, k3_kl).

Pure functions on [batch, response_length] tensors; nothing here reads the config or a DataProto.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from verl.utils.torch_functional import masked_mean, masked_mean_or_zero, masked_sum

ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
# exp(+-20) bounds every exponentiated log-ratio (as verl): a sequence's summed log-ratio easily overflows.
SAFETY_BOUND = 20.0
PREFIX = "rollout_corr/"

Threshold = Union[str, float, int, None]


@dataclass(frozen=True)
class RolloutCorrection:
    """``weights``: truncated, detached IS weights (0 on padding), None when ``rollout_is`` is off.
    ``response_mask``: the input mask less the rejected tokens. ``metrics``: ``rollout_corr/*`` floats."""

    weights: Optional[torch.Tensor]
    response_mask: torch.Tensor
    metrics: dict


def parse_rs_options(rollout_rs: str) -> list[str]:
    """The distinct options of a comma-separated ``rollout_rs`` string, in order; ValueError on an unknown one."""
    options = []
    for opt in (part.strip() for part in str(rollout_rs).split(",")):
        if not opt:
            continue
        if opt not in ROLLOUT_RS_OPTIONS:
            raise ValueError(f"rollout_rs option {opt!r} is not one of {', '.join(ROLLOUT_RS_OPTIONS)}")
        if opt not in options:
            options.append(opt)
    if not options:
        raise ValueError("rollout_rs names no option")
    return options


def parse_rs_thresholds(options: list[str], spec: Threshold) -> dict[str, tuple[Optional[float], float]]:
    """option -> (lower, upper). ``spec``: one number/entry for all options or one comma-separated entry each;
    a k1 entry is ``"lower_upper"`` ratio bounds or an upper ``u`` meaning [1/u, u]; other entries an upper bound."""
    if spec is None:
        raise ValueError("rollout_rs_threshold must be set when rollout_rs is")
    if isinstance(spec, bool) or not isinstance(spec, (str, int, float)):
        raise ValueError(f"rollout_rs_threshold must be a number or a string, got {spec!r}")
    entries = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(",") if p.strip()]
    if len(entries) == 1:
        entries = entries * len(options)
    if len(entries) != len(options):
        raise ValueError(
            f"rollout_rs_threshold has {len(entries)} entries for {len(options)} rollout_rs options "
            "(give one shared entry or one per option)"
        )
    bounds = {}
    for opt, entry in zip(options, entries):
        k1 = opt.endswith("k1")
        if "_" in entry and not k1:
            raise ValueError(f"rollout_rs_threshold entry {entry!r} for {opt}: only k1 options take 'lower_upper'")
        lower_s, upper_s = entry.split("_", 1) if "_" in entry else (None, entry)
        try:
            upper = float(upper_s)
            lower = None if lower_s is None else float(lower_s)
        except ValueError:
            raise ValueError(f"rollout_rs_threshold entry {entry!r} for {opt} is not a number") from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"rollout_rs_threshold entry {entry!r} for {opt} must be > 0")
        if k1 and lower is None:
            lower = 1.0 / upper
        bounds[opt] = (lower, upper)
    return bounds


def _require_tokens(response_mask: torch.Tensor) -> None:
    if not bool(response_mask.any()):
        raise ValueError("response_mask selects no token: rollout correction needs at least one")


def is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str, threshold: float
) -> tuple[torch.Tensor, dict]:
    """Truncated IS weights ``min(exp(log_ratio), threshold)`` per token (``token``) or
    ``min(exp(sum_t log_ratio), threshold)`` broadcast over the row (``sequence``), 0 on padding, detached.
    Metrics (unprefixed) describe the weights before truncation."""
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={rollout_is!r} is not one of {ROLLOUT_IS_LEVELS} (or null)")
    if not threshold > 0:
        raise ValueError(f"rollout_is_threshold={threshold!r} must be > 0")
    _require_tokens(response_mask)
    lower = 1.0 / threshold
    if rollout_is == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * response_mask
        valid = response_mask.bool()
        metrics = {
            "rollout_is_mean": masked_mean(raw, response_mask).item(),
            "rollout_is_max": raw.masked_fill(~valid, float("-inf")).max().item(),
            "rollout_is_min": raw.masked_fill(~valid, float("inf")).min().item(),
            "rollout_is_ratio_fraction_high": masked_mean((raw > threshold).float(), response_mask).item(),
            "rollout_is_ratio_fraction_low": masked_mean((raw < lower).float(), response_mask).item(),
        }
    else:
        seq_log = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(seq_log.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio) * response_mask
        # Per-sequence extremes and fractions in log space (the product itself may overflow); one per row.
        log_hi = torch.log(torch.tensor(threshold, device=log_ratio.device))
        log_lo = torch.log(torch.tensor(lower, device=log_ratio.device))
        metrics = {
            "rollout_is_mean": masked_mean(raw, response_mask).item(),
            "rollout_is_max": torch.exp(seq_log.max().clamp(max=SAFETY_BOUND)).item(),
            "rollout_is_min": torch.exp(seq_log.min()).item(),
            "rollout_is_ratio_fraction_high": (seq_log > log_hi).float().mean().item(),
            "rollout_is_ratio_fraction_low": (seq_log < log_lo).float().mean().item(),
        }
    return raw.clamp(max=threshold).detach(), metrics


def batch_normalize(weights: torch.Tensor, response_mask: torch.Tensor, rollout_is: str) -> tuple[torch.Tensor, float]:
    """``weights / mean`` and the mean (verl's ``rollout_is_batch_normalize``, applied after truncation): the mean
    over the valid tokens (``token``) or over the sequences with a valid token of each one's weight
    (``sequence``). A mean <= 1e-8 leaves the weights as they are (factor 1.0)."""
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={rollout_is!r} is not one of {ROLLOUT_IS_LEVELS}")
    _require_tokens(response_mask)
    if rollout_is == "token":
        mean = masked_mean(weights, response_mask)
    else:
        seq_valid = response_mask.sum(dim=-1) > 0
        mean = masked_mean_or_zero(weights, response_mask, axis=-1)[seq_valid].mean()
    if not float(mean) > 1e-8:
        return weights, 1.0
    return weights / mean, float(mean)


def fill_unknown_old_log_probs(
    old_log_prob: torch.Tensor, log_prob: torch.Tensor, prefix_mask: Optional[torch.Tensor]
) -> torch.Tensor:
    """``old_log_prob`` with its NaN entries on off-policy tokens (``prefix_mask``: under ``bypass_mode`` the engine
    did not sample them, so the driver has no old log-prob there) replaced by the current ``log_prob``, detached:
    their PPO ratio is 1, as in the first mini-batch after an old-log-prob pass. A NaN anywhere else is a fault and
    stays (the update's non-finite guard reports it). Elementwise, no device sync."""
    if prefix_mask is None:
        return old_log_prob
    unknown = torch.isnan(old_log_prob) & prefix_mask.bool()
    return torch.where(unknown, log_prob.detach().to(old_log_prob.dtype), old_log_prob)


def _seq_max(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    top = values.masked_fill(~response_mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)  # empty row -> 0


def _seq_reduce(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return {
        "sum": lambda v, m: masked_sum(v, m, axis=-1),
        "mean": lambda v, m: masked_mean_or_zero(v, m, axis=-1),
        "max": _seq_max,
    }[kind]


def rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str, threshold: Threshold
) -> tuple[torch.Tensor, dict]:
    """``response_mask`` with the tokens (token_* options) or whole sequences (seq_* options) that any option
    rejects set to 0, and the rejected fractions (unprefixed; ``_seq_`` = fraction of sequences touched)."""
    options = parse_rs_options(rollout_rs)
    bounds = parse_rs_thresholds(options, threshold)
    _require_tokens(response_mask)
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    estimators = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    valid = response_mask.bool()
    seq_valid = valid.any(dim=-1)
    keep_all = torch.ones_like(log_ratio, dtype=torch.bool)
    metrics = {}
    for opt in options:
        lower, upper = bounds[opt]
        level, estimator = opt.rsplit("_", 1)
        stat = estimators[estimator]
        if level != "token":
            stat = _seq_reduce(level.split("_", 1)[1])(stat, response_mask).unsqueeze(-1)
        if estimator == "k1":  # k1 is a log-ratio: its bounds are ratio bounds, compared in log space
            keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            keep = stat <= upper
        keep = keep.expand_as(log_ratio)
        keep_all &= keep
        rejected = ~keep & valid
        metrics[f"rollout_rs_{opt}_mean"] = masked_mean(stat.expand_as(log_ratio), response_mask).item()
        metrics[f"rollout_rs_{opt}_masked_fraction"] = masked_mean(rejected.float(), response_mask).item()
        metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = rejected.any(dim=-1)[seq_valid].float().mean().item()
    rejected = ~keep_all & valid
    metrics["rollout_rs_masked_fraction"] = masked_mean(rejected.float(), response_mask).item()
    # Over all rows, empty ones included (as verl).
    metrics["rollout_rs_seq_masked_fraction"] = rejected.any(dim=-1).float().mean().item()
    return (response_mask * keep_all.to(response_mask.dtype)).to(response_mask.dtype), metrics


def mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """Unprefixed estimates of KL(pi_rollout || pi_old) over the valid tokens: ``kl`` (k1, mean of
    log pi_rollout - log pi_old) and ``k3_kl`` (mean of r - 1 - log r, r = pi_old / pi_rollout; >= 0 per token);
    ``chi2_token``: E[r^2] - 1, the spread of the token weights."""
    _require_tokens(response_mask)
    log_ratio = old_log_prob - rollout_log_prob
    r = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    return {
        "kl": masked_mean(-log_ratio, response_mask).item(),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, response_mask).item(),
        "chi2_token": (masked_mean(r.square(), response_mask) - 1.0).item(),
    }


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Threshold = None,
) -> RolloutCorrection:
    """IS weights (if ``rollout_is``; divided by their batch mean with ``rollout_is_batch_normalize``, metric
    ``rollout_is_batch_norm_factor``, the other weight metrics before it), rejection (if ``rollout_rs``) and
    ``rollout_corr/*`` metrics for one batch.

    The weights are computed on the given mask, not the rejected one (as verl): rejection only removes tokens
    from the loss. Pass the mask of the engine-generated tokens only: LUFFY's off-policy prefix tokens have no
    engine log-prob (their behaviour policy is modelled by the off-policy loss's shaping instead).
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} "
            f"and response_mask {tuple(response_mask.shape)} must have one shape"
        )
    _require_tokens(response_mask)
    log_ratio = old_log_prob - rollout_log_prob
    metrics, weights, mask = {}, None, response_mask.clone()
    if rollout_is is not None:
        weights, is_metrics = is_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold)
        metrics.update(is_metrics)
        if rollout_is_batch_normalize:
            weights, metrics["rollout_is_batch_norm_factor"] = batch_normalize(weights, response_mask, rollout_is)
    if rollout_rs is not None:
        mask, rs_metrics = rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(mismatch_metrics(old_log_prob, rollout_log_prob, response_mask))
    return RolloutCorrection(
        weights=weights, response_mask=mask, metrics={PREFIX + k: float(v) for k, v in metrics.items()}
    )


# Under ``bypass_mode`` a token the engine did not sample (an off-policy prefix token) takes the current policy's
# log-prob as its old one (verl/workers/actor/dp_actor.py update_policy): only a loss that reads the old log-probs
# through the PPO ratio and its metrics alone stays right, which its registration declares
# (``register_policy_loss(..., supports_bypass_mode=True)``, the table verl.trainer.ppo.loss_inputs.BYPASS_LOSSES).
# A loss that holds demonstration tokens to a trust region around the old-log-prob pass, which bypass mode does not
# run, does not declare it.

CALCULATE_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs"
LOGPROBS_MODE = "actor_rollout_ref.rollout.logprobs_mode"
TEMPERATURE = "actor_rollout_ref.rollout.temperature"
_RC = "algorithm.rollout_correction"


def config_errors(get: Callable[[str], object]) -> list[str]:
    """The cross-key rules of ``algorithm.rollout_correction`` on a dotted-key getter (luffy_pool/config/check):
    IS, rejection or bypass mode need the engine's sampling log-probs (under the temperature the actor uses),
    rejection needs valid options and thresholds, batch normalisation needs IS weights, and bypass mode a loss
    registered for it (``BYPASS_LOSSES``) and no correction against old log-probs it no longer computes."""
    errors = []
    rollout_is, rollout_rs = get(f"{_RC}.rollout_is"), get(f"{_RC}.rollout_rs")
    for name, value in (("rollout_is", rollout_is), ("rollout_rs", rollout_rs)):
        if value is not None and not get(CALCULATE_LOG_PROBS):
            errors.append(
                f"'{_RC}.{name}'={value!r} needs '{CALCULATE_LOG_PROBS}'=True (the weights compare the "
                "engine's sampling log-probs with the actor's); set it or set the correction to null"
            )
    if get(f"{_RC}.rollout_is_batch_normalize") and rollout_is is None:
        errors.append(
            f"'{_RC}.rollout_is_batch_normalize'=True needs '{_RC}.rollout_is' (token or sequence): "
            "it normalises the IS weights"
        )
    errors += _bypass_errors(get, rollout_is, rollout_rs)
    mode, temperature = get(LOGPROBS_MODE), get(TEMPERATURE)
    if (rollout_is is not None or rollout_rs is not None) and mode == "raw_logprobs" and temperature not in (None, 1.0):
        # raw_logprobs are of the unscaled logits; the actor's old log-probs are of logits / temperature
        errors.append(
            f"'{_RC}' needs '{LOGPROBS_MODE}'=processed_logprobs at '{TEMPERATURE}'={temperature} (raw "
            "log-probs ignore the temperature the actor's old log-probs divide by)"
        )
    if rollout_rs is not None:
        try:
            parse_rs_thresholds(parse_rs_options(rollout_rs), get(f"{_RC}.rollout_rs_threshold"))
        except ValueError as exc:
            errors.append(f"'{_RC}.rollout_rs'={rollout_rs!r}: {exc}")
    return errors


def _bypass_errors(get: Callable[[str], object], rollout_is, rollout_rs) -> list[str]:
    if not get(f"{_RC}.bypass_mode"):
        return []
    from verl.trainer.ppo.loss_inputs import BYPASS_LOSSES, resolve_policy_loss

    key, errors = f"'{_RC}.bypass_mode'=True", []
    if not get(CALCULATE_LOG_PROBS):
        errors.append(f"{key} needs '{CALCULATE_LOG_PROBS}'=True (the engine's log-probs become the old log-probs)")
    for name, value in (("rollout_is", rollout_is), ("rollout_rs", rollout_rs)):
        if value is not None:  # verl computes them inside its bypass loss (loss_type), which is not shipped
            errors.append(
                f"{key} cannot be combined with '{_RC}.{name}'={value!r}: the old log-probs are the "
                "engine's, so the weights would all be 1 (the PPO ratio itself is pi / pi_rollout)"
            )
    try:
        loss = resolve_policy_loss(get("actor_rollout_ref.actor"))
    except ValueError:
        loss = None  # two loss switches on: the actor section's own rule names them
    if loss is not None and loss not in BYPASS_LOSSES:
        errors.append(
            f"{key} needs a policy loss of {', '.join(sorted(BYPASS_LOSSES))}, not {loss!r}: it keeps a "
            "trust region on demonstration tokens around the old-log-prob pass that bypass mode skips"
        )
    if get("actor_rollout_ref.ref.use_ref") and not get("actor_rollout_ref.actor.use_kl_loss"):
        errors.append(
            f"{key} cannot be combined with the KL-in-reward penalty (use_ref=True, use_kl_loss=False): it "
            "needs old log-probs on the off-policy tokens, which the engine did not sample"
        )
    return errors
