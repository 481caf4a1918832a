#!/usr/bin/env bash
# Prefix-RFT (arXiv 2507.01679, algorithm.method=prefix_rft; luffy_pool/methods/prefix_rft.py): in each group of
# n=8, one slot continues a prefix of the demonstration whose share decays by a cosine from 0.95 to 0.05 over the
# run; Dr.GRPO (no std, sum / L, PPO clip 0.2) over the group, only the top 20 % highest-entropy prefix tokens of
# a row take gradient. The authors released no code or script (none linked from the paper, none found), so there
# is no released script to mirror key by key. The paper states (arXiv 2507.01679; tests/exp_scripts/
# test_authors_settings.py cites it): the Dr. GRPO objective, the cosine prefix schedule from 95 % to 5 % of the
# demonstration, and the entropy-based clipping that keeps the top 20 % of prefix tokens by entropy. Everything
# else is LUFFY's train.sh, not a setting of the authors' (Qwen2.5-Math-7B on OpenR1 traces, lr 1e-6, batch 128,
# mini 64, response 8192, entropy 0.001, no KL, validation as train.sh: one sample at T=0.6 every 10 steps);
# 500 steps. Inferred, not stated in the paper (luffy_pool/methods/prefix_rft.py): one prefix slot per group
# (rollout.n_prefix=1), the same share for every prefix slot of a step, the prefix tokens under the same PPO
# ratio as the continuation.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_prefix_rft.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default Prefix-RFT); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-Prefix-RFT}
# algorithm.method=prefix_rft sets policy_loss=prefix_rft, adv_estimator=grpo and turns LUFFY's use_off_policy_loss
# off; its schedule replaces min/max_prefix_ratio (not read).
# the method's preset (luffy_pool/config/method/prefix_rft.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=prefix_rft \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    algorithm.prefix_rft.ratio_start=0.95 \
    algorithm.prefix_rft.ratio_end=0.05 \
    algorithm.prefix_rft.decay_steps=null \
    algorithm.prefix_rft.prefix_entropy_top_frac=0.2 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.actor.clip_ratio=0.2 \
    actor_rollout_ref.actor.loss_remove_clip=False \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    algorithm.grpo_use_std=False \
    trainer.total_training_steps=500 \
    "$@"
