#!/usr/bin/env bash
# QuestA (arXiv 2507.13266, algorithm.method=questa; luffy_pool/methods/questa.py): every prompt's problem gets the
# first p of its demonstration's solution (characters after </think>) as a "## Hint." (none below 10 characters),
# p = 0.5 for the first half of the run, then 0.25; PPO on the hinted prompts (no demonstration token trained),
# reward 5·r clipped to ±20, normalised over all the batch's tokens, groups all solved / all failed dropped.
# Mirrors foreverlasting1202/QuestA AReaL/scripts/partial_50_grpo.yaml and partial_50_25_grpo.yaml (commit 3c7be001)
# key by key: 128 prompts x 16 rollouts per step in one mini-batch (ppo_n_minibatches=1), temperature 1.0, 24,000
# new tokens, 4,096 prompt tokens, PPO clip 0.2, no KL and no entropy term, AdamW lr 2e-5 constant with 0.1 %
# warm-up, weight decay 0.05, betas (0.9, 0.95), grad clip 1.0, 32,768 tokens per micro-batch, 100 epochs, seed 1,
# a checkpoint every 50 steps.
# Differences, each on purpose: the two stages are one run (theirs: two runs, stage 2 from stage-1 weights with a
# fresh optimizer and 2,048 prompt tokens; their code gives no step count, here algorithm.questa.stage_starts=[0.5]:
# pass e.g. [0.6] to move the switch, or hint_ratios=[0.25] stage_starts=[] with MODEL_PATH=<stage-1 model> for their
# second run); synchronous rollouts (theirs: asynchronous, up to 4 versions stale, with the decoupled loss's
# behaviour weight capped at 5, which is 1 here); a dropped group is not replaced by a new prompt; Adam eps is
# torch's 1e-8 (theirs 1e-5: no key here); 1 node x 8 GPUs as train.sh (theirs 8 x 8: pass trainer.nnodes=8); their
# OpenMath-Nemotron-1.5B is replaced by DeepSeek-R1-Distill-Qwen-1.5B, the base of DeepScaleR-1.5B (the paper's other
# QuestA model), whose config the checks have (pass MODEL_PATH=nvidia/OpenMath-Nemotron-1.5B for theirs); their
# rlvr_test block is unused (their evaluation is commented out): validation as train.sh, every 50 steps (evaluator
# freq_steps). Reward: data.reward_impl_version=3 (math-verify; theirs realhf's math_parser), success = score 1.
# Data: $DATA_DIR/openr1.parquet as train.sh (QuestA trains on OpenR1-50-0-4, the OpenR1-Math problems their base
# model rarely solves: the same format, problem as the user message, the R1 generation as target, the answer as
# reward_model.ground_truth). The hints are cut at run time from the target column; rows whose answer is not in
# the solution are left out, as their add_prefix.py drops them. Their values, key by key with file and line:
# tests/exp_scripts/test_authors_settings.py (QUESTA).
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_questa.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default QuestA); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-QuestA}
export MODEL_PATH=${MODEL_PATH:-deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B}
# algorithm.method=questa sets policy_loss=questa, n_prefix=0 and turns LUFFY's use_off_policy_loss off; its hook
# replaces the estimator's advantage (so grpo_use_std and the prefix weights are not read), its loss always clips
# and takes the step's token mean (loss_remove_clip / loss_remove_token_mean stated False, train.sh's are True).
# LUFFY's trainer quirks train.sh switches on (an lr-0 first update, total-1 updates) are off: AReaL has neither.
exec bash "$HERE/train.sh" \
    algorithm.method=questa \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.rollout.n_prefix=0 \
    "algorithm.questa.hint_ratios=[0.5,0.25]" \
    "algorithm.questa.stage_starts=[0.5]" \
    algorithm.questa.min_prefix_chars=10 \
    algorithm.questa.reward_scale=5.0 \
    algorithm.questa.reward_bias=0.0 \
    algorithm.questa.reward_clip=20.0 \
    algorithm.questa.success_lb=0.05 \
    algorithm.questa.success_ub=0.95 \
    data.train_batch_size=128 \
    data.max_prompt_length=4096 \
    data.max_response_length=24000 \
    data.seed=1 \
    trainer.seed=1 \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.ppo_epochs=1 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.clip_ratio=0.2 \
    actor_rollout_ref.actor.loss_remove_clip=False \
    actor_rollout_ref.actor.loss_remove_token_mean=False \
    actor_rollout_ref.actor.entropy_coeff=0.0 \
    actor_rollout_ref.actor.use_kl_loss=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    actor_rollout_ref.ref.use_ref=False \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.optim.weight_decay=0.05 \
    "actor_rollout_ref.actor.optim.betas=[0.9,0.95]" \
    actor_rollout_ref.actor.optim.warmup_style=constant \
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.001 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.optim.zero_lr_first_step=False \
    trainer.stop_one_step_early=False \
    trainer.save_freq=50 \
    trainer.test_freq=50 \
    trainer.total_epochs=100 \
    "$@"
