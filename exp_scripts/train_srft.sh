#!/usr/bin/env bash
# SRFT (arXiv 2506.19767, algorithm.method=srft; luffy_pool/methods/srft.py): entropy-weighted SFT on the
# demonstration (0.5·exp(-H)), LUFFY's shaped off-policy term on it (p/(p+0.1)) and sign-weighted on-policy
# terms (0.1·exp(H) on correct rollouts, -1 otherwise) in one loss. Mirrors the HPT authors' baseline
# TsinghuaC3I/Unify-Post-Training exp_scripts/train_srft.sh (commit ae332f5f; no official SRFT code) for
# Qwen2.5-Math-7B: lr 1e-6, n=8 with one full demonstration row (n_prefix=1), unclipped, sum/8192, batch 128,
# mini 64, 500 steps, entropy 0.001, no grad-skip bound (their yaml sets no max_grad_norm), validation before
# training and every 10 steps with 8 samples per prompt at T=0.6.
# Differences, each for a reason (their script's line; tests/exp_scripts/test_authors_settings.py holds the table):
# - reward_impl_version=6 (line 105) is their copy of the Dr. GRPO math grader (hpt/verl/verl/mix_src/entropy_math:
#   the last \boxed answer of the whole response, mathd-normalised, sympy or math-verify equal; binary, no think
#   format required). This project has versions 0-4: version 4 (no think format required) with
#   reward.grader=any (math-verify, or the rule grader on the last boxed or stated answer) is the nearest.
# - val_top_p=0.95 (line 71) is not read by their trainer's rollout (mix_vllm_rollout.py lines 235-245 validate
#   at top_p 1.0 and val_temperature), so their validation samples at top_p 1.0, as this project's always does.
# - their validation files are AIME24, AMC23 and MATH-500 (line 39); here train.sh's valid.parquet (LUFFY's).
# - gpu_memory_utilization 0.75 (line 67): train.sh's 0.73, sized for vLLM 0.32 (train.sh says why).
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
    actor_rollout_ref.rollout.n_val=8 \
    actor_rollout_ref.rollout.val_temperature=0.6 \
    trainer.val_before_train=True \
    data.reward_impl_version=4 \
    reward.grader=any \
    trainer.total_training_steps=500 \
    "$@"
