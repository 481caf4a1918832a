#!/usr/bin/env bash
# SRFT (arXiv 2506.19767, algorithm.method=srft; luffy_pool/methods/srft.py): entropy-weighted SFT on the
# demonstration (0.5·exp(-H)), LUFFY's shaped off-policy term on it (p/(p+0.1)) and sign-weighted on-policy
# terms (0.1·exp(H) on correct rollouts, -1 otherwise) in one loss. Mirrors the HPT authors' baseline
# TsinghuaC3I/Unify-Post-Training exp_scripts/train_srft.sh (commit ae332f5f; no official SRFT code) for
# Qwen2.5-Math-7B: lr 1e-6, n=8 with one full demonstration row (n_prefix=1), unclipped, sum/8192, batch 128,
# mini 64, 500 steps, entropy 0.001, no grad-skip bound.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_srft.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default SRFT); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-SRFT}
# algorithm.method=srft sets policy_loss=srft and turns LUFFY's use_off_policy_loss off.
# the method's preset (luffy_pool/config/method/srft.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=srft \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    algorithm.srft.srft_type=paper \
    algorithm.srft.sft_weight_scale=0.5 \
    algorithm.srft.rl_pos_weight_scale=0.1 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.rollout.min_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 \
    actor_rollout_ref.actor.off_policy_reshape=p_div_p_0.1 \
    actor_rollout_ref.actor.loss_remove_clip=True \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    trainer.total_training_steps=500 \
    "$@"
