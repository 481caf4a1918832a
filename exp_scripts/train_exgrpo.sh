#!/usr/bin/env bash
# ExGRPO (arXiv 2510.02245, algorithm.method=exgrpo; luffy_pool/methods/exgrpo.py): on-policy GRPO until the
# batch's share of correct responses passes 0.35, then half of each batch's prompts are questions replayed from
# the run's own successes (bucket-sampled by success count, N(k; 4, 1)), each with its lowest-entropy stored
# trajectory as one full-trace slot beside 7 fresh rollouts, weighted by f(pi_theta / pi_recorded), f(w) = w/(w+0.1).
# Mirrors ElliottYan/LUFFY ExGRPO/exp_scripts/run_exgrpo.sh for Qwen2.5-Math-7B (commit 01f4ae06), which is
# LUFFY's train.sh list plus the experience keys and 701 steps: lr 1e-6, batch 128, mini 64, dynamic bsz,
# response 8192, n=8, entropy 0.001, no KL, unclipped on-policy loss in the mixed phase (PPO clip in warm-up),
# sum/8192 aggregation, Dr.GRPO advantages over the 8 rows, reward v3, save every 50 steps.
# The dataset's target column is ignored (ExGRPO uses no external traces); rollout.n_prefix=1 of train.sh becomes 0,
# the method's preset (slots get a trace only when a question is replayed).
# Validation as theirs (train.sh's): one sample per prompt at T=0.6 every 10 steps, none before training.
# tests/exp_scripts/test_authors_settings.py holds the table of their values with their lines.
# Their skip_grad_bound=500 (run_exgrpo.sh line 99: their actor skips the optimizer step when the pre-clip grad norm
# exceeds it, mix_actor.py lines 253-256) is actor.skip_grad_bound=500 here; grad clip stays 1.0.
# Not reproduced: their vllm_exp rollout is our one rollout with per-slot traces; their pool has no
# cap, ours keeps each question's newest 8 trajectories (algorithm.exgrpo.max_trajectories_per_question=0 for
# theirs: ~2.6 GiB of driver RAM by step 701 against ~1.3 GiB, exp_scripts/bench_exgrpo_pool.py).
# Their MODEL_PATH is left for the user to set (the backbone); for Qwen2.5-Math-7B they use
# Elliott/Qwen2.5-Math-7B-16k-think (ElliottYan/LUFFY @ 01f4ae0, ExGRPO/README.md line 123): its 16k positions
# hold the 1024 + 8192 tokens, where Qwen/Qwen2.5-Math-7B's 4,096 do not.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_exgrpo.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME default ExGRPO, WANDB_PROJECT exgrpo); extra arguments are Hydra
# overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export MODEL_PATH=${MODEL_PATH:-Elliott/Qwen2.5-Math-7B-16k-think}
export EXP_NAME=${EXP_NAME:-ExGRPO}
export WANDB_PROJECT=${WANDB_PROJECT:-exgrpo}
# algorithm.method=exgrpo sets policy_loss=exgrpo and turns LUFFY's use_off_policy_loss off.
# the method's preset (luffy_pool/config/method/exgrpo.yaml) turns LUFFY's switches off; stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=exgrpo \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.actor.skip_grad_bound=500 \
    actor_rollout_ref.rollout.n_prefix=0 \
    algorithm.exgrpo.traj_metric=ent \
    algorithm.exgrpo.traj_select=argmin \
    algorithm.exgrpo.sample_range=all \
    algorithm.exgrpo.bucket_weighting=normal \
    algorithm.exgrpo.experience_ratio=0.5 \
    algorithm.exgrpo.start_solved_ratio=0.35 \
    algorithm.exgrpo.is_correct=True \
    algorithm.exgrpo.lbound=0 \
    algorithm.exgrpo.rbound=7 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.actor.loss_remove_clip=True \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    algorithm.grpo_use_std=False \
    trainer.total_training_steps=701 \
    "$@"
