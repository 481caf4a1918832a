"""``algorithm.method=grpo``: on-policy GRPO, verl's PPO-clip loss, no off-policy slot in any group.

It replaces LUFFY's loss switch and its off-policy slots (``rollout.n_prefix=0``: every slot is sampled by the
policy); the clip, aggregation and advantage keys stay the user's (LUFFY's train_on_policy.sh baseline keeps
them as LUFFY has them)."""

from luffy_pool.methods.base import Method, register_method

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"

GRPO = register_method(
    Method(
        name="grpo",
        mechanism="on-policy rollouts only, PPO-clip loss",
        requires={f"{A}.policy_loss": "vanilla"},
        replaces={f"{A}.use_off_policy_loss": False, f"{R}.n_prefix": 0},
    )
)
