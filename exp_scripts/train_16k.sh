#!/usr/bin/env bash
# LUFFY at 16k context: exp_scripts/train.sh (Qwen2.5-Math-7B-16k-think, OpenR1-Math-46k, n=8 with one
# off-policy trace per group, shaped loss p/(p+0.1)) with prompt 1024 + response 15360 = 16384 tokens,
# the model's max_position_embeddings. 1 node x 8 GPUs (80 GB). See docs/memory.md "Long contexts" for the memory
# figures behind these settings.
#
# What changes against train.sh, as a user of 8 x 80 GB would set it:
# - data.max_response_length=15360 (rollout.response_length follows) and max_prefix_len=15360, so an
#   off-policy trace may fill the whole response budget;
# - Ulysses sequence parallel of 2 (actor, and ref/log-prob passes which follow it): each 16k row is split
#   over 2 GPUs for attention (heads all-to-all) and everything else, halving activation memory per GPU;
# - dynamic batch sizes by token budget: 16384 tokens per GPU for the update, i.e. 32768 per SP group
#   (two full-length rows, or many short ones), and 32768 per GPU for the no-grad log-prob passes;
# - the LM head scores only response tokens, 1024 at a time (model.logprob_chunk_size, the default):
#   a 16k micro-batch never builds [tokens, 151936] logits (~10 GB fp32 per 16k tokens);
# - vLLM: tensor parallel 2, max_num_batched_tokens 16384 so a full-length prompt+response fits a step,
#   gpu_memory_utilization 0.7 leaves room for the actor's shards while the engine sleeps.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_16k.sh [key=value ...]
# Env overrides as exp_scripts/train.sh; EXP_NAME defaults to LUFFY_16K. Extra arguments are Hydra
# overrides appended last, so they win (e.g. --cfg job prints the composed config without training).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export EXP_NAME=${EXP_NAME:-LUFFY_16K}
export MODEL_PATH=${MODEL_PATH:-Elliott/Qwen2.5-Math-7B-16k-think}
exec bash "$HERE/train.sh" \
    data.max_prompt_length=1024 \
    data.max_response_length=15360 \
    actor_rollout_ref.rollout.max_prefix_len=15360 \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.model.logprob_chunk_size=1024 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.max_num_batched_tokens=16384 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    "$@"
