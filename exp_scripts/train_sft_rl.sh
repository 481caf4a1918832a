#!/usr/bin/env bash
# LUFFY's "SFT then RL" baseline, RL part (docs/METHOD.md §2.3): on-policy GRPO exactly as
# exp_scripts/train_on_policy.sh (prefix ratio 0: every slot sampled by the policy; PPO clip eps=0.2
# active; no off-policy shaping), started from the SFT model that exp_scripts/train_sft.sh writes, on
# held-out prompts the SFT stage did not see (openr1.complement.parquet: LUFFY's
# Elliott/Openr1-Math-48k-Complement through data/prepare_train.py, or the --rl_output of
# data/prepare_train_sft_rl.py, which splits one table into disjoint SFT and RL parts).
# EXP_NAME SFT_RL. 1 node x 8 GPUs (80 GB).
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [TRAIN_FILE=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] \
#          [PYTHON=..] bash exp_scripts/train_sft_rl.sh [key=value ...]
# Env overrides (defaults in brackets): ROOT [this repository], DATA_DIR [$ROOT/data: must hold valid.parquet],
# TRAIN_FILE [$DATA_DIR/openr1.complement.parquet], MODEL_PATH [$ROOT/checkpoints/luffy-math-test/SFT/final:
# the final HF folder of `bash exp_scripts/train_sft.sh` with its defaults; LUFFY used the hub model
# Elliott/Qwen2.5-Math-7B-SFT], EXP_NAME [SFT_RL], WANDB_PROJECT, RAY_STOP, PYTHON: as exp_scripts/train.sh.
# Extra arguments are Hydra overrides appended last, so they win (e.g. trainer.total_training_steps=500,
# or --cfg job to print the composed config without training).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-SFT_RL}
export MODEL_PATH=${MODEL_PATH:-$ROOT/checkpoints/luffy-math-test/SFT/final}
TRAIN_FILE=${TRAIN_FILE:-$DATA_DIR/openr1.complement.parquet}

# A local SFT folder that is not there means the SFT stage has not run (a hub id has no leading / or .).
case "$MODEL_PATH" in
  /*|./*|../*)
    if [ ! -f "$MODEL_PATH/config.json" ]; then
      echo "train_sft_rl.sh: MODEL_PATH=$MODEL_PATH has no config.json; run exp_scripts/train_sft.sh first" \
           "or point MODEL_PATH at an SFT model folder or hub id" >&2
      exit 2
    fi
    ;;
esac

exec bash "$HERE/train_on_policy.sh" \
    data.train_files="$TRAIN_FILE" \
    "$@"
