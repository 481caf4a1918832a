#!/usr/bin/env bash
# LUFFY's main run (docs/METHOD.md §2.1): Qwen2.5-Math-7B-16k-think on OpenR1-Math-46k, GRPO groups of
# n=8 with 1 full off-policy R1 trace per group (prefix ratio 1.0), shaped off-policy loss p/(p+0.1),
# no on-policy clip, sum/8192 loss, no std in the advantage, reward v3. 1 node x 8 GPUs (80 GB).
#
# Usage: [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          [MODEL_OVERRIDES=Qwen3-8B|Llama-3.1-8B|path] bash exp_scripts/train.sh [key=value ...]
# Extra arguments are appended last, so they win (e.g. trainer.total_training_steps=500, or --cfg job to
# print the composed config without training). DATA_DIR must hold openr1.parquet and valid.parquet
# (data/prepare_train.py). The override list below is LUFFY's train.sh verbatim, in its order.
# Differences from LUFFY's script: no conda activation (use the env PYTHON points to), `ray stop` only
# with RAY_STOP=1 (it would kill a cluster this run may be joining), VLLM_ATTENTION_BACKEND is left to
# the environment (LUFFY forced XFORMERS for vLLM 0.6; current vLLM picks flash-attn itself), and the
# logger list is quoted so the shell can never glob it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# Per-model overrides (exp_scripts/overrides/README.md): MODEL_OVERRIDES=Qwen3-8B (a file of exp_scripts/overrides/)
# or a path; one key=value per line, # comments. They go after this script's switches, before the extra arguments.
# Read before the cd below, so a path relative to the caller's directory works.
MODEL_OVERRIDE_ARGS=()
if [ -n "${MODEL_OVERRIDES:-}" ]; then
  overrides_file=$MODEL_OVERRIDES
  [ -f "$overrides_file" ] || overrides_file=$ROOT/exp_scripts/overrides/$MODEL_OVERRIDES.txt
  if [ ! -f "$overrides_file" ]; then
    echo "train.sh: MODEL_OVERRIDES=$MODEL_OVERRIDES: no such file, nor exp_scripts/overrides/$MODEL_OVERRIDES.txt" >&2
    exit 2
  fi
  while read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) continue ;; esac
    MODEL_OVERRIDE_ARGS+=("$line")
  done < "$overrides_file"
fi
cd "$ROOT"

export MODEL_PATH=${MODEL_PATH:-Elliott/Qwen2.5-Math-7B-16k-think}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-LUFFY_TEST}
export WANDB_PROJECT=${WANDB_PROJECT:-luffy-math-test}
PYTHON=${PYTHON:-python3}

if [ "${RAY_STOP:-0}" = "1" ]; then
  ray stop
fi

# LUFFY's trainer, beyond its override list: its verl scheduler runs the first update at lr 0
# (warmup factor step/max(1, warmup) with 0 warmup steps) and its loop stops when the step counter reaches
# the total, so it makes total-1 updates. These switches reproduce both (pass =False to train every step at
# full lr); they go after LUFFY's list and before the extra arguments, which still win.
LUFFY_TRAINER=(actor_rollout_ref.actor.optim.zero_lr_first_step=True trainer.stop_one_step_early=True)

# Memory (docs/DESIGN.md §2 item 8): rollout.gpu_memory_utilization=0.73 instead of LUFFY's 0.80. vLLM 0.32 reads it
# as a fraction of the GPU's TOTAL memory (vllm/v1/worker/utils.py request_memory; LUFFY's vLLM 0.6 meant a
# fraction of what was left), the actor's fp32 shards and AdamW state stay on the GPU during rollout, and vLLM's own
# TP communicator (built before its memory snapshot) comes on top of that fraction: at 0.80 the memory plan gives
# ~80.4 of 79.2 GiB per rank on an 80 GB GPU (does not fit), at 0.73 ~74.9 GiB (5.5 % headroom).
# trainer.memory_plan=error: a run whose plan does not fit the GPU stops before the workers load the model, naming
# the phase and the key that brings it under (=warn starts anyway).
# `python -m luffy_pool.memory_plan exp_scripts/train.sh --gpu-memory 80`; docs/memory.md "Memory plan".
MEMORY_PLAN=(actor_rollout_ref.rollout.gpu_memory_utilization=0.73 trainer.memory_plan=error)

# Rollout speed (docs/ROLLOUT_GRAPHS.md): CUDA graphs on (LUFFY ran vLLM 0.6 eager because its
# sleep mode needed it; vLLM 0.32 keeps the graphs valid across sleep/wake and the in-place weight reload), the
# engine slept at level 2 between rollouts (weights dropped, overwritten by the next push), and prefix caching so
# the n=8 samples of a prompt share its KV blocks. Capture sizes: vLLM's default list, up to
# min(2 x max_num_seqs, 512, max_num_batched_tokens) = 512 tokens here, covers every decode batch this script makes
# (128 x 8 rows / 4 engines = 256 live sequences per engine). Pass enforce_eager=True for LUFFY's eager engine.
ROLLOUT_SPEED=(actor_rollout_ref.rollout.enforce_eager=False actor_rollout_ref.rollout.free_cache_engine=True
               actor_rollout_ref.rollout.sleep_level=2 actor_rollout_ref.rollout.enable_prefix_caching=True)

# Recovery (docs/reliability.md "Preemption, checkpoints, failures"): a worker process or node lost mid-run
# (actor or node dead, OOM-kill, collective timeout) restarts the workers and resumes from the newest checkpoint,
# up to 3 times for the same cause at the same step; a restart waits up to trainer.restart_wait_s for the cluster
# to host the world again.
RECOVERY=(trainer.max_restarts=3)

# exec: the trainer takes over this script's process, so a SIGTERM sent to it (a container whose PID 1 is this
# bash, Slurm, kill) reaches the trainer, which saves its step and exits 143.
set -x
exec "$PYTHON" -m verl.mix_src.main_mix_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$DATA_DIR/openr1.parquet \
    data.val_files=$DATA_DIR/valid.parquet \
    data.train_batch_size=128 \
    data.val_batch_size=512 \
    data.max_prompt_length=1024 \
    data.max_response_length=8192 \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size=64 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.kl_loss_coef=0.00 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.grad_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.val_temperature=0.6 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_val=1 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.rollout.max_prefix_len=8192 \
    algorithm.kl_ctrl.kl_coef=0.000 \
    actor_rollout_ref.actor.entropy_coeff=0.001 \
    trainer.critic_warmup=0 \
    "trainer.logger=['console','wandb']" \
    trainer.project_name="$WANDB_PROJECT" \
    trainer.experiment_name="$EXP_NAME" \
    +trainer.val_before_train=False \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=50 \
    trainer.test_freq=10 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.use_sft_prefix_reward=False \
    actor_rollout_ref.rollout.prefix_share_across_samples=False \
    actor_rollout_ref.rollout.prefix_strategy=random \
    actor_rollout_ref.rollout.n_prefix=1 \
    actor_rollout_ref.rollout.min_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 \
    actor_rollout_ref.rollout.prefix_reward_weight_alpha=1.0 \
    actor_rollout_ref.ref.use_ref=False \
    actor_rollout_ref.actor.use_off_policy_loss=True \
    actor_rollout_ref.actor.off_policy_normalize=False \
    actor_rollout_ref.actor.off_policy_reshape="p_div_p_0.1" \
    actor_rollout_ref.actor.off_policy_loss_impl=token \
    algorithm.grpo_use_std=False \
    actor_rollout_ref.actor.loss_remove_token_mean=True \
    actor_rollout_ref.actor.loss_remove_clip=True \
    data.reward_impl_version=3 \
    trainer.max_optim_to_keep=2 \
    data.shuffle=True \
    trainer.default_hdfs_dir=null \
    trainer.total_epochs=30 "${LUFFY_TRAINER[@]}" "${MEMORY_PLAN[@]}" "${ROLLOUT_SPEED[@]}" "${RECOVERY[@]}" \
    ${MODEL_OVERRIDE_ARGS[@]+"${MODEL_OVERRIDE_ARGS[@]}"} "$@"
