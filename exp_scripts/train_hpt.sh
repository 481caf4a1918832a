#!/usr/bin/env bash
# HPT (arXiv 2509.04419, algorithm.method=hpt; luffy_pool/methods/hpt.py): per prompt, SFT on the demonstration
# when its on-policy rollouts have no success (switch_gate=0), RL on the rollouts otherwise. Mirrors
# TsinghuaC3I/Unify-Post-Training exp_scripts/train.sh for Qwen2.5-Math-7B (commit ae332f5f): lr 5e-6,
# batch 128, mini 64, dynamic bsz, response 8192, 500 steps, entropy 0.001, no KL, unclipped on-policy loss,
# sum/8192 aggregation, Dr.GRPO advantages (no std) over the 8 verify rollouts, sft_loss_coef 1.0,
# validation n=8 at T=0.6. Here the verify rollouts and the demonstration share one group of rollout.n=8 with
# one full-trace slot (n_prefix=1): 7 verify rollouts, not the authors' 8 (rollout.n=9 gives their 8, but 9 rows
# per prompt do not split over the rehearsal's 4 ranks at its scaled mini-batch of 2 prompts).
# Not reproduced: their max_grad_norm=80 step skip (grad clip stays 1.0), reward_impl_version=6 (LUFFY's v3 here).
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_hpt.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default HPT); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-HPT}
# algorithm.method=hpt sets policy_loss=hpt, adv_estimator=grpo_split and turns LUFFY's use_off_policy_loss off.
# the method's preset (luffy_pool/config/method/hpt.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=hpt \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    algorithm.hpt.switch_gate=0 \
    actor_rollout_ref.actor.optim.lr=5e-6 \
    actor_rollout_ref.actor.sft_loss_coef=1.0 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.rollout.min_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.n_val=8 \
    actor_rollout_ref.actor.loss_remove_clip=True \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    algorithm.grpo_use_std=False \
    trainer.total_training_steps=500 \
    "$@"
