#!/usr/bin/env bash
# UFT (arXiv 2505.16984, algorithm.method=uft; luffy_pool/methods/uft.py): every rollout of a prompt continues a
# hint, the first j of (at most 5) solution segments, j ~ Binomial(5, p(t)) with p cosine-annealed 0.95 -> 0.05
# over the first 300 steps and 0 after; GRPO (group std on, PPO clip 0.2, token mean) on the continuation plus
# 0.001 x the hint tokens' NLL, low-variance KL loss 0.001 to the reference, entropy 0.001. Mirrors liumy2010/UFT
# run.py -> scripts/train.sh (commit ad3c8ec7): lr 1e-6, 256 prompts x 4 rollouts per step, mini 64, 500 steps,
# response 1024. Here the hint is the start of the response (UFT: the end of the prompt), so the response holds
# hint + continuation: max_response_length 2048 with hints up to 1024 tokens (rollout.max_prefix_len; longer ones
# are cut, metric uft/hints_cut). Model, data, prompt length and validation as exp_scripts/train.sh
# (Qwen2.5-Math-7B; UFT's own runs: Qwen2.5-0.5B..3B, Llama-3.2). Not reproduced: UFT's raw-text prompts (no chat
# template), its ±100 logit clamp in the hint NLL.
# Data: $DATA_DIR/openr1.uft.parquet, openr1.parquet with the hint column, written once by
#   python data/prepare_uft_hints.py --input $DATA_DIR/openr1.parquet --output $DATA_DIR/openr1.uft.parquet
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_uft.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default UFT); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-UFT}
# algorithm.method=uft sets policy_loss=uft, adv_estimator=grpo and turns LUFFY's use_off_policy_loss off; its hint
# draw replaces the prefix keys (n_prefix, min/max_prefix_ratio: not read).
# the method's preset (luffy_pool/config/method/uft.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=uft \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    data.train_files=$DATA_DIR/openr1.uft.parquet \
    algorithm.uft.hint_key=hint \
    algorithm.uft.schedule=cosine \
    algorithm.uft.total_training_steps_hint=300 \
    algorithm.uft.lower_prob=0.05 \
    algorithm.uft.upper_prob=0.95 \
    algorithm.uft.max_segments=5 \
    algorithm.uft.hint_sft_coef=0.001 \
    data.train_batch_size=256 \
    data.max_response_length=2048 \
    actor_rollout_ref.rollout.max_prefix_len=1024 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.clip_ratio=0.2 \
    actor_rollout_ref.actor.loss_remove_clip=False \
    actor_rollout_ref.actor.loss_remove_token_mean=False \
    actor_rollout_ref.actor.entropy_coeff=0.001 \
    actor_rollout_ref.ref.use_ref=True \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    algorithm.grpo_use_std=True \
    trainer.total_training_steps=500 \
    "$@"
