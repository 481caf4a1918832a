#!/usr/bin/env bash
# ReLIFT (arXiv 2506.07527, algorithm.method=relift; luffy_pool/methods/relift.py): on-policy GRPO, plus an
# interleaved SFT stage with its own AdamW on the demonstrations of the questions whose 8 rollouts all fail,
# once 128 of them are buffered. Mirrors TheRoadQaQ/ReLIFT examples/math-7b/train.sh for Qwen2.5-Math-7B
# (commit eb95454f): RL as train.sh (lr 1e-6, batch 128, mini 64, dynamic bsz, response 8192, n=8, entropy
# 0.001, no KL, unclipped on-policy loss, sum/8192, Dr.GRPO advantages, reward v3, validation every 10 steps with
# one sample per prompt at T=0.6, none before training) with RL
# grad clip 0.7 and 3 epochs; SFT: sft_data_size 128, one step of 128 rows in micro-batches of 4, lr 1e-6, SFT
# grad clip 1.0, entropy bonus 0.001, its optimizer state offloaded to host between stages like the RL one's
# (their sft_optimizer_offload=True, optimizer_offload=True). Same verl lineage as LUFFY's, so train.sh's
# zero_lr_first_step / stop_one_step_early hold for it too. Not reproduced: their grad_offload=True (FSDP2
# keeps gradients with the parameters) and save_freq=-1 (train.sh's 50 kept: the buffer and the SFT optimizer
# are checkpointed here, theirs are not). tests/exp_scripts/test_authors_settings.py holds the table with their lines.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_relift.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default ReLIFT); extra arguments are Hydra overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-ReLIFT}
# algorithm.method=relift sets policy_loss=vanilla, rollout.n_prefix=0 (every slot on-policy) and turns LUFFY's
# use_off_policy_loss off; the demonstrations (data.target_key) feed only the SFT stage.
# the method's preset (luffy_pool/config/method/relift.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=relift \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.rollout.n_prefix=0 \
    algorithm.relift.sft_data_size=128 \
    algorithm.relift.sft_mini_batch_size=128 \
    algorithm.relift.sft_micro_batch_size=4 \
    algorithm.relift.sft_epochs=1 \
    algorithm.relift.sft_lr=1e-6 \
    algorithm.relift.sft_grad_clip=1.0 \
    algorithm.relift.sft_entropy_coeff=0.001 \
    actor_rollout_ref.actor.grad_clip=0.7 \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
    trainer.total_epochs=3 \
    "$@"
