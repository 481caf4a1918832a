#!/usr/bin/env bash
# RL-PLUS (arXiv 2508.00222, algorithm.method=rl_plus; luffy_pool/methods/rl_plus.py): LUFFY's slot plan and loss,
# with the demonstration's tokens weighted by the mixture ratio 4p/(3q+1) (their code's multiple importance sampling,
# q the old policy's probability) and the exploration weight (1-p)^0.5 on their advantage. Mirrors the authors'
# YihongDong/RL-PLUS exp_scripts/train_RL-PLUS.sh (commit eb4aa4d4), which is LUFFY's train.sh key for key except
# that off_policy_strategy=RL-PLUS replaces off_policy_reshape=p_div_p_0.1: Qwen2.5-Math-7B-16k-think, lr 1e-6,
# batch 128, mini 64, n=8 with one full demonstration row (n_prefix=1), grpo without std over all 8 rows, unclipped,
# sum/8192, entropy 0.001, reward v3, 30 epochs; so train.sh's list below is theirs and the lines here restate the
# keys that make the method. Differences from their script, all train.sh's (see its header): the logger list adds
# wandb (theirs: console only), LUFFY's trainer switches (first update at lr 0, total-1 updates: their trainer is
# LUFFY's), the memory plan, rollout speed and recovery keys. Their values, key by key with file and line:
# tests/exp_scripts/test_authors_settings.py (RL_PLUS).
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_rl_plus.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME and WANDB_PROJECT default RL-PLUS, their names); extra arguments
# are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-RL-PLUS}
export WANDB_PROJECT=${WANDB_PROJECT:-RL-PLUS}
# algorithm.method=rl_plus sets policy_loss=rl_plus and turns LUFFY's use_off_policy_loss and its shaping off;
# the method's preset (luffy_pool/config/method/rl_plus.yaml) is stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=rl_plus \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.actor.off_policy_reshape=no_reshape \
    algorithm.rl_plus.explore_gamma=0.5 \
    algorithm.rl_plus.mis_expert_prob=1.0 \
    actor_rollout_ref.actor.off_policy_max_clip=-1 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.rollout.min_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 \
    algorithm.adv_estimator=grpo \
    algorithm.grpo_use_std=False \
    actor_rollout_ref.actor.loss_remove_clip=True \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    actor_rollout_ref.actor.entropy_coeff=0.001 \
    trainer.total_epochs=30 \
    "$@"
