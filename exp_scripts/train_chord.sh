#!/usr/bin/env bash
# CHORD (arXiv 2508.11408, algorithm.method=chord; luffy_pool/methods/chord.py): (1 - mu)·GRPO + mu·SFT with
# per-token phi(p) = p(1-p) weights on the expert rows. Settings of Trinity-RFT examples/mix_chord/mix_chord.yaml
# (commit 04143305), CHORD-phi variant (its comments, lines 12-16: W=0, D=0, mu=0.1 constant, phi on; CHORD-mu:
# pass algorithm.chord.mu_decay_steps=200 mu_peak=0.9 mu_valley=0.05 enable_phi_function=False): 40 prompts x 8
# rollouts per step in one mini-batch (ppo_mini_batch_size=40 prompts = their 320 experiences, micro 4 rows per
# GPU, token-packed), PPO clip 0.2 with dual clip 3, group std on, token-mean losses, no KL, rollout temperature
# 1.0, max response 10240 in an 11264-token window (prompt 1024), 25 epochs, a checkpoint every 50 steps.
# Differences, each for a reason (tests/exp_scripts/test_authors_settings.py holds the table with their lines):
# - the expert rows are the groups' demonstrations (1 of n=8 rows, i.e. 12.5 %); Trinity draws 20 % of each batch
#   from a separate SFT set (expert_data_ratio, line 10).
# - lr 1e-6 and the reward are train.sh's (LUFFY's math-verify v3), as the other methods' scripts: the example's
#   trainer settings are in the file its line 83 names (examples/mix_chord/train_chord.yaml), which the stored copy
#   of the repository does not hold, and its reward is Trinity's math_boxed_workflow (line 51); neither is compared.
# - validation: the example has no eval taskset (line 50: eval_tasksets: [], "add your own"); here train.sh's
#   valid.parquet, every 10 steps as their eval_interval (line 67), one sample per prompt at T=0.6.
# - run on Qwen2.5-Math-7B-16k-think as the other scripts (Trinity's math run: Qwen2.5-7B-Instruct, line 26).
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_chord.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default CHORD); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-CHORD}
# algorithm.method=chord sets policy_loss=chord, adv_estimator=grpo_split and turns LUFFY's use_off_policy_loss off.
# the method's preset (luffy_pool/config/method/chord.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=chord \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    algorithm.chord.mu_warmup_steps=0 \
    algorithm.chord.mu_decay_steps=0 \
    algorithm.chord.mu_peak=0.1 \
    algorithm.chord.mu_valley=0.1 \
    algorithm.chord.enable_phi_function=True \
    data.train_batch_size=40 \
    data.max_response_length=10240 \
    actor_rollout_ref.rollout.max_prefix_len=10240 \
    actor_rollout_ref.actor.ppo_mini_batch_size=40 \
    actor_rollout_ref.actor.ppo_micro_batch_size=null \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.clip_ratio=0.2 \
    actor_rollout_ref.actor.off_policy_reshape=no_reshape \
    actor_rollout_ref.actor.loss_remove_clip=False \
    actor_rollout_ref.actor.loss_remove_token_mean=False \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.rollout.min_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 \
    algorithm.grpo_use_std=True \
    trainer.total_epochs=25 \
    "$@"
