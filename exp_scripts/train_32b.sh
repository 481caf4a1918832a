#!/usr/bin/env bash
# LUFFY on a 32B dense model: exp_scripts/train.sh (OpenR1-Math-46k, GRPO groups of n=8 with one off-policy R1
# trace per group, shaped off-policy loss p/(p+0.1), LUFFY's trainer switches) on Qwen2.5-32B, 2 nodes x 8 GPUs
# (80 GB), the actor split by tensor and pipeline parallelism as the memory plan lays it out.
#
# What changes against train.sh, and why (`python -m luffy_pool.memory_plan exp_scripts/train_32b.sh --gpu-memory 80`
# prints every phase per GPU with the TP / PP lines; docs/memory.md "Memory plan" has the table):
# - the model: Qwen/Qwen2.5-32B (qwen2, 64 layers, hidden 5120, 40 query / 8 kv heads, 152064 vocabulary, untied;
#   32.76 B parameters; tests/data/model_configs/config_only/Qwen--Qwen2.5-32B.json), 131072 positions, so train.sh's
#   1024 + 8192 tokens fit;
# - 2 nodes: 32.76 B parameters x 16 bytes (fp32 master weights, fp32 gradients, two fp32 AdamW moments) = 524 GB of
#   training state, 32.8 GB per GPU over 16 GPUs whatever the layout (TP / PP / FSDP each divide it);
# - actor tensor parallel 4 (verl/utils/tensor_parallel.py): a TP group of 4 consecutive ranks (one node's NVLink)
#   splits every decoder layer (10 of 40 query heads, 2 of 8 kv heads, 6912 of 27648 MLP columns, 38016 of 152064
#   vocabulary rows per rank), so FSDP gathers a quarter of a layer and each rank holds a quarter of the MLP
#   activations and of the LM head's chunks; FSDP2 shards the rest over dp = 16 / 4 = 4 ranks. The ranks of a TP
#   group train on the same rows: batch sizes divide by dp;
# - pipeline parallel: ACTOR_PP (default 1; verl/utils/pipeline_parallel.py). The plan counts PP 2 (32 layers a
#   stage, 1F1B keeping up to 2 micro-batches in flight on the first stage: the same activations per rank, one more
#   NCCL communicator) and finds it fits too (5.3 % headroom, the rollout phase the peak), but it saves no memory
#   here and adds pipeline bubbles, so the default keeps dp 4; ACTOR_PP=2 runs tp 4 x pp 2 x dp 2 (the rehearsal
#   runs this script as tp 2 x pp 2 x dp 2 on 8 CPU ranks, tests/exp_scripts/test_rehearse.py);
# - the update's token budget 16384 per GPU (train.sh: 32768): at 32768 the checkpointed layer inputs alone are
#   64 layers x 32768 tokens x 5120 x 2 bytes = 20 GiB and no (tp, pp) layout of these 16 GPUs fits (the plan names
#   none); a full 9216-token row still fits one micro-batch;
# - AdamW moments offloaded to host memory outside the update (fsdp_config.optimizer_offload=True): 16.4 GiB per GPU
#   that the rollout would otherwise share with vLLM;
# - vLLM: tensor parallel 4 (bf16 weights 61 GiB, 15.3 GiB per GPU; 4 engines of 4 GPUs, 256 rollout rows each)
#   and gpu_memory_utilization 0.7 of the GPU's total memory (the actor's fp32 shards, CUDA context and NCCL buffers
#   share the GPU with the engine while it generates).
#
# Usage: [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] [ACTOR_PP=1|2] \
#          bash exp_scripts/train_32b.sh [key=value ...]
# Env overrides as exp_scripts/train.sh; EXP_NAME defaults to LUFFY_32B. Extra arguments are Hydra overrides appended
# last, so they win (e.g. trainer.nnodes=4, or --cfg job to print the composed config without training).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export EXP_NAME=${EXP_NAME:-LUFFY_32B}
export MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-32B}
ACTOR_PP=${ACTOR_PP:-1}
exec bash "$HERE/train.sh" \
    trainer.nnodes=2 \
    trainer.n_gpus_per_node=8 \
    actor_rollout_ref.actor.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.pipeline_model_parallel_size="$ACTOR_PP" \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    "$@"
