"""``algorithm.method=grpo``: on-policy GRPO, verl's PPO-clip loss, no off-policy slot in any group.

Its YAML group turns LUFFY's loss switches off and its off-policy slots (``rollout.n_prefix=0``: every slot is
sampled by the policy); the clip, aggregation and advantage keys stay the user's (LUFFY's train_on_policy.sh
baseline keeps them as LUFFY has them)."""

from luffy_pool.methods.base import Method, register_method

GRPO = register_method(Method(name="grpo", mechanism="on-policy rollouts only, PPO-clip loss"))
