#!/usr/bin/env bash
# LUFFY's "RL with SFT loss" baseline (docs/METHOD.md §2.3): exp_scripts/train.sh with the same
# 1-full-trace-per-group mixing (n=8, n_prefix=1, prefix ratio 1.0), but the off-policy trace is learned
# with a plain NLL term added to the on-policy PPO loss (multi-task loss, sft_loss_coef=1.0) instead of
# LUFFY's shaped off-policy policy gradient, and the group advantage leaves the trace out of its mean/std
# (grpo_split). As LUFFY's script: no on-policy PPO clip, sum/8192 loss aggregation, EXP_NAME
# LUFFY_RL_with_SFT_LOSS. 1 node x 8 GPUs (80 GB).
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_rl_sft_loss.sh [key=value ...]
# Env overrides (defaults in brackets): ROOT [this repository; LUFFY hard-coded a cluster path here],
# DATA_DIR [$ROOT/data: must hold openr1.parquet and valid.parquet from data/prepare_train.py],
# MODEL_PATH [Elliott/Qwen2.5-Math-7B-16k-think], EXP_NAME [LUFFY_RL_with_SFT_LOSS],
# WANDB_PROJECT [luffy-math-test], RAY_STOP, PYTHON: as exp_scripts/train.sh.
# Extra arguments are Hydra overrides appended last, so they win (e.g. trainer.total_training_steps=500,
# or --cfg job to print the composed config without training).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-LUFFY_RL_with_SFT_LOSS}
# use_off_policy_loss=False and use_sft_multitask_loss=True are exclusive switches of the actor loss;
# off_policy_reshape is read by neither path, so it is reset to the YAML default to keep the logged
# config honest. train.sh already passes loss_remove_token_mean=True; repeated here as LUFFY's script does.
exec bash "$HERE/train.sh" \
    algorithm.adv_estimator=grpo_split \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.rollout.min_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.actor.off_policy_reshape=no_reshape \
    actor_rollout_ref.actor.use_sft_multitask_loss=True \
    actor_rollout_ref.actor.sft_loss_coef=1.0 \
    actor_rollout_ref.actor.loss_remove_clip=True \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    "$@"
