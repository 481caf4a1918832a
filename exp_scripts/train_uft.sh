#!/usr/bin/env bash
# UFT (arXiv 2505.16984, algorithm.method=uft; luffy_pool/methods/uft.py): every rollout of a prompt continues a
# hint, the first j of (at most 5) solution segments, j ~ Binomial(5, p(t)) with p cosine-annealed 0.95 -> 0.05
# over the first 300 steps and 0 after; GRPO (group std on, PPO clip 0.2, token mean) on the continuation plus
# 0.001 x the hint tokens' NLL, low-variance KL loss 0.001 to the reference, entropy 0.001 (both over the
# continuation, as UFT's: luffy_pool/methods/uft.py). Mirrors liumy2010/UFT run.py -> scripts/train.sh (commit
# ad3c8ec7; run.py's math settings with more than one GPU): lr 1e-6 constant, 256 prompts x 4 rollouts per step,
# mini-batch 64 and micro-batch 4 prompts (token-mean loss per micro-batch, as theirs: no token packing), prompt
# 1024, all 500 steps trained (their loop stops after step 500, not before it), seed 0, greedy validation (one
# sample at temperature 0) before training and every 25 steps, a checkpoint every 100 steps.
# Differences, each for a reason (tests/exp_scripts/test_authors_settings.py holds the table with their lines):
# - the hint is the start of the response (UFT: the end of the prompt), so the response holds hint +
#   continuation: max_response_length 2048 (theirs 1024) with hints up to 1024 tokens (rollout.max_prefix_len;
#   longer ones are cut, metric uft/hints_cut).
# - model, data and reward as exp_scripts/train.sh (Qwen2.5-Math-7B on OpenR1 traces cut into hints, LUFFY's
#   math-verify reward v3; UFT's own runs: Qwen2.5-0.5B..3B and Llama-3.2 on their MATH split, whose reward gives
#   0.1 to a parsed wrong answer: trainer.format_score, verl/trainer/config/ppo_trainer.yaml line 149).
# - the log-prob passes stay token-packed (log_prob_use_dynamic_bsz, train.sh's budget): no effect on the numbers.
# Not reproduced: UFT's raw-text prompts (no chat template), its ±100 logit clamp in the hint NLL.
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
    actor_rollout_ref.actor.ppo_micro_batch_size=4 \
    actor_rollout_ref.actor.use_dynamic_bsz=False \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.actor.clip_ratio=0.2 \
    actor_rollout_ref.actor.loss_remove_clip=False \
    actor_rollout_ref.actor.loss_remove_token_mean=False \
    actor_rollout_ref.actor.entropy_coeff=0.001 \
    actor_rollout_ref.ref.use_ref=True \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    algorithm.grpo_use_std=True \
    actor_rollout_ref.rollout.n_val=1 \
    actor_rollout_ref.rollout.val_temperature=0 \
    trainer.val_before_train=True \
    trainer.test_freq=25 \
    trainer.save_freq=100 \
    trainer.seed=0 \
    trainer.total_training_steps=500 \
    trainer.stop_one_step_early=False \
    "$@"
