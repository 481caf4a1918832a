#!/usr/bin/env bash
# LUFFY's SFT baseline (docs/METHOD.md §2.3), on this project's FSDP2 trainer instead of OpenRLHF:
# Qwen2.5-Math-7B-16k-think fine-tuned on the R1 traces of OpenR1-Math-46k, max length 16384, global batch
# 64, micro-batch 1, lr 5e-5 with 10% warm-up, 3 epochs, gradient checkpointing, bf16 compute with fp32
# master weights, flash-attn when installed. 1 node x 8 GPUs by default.
# GPU: 1 node x 8 GPUs of 80 GB (H100 / A100 80 GB); luffy_pool.memory_plan covers the RL trainers, not this one.
#
# Usage: [MODEL_PATH=..] [TRAIN_FILES=..] [VAL_FILES=..] [NPROC_PER_NODE=..] [EXP_NAME=..] [PYTHON=..] \
#          bash exp_scripts/train_sft.sh [key=value ...]
# Env overrides (defaults in brackets): MODEL_PATH [Elliott/Qwen2.5-Math-7B-16k-think], DATA_DIR [data/],
# TRAIN_FILES [$DATA_DIR/openr1.parquet: LUFFY's training parquet, or data/prepare_sft.py's output],
# VAL_FILES [null], MAX_LENGTH [16384], TRAIN_BATCH_SIZE [64], MICRO_BATCH_SIZE [1], LR [5e-5],
# WARMUP_RATIO [0.1], EPOCHS [3], NPROC_PER_NODE [8], EXP_NAME [SFT], WANDB_PROJECT [luffy-math-test],
# LOGGER [['console','wandb']], OUT_DIR [checkpoints/$WANDB_PROJECT/$EXP_NAME], SAVE_FREQ [-1], PYTHON [python3].
# Extra arguments are Hydra overrides appended last, so they win (e.g. trainer.total_training_steps=10, or
# --cfg job to print the composed config). The final HF folder is $OUT_DIR/final; the "SFT then RL"
# baseline starts from it: MODEL_PATH=$OUT_DIR/final bash exp_scripts/train_sft_rl.sh.
# Differences from LUFFY's OpenRLHF run: FSDP2 instead of ZeRO-2 with CPU Adam, no sample packing, the loss
# is one token mean over the global batch (OpenRLHF averaged per-micro-batch means), and over-long rows are
# cut at the end (data.truncation=right, as OpenRLHF's max_len does).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

export MODEL_PATH=${MODEL_PATH:-Elliott/Qwen2.5-Math-7B-16k-think}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-SFT}
export WANDB_PROJECT=${WANDB_PROJECT:-luffy-math-test}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/openr1.parquet}
VAL_FILES=${VAL_FILES:-null}
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
OUT_DIR=${OUT_DIR:-checkpoints/$WANDB_PROJECT/$EXP_NAME}
PYTHON=${PYTHON:-python3}

# exec: the launcher (torchrun, verl/trainer/sft/launch.py) takes over this script's process, so a SIGTERM or
# SIGINT sent to it (a container whose PID 1 is this bash, Slurm, kill) reaches torchrun, which forwards it to
# every rank: the step in progress finishes, its HF folder is written to $OUT_DIR/global_step_<N>/huggingface,
# and the script exits 143 (130 for SIGINT). torchrun waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT [1800] s for that.
set -x
exec "$PYTHON" -m verl.trainer.sft.launch --standalone --nproc_per_node "$NPROC_PER_NODE" \
    -m verl.trainer.fsdp_sft_trainer \
    data.train_files="$TRAIN_FILES" \
    data.val_files="$VAL_FILES" \
    data.prompt_key=prompt \
    data.response_key=target \
    data.max_length="${MAX_LENGTH:-16384}" \
    data.truncation=right \
    data.train_batch_size="${TRAIN_BATCH_SIZE:-64}" \
    data.micro_batch_size_per_gpu="${MICRO_BATCH_SIZE:-1}" \
    data.strip_think_prefix=True \
    model.path="$MODEL_PATH" \
    model.enable_gradient_checkpointing=True \
    model.attn_implementation=auto \
    model.fsdp_config.param_dtype=bf16 \
    optim.lr="${LR:-5e-5}" \
    optim.warmup_steps_ratio="${WARMUP_RATIO:-0.1}" \
    optim.warmup_style=cosine \
    trainer.total_epochs="${EPOCHS:-3}" \
    trainer.device=cuda \
    trainer.default_local_dir="$OUT_DIR" \
    trainer.save_freq="${SAVE_FREQ:--1}" \
    "trainer.logger=${LOGGER:-['console','wandb']}" \
    trainer.project_name="$WANDB_PROJECT" \
    trainer.experiment_name="$EXP_NAME" \
    "$@"
