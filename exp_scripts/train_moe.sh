#!/usr/bin/env bash
# LUFFY on a mixture-of-experts model: exp_scripts/train.sh (OpenR1-Math-46k, GRPO groups of n=8 with one
# off-policy R1 trace per group, shaped off-policy loss p/(p+0.1), LUFFY's trainer switches) on Qwen3-30B-A3B-Base,
# 2 nodes x 8 GPUs (80 GB), the actor under FSDP2 alone, as the memory plan lays it out.
#
# What changes against train.sh, and why (`python -m luffy_pool.memory_plan exp_scripts/train_moe.sh --gpu-memory 80`
# prints every phase per GPU with the MoE lines; docs/memory.md "Memory plan" has the table):
# - the model: Qwen/Qwen3-30B-A3B-Base (qwen3_moe, 48 layers each of 128 experts with 8 routed per token, hidden
#   2048, 32 query / 4 kv heads, q/k norms; tests/data/model_configs/Qwen--Qwen3-30B-A3B-Base.json), 32768
#   positions, so train.sh's 1024 + 8192 tokens fit. Memory counts every expert: 30.53 B parameters; compute counts
#   the routed ones: 3.35 B active parameters per token (~6 x 3.35 G FLOPs per trained token);
# - 2 nodes: 30.53 B parameters x 16 bytes (fp32 master weights, fp32 gradients, two fp32 AdamW moments) = 489 GB of
#   training state, 30.5 GB per GPU over 16 GPUs; on 1 node the update alone needs ~85 GiB per GPU and no layout of
#   8 GPUs fits (the plan names none: tensor and pipeline parallelism divide the same state);
# - the actor: FSDP2 over all 16 ranks, tensor and pipeline parallel 1. The tensor-parallel plan covers dense
#   Qwen2/Qwen3/Llama only (verl/utils/tensor_parallel.py SUPPORTED), and at 2 nodes the plan needs neither;
# - AdamW moments offloaded to host memory outside the update (fsdp_config.optimizer_offload=True): 14.2 GiB per GPU
#   that the rollout would otherwise share with vLLM (85.9 GiB without, over the GPU);
# - vLLM: tensor parallel 2 as train.sh (bf16 weights 57 GiB, 28.4 GiB per GPU), 8 engines of 2 GPUs.
#
# Usage: [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_moe.sh [key=value ...]
# Env overrides as exp_scripts/train.sh; EXP_NAME defaults to LUFFY_MOE. Extra arguments are Hydra overrides appended
# last, so they win (e.g. --cfg job to print the composed config without training).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export EXP_NAME=${EXP_NAME:-LUFFY_MOE}
export MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-30B-A3B-Base}
exec bash "$HERE/train.sh" \
    trainer.nnodes=2 \
    trainer.n_gpus_per_node=8 \
    actor_rollout_ref.actor.tensor_model_parallel_size=1 \
    actor_rollout_ref.actor.pipeline_model_parallel_size=1 \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    "$@"
