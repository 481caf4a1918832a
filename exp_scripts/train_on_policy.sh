#!/usr/bin/env bash
# LUFFY's on-policy GRPO baseline (docs/METHOD.md §2.3): exp_scripts/train.sh with every slot on-policy.
# Differences from train.sh, exactly as LUFFY's train_on_policy.sh: EXP_NAME=ON_POLICY_TEST,
# min_prefix_ratio = max_prefix_ratio = 0.0 (prefix_mask all False), and off_policy_reshape /
# loss_remove_clip left at their YAML defaults (no_reshape, False: the PPO clip eps=0.2 is ACTIVE, a
# confound vs LUFFY, docs/METHOD.md §7 item 2). They are passed explicitly below because train.sh sets them; the extra
# arguments of this script still come last and win.
#
# Usage: [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_on_policy.sh [key=value ...]
set -euo pipefail
export EXP_NAME=${EXP_NAME:-ON_POLICY_TEST}
exec bash "$(dirname "$0")/train.sh" \
    actor_rollout_ref.rollout.min_prefix_ratio=0.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=0.0 \
    actor_rollout_ref.actor.off_policy_reshape=no_reshape \
    actor_rollout_ref.actor.loss_remove_clip=False \
    "$@"
