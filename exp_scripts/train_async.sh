#!/usr/bin/env bash
# LUFFY's main run (exp_scripts/train.sh: Qwen2.5-Math-7B-16k-think, OpenR1-Math-46k, n=8 with one off-policy
# trace per group, shaped loss p/(p+0.1)) on split resources with one-step-off-policy generation, verl's
# one_step_off_policy layout: 1 node x 8 GPUs, 4 for the rollout engines and 4 for the FSDP actor.
#
# What changes against train.sh:
# - actor_rollout_ref.hybrid_engine=False: the vLLM engines run on their own 4 GPUs
#   (actor_rollout_ref.rollout.nnodes x n_gpus_per_node = 1 x 4), the actor on trainer.nnodes x n_gpus_per_node
#   = 1 x 4; after each update the actor's rank 0 broadcasts its weights to the engines in buckets over an NCCL
#   group of their own (verl/workers/sharding_manager/collective_sync.py);
# - trainer.rollout_pipeline=one_step_off: batch N+1 is generated while the actor trains on batch N, on the
#   weights before that update (rollout/staleness = 1; the old log-probs stay the actor's recomputation);
# - the engines' GPUs hold no actor shards or optimizer state, so vLLM may take 0.85 of their memory.
# LUFFY's train.sh batch (128 prompts x 8) splits as 32 prompts per engine and 32 rows per training rank.
#
# Usage: as exp_scripts/train.sh ([MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] ... bash exp_scripts/train_async.sh
# [key=value ...]); EXP_NAME defaults to LUFFY_ASYNC. Extra arguments are appended last, so they win.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export EXP_NAME=${EXP_NAME:-LUFFY_ASYNC}
exec bash "$HERE/train.sh" \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.rollout.nnodes=1 \
    actor_rollout_ref.rollout.n_gpus_per_node=4 \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=4 \
    trainer.rollout_pipeline=one_step_off \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85 \
    "$@"
