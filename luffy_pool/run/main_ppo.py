"""Entry point of plain (on-policy) GRPO/PPO: ``python -m luffy_pool.run.main_ppo key=value ...``.

It is the LUFFY trainer with the off-policy pool switched off, exactly as LUFFY's
``train_on_policy.sh`` expresses its baseline: every slot has prefix ratio 0 (so ``prefix_mask`` is all
False and no trace reaches a group), and the actor uses verl's PPO loss. The same config file, checks
and launcher are used; the user's overrides come after these defaults and win. It lives here, not at verl's
``verl.trainer.main_ppo``: the trainer is luffy_pool's, and verl imports nothing from luffy_pool.
"""

from __future__ import annotations

import sys

ON_POLICY_DEFAULTS = [
    "actor_rollout_ref.rollout.min_prefix_ratio=0.0",
    "actor_rollout_ref.rollout.max_prefix_ratio=0.0",
    "actor_rollout_ref.actor.use_off_policy_loss=False",
]


def main() -> None:
    from luffy_pool.run.main_mix_ppo import main as mix_main

    sys.argv[1:1] = ON_POLICY_DEFAULTS
    mix_main()


if __name__ == "__main__":
    main()
