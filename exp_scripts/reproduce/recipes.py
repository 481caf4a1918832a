"""Each family method's own recipe, scaled to the tiny run: the algorithm keys of ``exp_scripts/train_<method>.sh``
(the overrides its ``exec bash "$HERE/train.sh"`` block passes on top of LUFFY's train.sh) applied over
``tiny_cpu_luffy.yaml`` (LUFFY's train.sh at tiny scale), so that a method runs with its own loss aggregation,
clip, entropy and KL settings, advantage normalisation, group size and updates per step, not LUFFY's.

What a recipe keeps and what the tiny run replaces:

- kept as the script says (``KEPT``): the ``algorithm.*`` knobs, the actor's loss keys (clip ratio, clip removal,
  token mean, entropy and KL coefficients, reshaping, SFT coefficient, grad clip, weight decay, betas), the
  reference model switch and the rollout's slot plan (prefix slots and ratios, temperature);
- scaled: the group size ``rollout.n`` by tiny n / LUFFY's 8; the updates per step by the recipe's
  ``train_batch_size / ppo_mini_batch_size`` (train.sh's 128 / 64 where the script keeps LUFFY's); the knobs tied
  to the batch or the run length (``SCALED``: ReLIFT's SFT buffer and lr, UFT's hint schedule);
- replaced by the tiny run (every other key): data files and lengths, batch, lr, steps, seeds, validation,
  checkpoints, the model's memory and micro-batching settings, the reward version and grader (the tiny task's
  reward), ``skip_grad_bound`` (a bound on a 7B model's gradient norm).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reproduce.methods import RunSettings

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.dirname(HERE)
LUFFY_N = 8  # exp_scripts/train.sh rollout.n: the tiny run's n stands for it
LUFFY_BATCH, LUFFY_MINI = 128, 64  # exp_scripts/train.sh data.train_batch_size, ppo_mini_batch_size
# Keys of a recipe applied as they are (prefix match).
KEPT = (
    "algorithm.",
    "actor_rollout_ref.actor.clip_ratio",
    "actor_rollout_ref.actor.loss_remove_clip",
    "actor_rollout_ref.actor.loss_remove_token_mean",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.actor.use_off_policy_loss",
    "actor_rollout_ref.actor.use_sft_multitask_loss",
    "actor_rollout_ref.actor.off_policy_reshape",
    "actor_rollout_ref.actor.off_policy_max_clip",
    "actor_rollout_ref.actor.sft_loss_coef",
    "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.optim.weight_decay",
    "actor_rollout_ref.actor.optim.betas",
    "actor_rollout_ref.ref.use_ref",
    "actor_rollout_ref.rollout.n_prefix",
    "actor_rollout_ref.rollout.min_prefix_ratio",
    "actor_rollout_ref.rollout.max_prefix_ratio",
    "actor_rollout_ref.rollout.temperature",
)
# Knobs tied to the authors' batch or run length: rescaled by ``scaled_knobs`` (reason beside each).
SCALED = (
    "algorithm.relift.sft_data_size",
    "algorithm.relift.sft_mini_batch_size",
    "algorithm.relift.sft_micro_batch_size",
    "algorithm.relift.sft_lr",
    "algorithm.uft.total_training_steps_hint",
)
N_KEY = "actor_rollout_ref.rollout.n"
BATCH_KEY, MINI_KEY = "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"


def script_path(method: str) -> str:
    return os.path.join(SCRIPTS, f"train_{method}.sh")


def script_overrides(method: str) -> dict[str, str]:
    """``{key: value}`` of the overrides ``exp_scripts/train_<method>.sh`` passes to train.sh (its ``exec`` block)."""
    with open(script_path(method)) as f:
        text = f.read()
    block = re.search(r'^exec bash "\$HERE/train\.sh" \\\n(.*?)"\$@"', text, re.S | re.M)
    if block is None:
        raise ValueError(f"{script_path(method)}: no exec block to train.sh")
    out: dict[str, str] = {}
    for token in shlex.split(block.group(1).replace("\\\n", " ")):
        if "=" in token and "$" not in token:
            key, value = token.split("=", 1)
            out[key.lstrip("+")] = value
    return out


def recipe_keys(method: str) -> dict[str, str]:
    """The recipe's keys applied as they are (``KEPT``, minus ``SCALED``)."""
    over = script_overrides(method)
    return {k: v for k, v in over.items() if k.startswith(KEPT) and k not in SCALED}


def updates_per_step(method: str) -> int:
    """Optimizer updates per training step in the recipe: batch / mini-batch (train.sh's where the script keeps
    them)."""
    over = script_overrides(method)
    batch = int(over.get(BATCH_KEY, LUFFY_BATCH))
    mini = int(over.get(MINI_KEY, LUFFY_MINI))
    return max(1, batch // mini)


def scaled_knobs(method: str, s: "RunSettings") -> dict[str, str]:
    """ReLIFT's SFT stage fires once a batch's worth of hard questions is buffered (theirs: 128 = their batch) and
    trains at the RL lr (theirs: 1e-6 both); UFT's hint anneals over 0.6 of the run (theirs: 300 of 500 steps)."""
    if method == "relift":
        return {
            "algorithm.relift.sft_data_size": str(s.batch_size),
            "algorithm.relift.sft_mini_batch_size": str(s.batch_size),
            "algorithm.relift.sft_micro_batch_size": str(s.sft_micro_batch_size),
            "algorithm.relift.sft_lr": str(s.lr),
        }
    if method == "uft":
        return {"algorithm.uft.total_training_steps_hint": str(max(1, round(0.6 * s.steps)))}
    return {}


def recipe_overrides(method: str, s: "RunSettings") -> list[str]:
    """The method's recipe on the tiny run: its kept keys, n and updates per step scaled, its scaled knobs."""
    over = script_overrides(method)
    keys = recipe_keys(method)
    n = max(1, round(int(over.get(N_KEY, LUFFY_N)) * s.n / LUFFY_N))
    mini = max(1, s.batch_size // updates_per_step(method))
    keys.update(
        {
            N_KEY: str(n),
            MINI_KEY: str(mini),
            "actor_rollout_ref.actor.ppo_micro_batch_size": str(mini),
            **scaled_knobs(method, s),
        }
    )
    return [f"{k}={v}" for k, v in keys.items()]


def recipe_summary(method: str) -> str:
    """One line for results.md: the keys taken from the method's script and how n / updates per step were scaled."""
    over = script_overrides(method)
    kept = ", ".join(
        f"`{k.split('.', 1)[1] if k.startswith('actor_rollout_ref.') else k}={v}`"
        for k, v in recipe_keys(method).items()
    )
    return (
        f"from `exp_scripts/train_{method}.sh`: {kept}; n = {over.get(N_KEY, LUFFY_N)} x tiny n / 8; "
        f"{updates_per_step(method)} update(s) per step"
        + (
            f"; rescaled: {', '.join(f'`{k}`' for k in SCALED if k.split('.')[1] == method)}"
            if method in ("relift", "uft")
            else ""
        )
    )


def merge_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with one value per key: a later one replaces an earlier one in place (the method's recipe
    over the shared settings)."""
    merged: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+")
        merged[key] = item  # a dict keeps the first position of a key
    return list(merged.values())
