#!/usr/bin/env bash
# SDFT (arXiv 2601.19897, algorithm.method=sdft; luffy_pool/methods/sdft.py): self-distillation fine-tuning from
# demonstrations. The demonstration is not trained on: the policy's fresh rollouts are distilled toward the frozen
# initial model's log-probs of their sampled tokens under the teacher prompt "{prompt}\n\n{demonstration}" (held as
# the worker's reference model; IS-clipped at 2). The reference followed is TRL 1.16.0 (trl/experimental/sdft,
# SDFTConfig's defaults: teacher base, is_clip 2, n=8, temperature 1, one iteration); the SDFT authors' code was not
# located, so this is LUFFY's train.sh (its data: the demonstrations are LUFFY's targets) with TRL's settings on top.
# Differences, each for a reason:
# - distillation_mode=sampled_token (TRL's default: topk_logits, k=100, alpha 0.5): the reference pass returns the
#   sampled token's log-prob, not logits; topk_logits and full_logits are refused at pre-flight.
# - TRL's library defaults (max prompt 512 / completion 256 tokens, its batch sizes) are not a training recipe: the
#   lengths, batch 128, lr 1e-6 and epochs are train.sh's (LUFFY's math setup).
# - ppo_mini_batch_size=128 (train.sh: 64): TRL makes one optimizer step per generation batch.
# - entropy_coeff=0 (train.sh: 0.001): TRL's SDFT loss has no entropy bonus.
# - The trainer's reference pass over the student rows (KL-in-reward, coefficient 0 here) still runs.
# TRL's values, key by key with file and line: tests/exp_scripts/test_authors_settings.py.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_sdft.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME and WANDB_PROJECT default SDFT); extra arguments are Hydra
# overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-SDFT}
export WANDB_PROJECT=${WANDB_PROJECT:-SDFT}
# algorithm.method=sdft sets policy_loss=sdft and turns LUFFY's off-policy loss and demonstration slot off; the
# method's preset (luffy_pool/config/method/sdft.yaml) is stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=sdft \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.actor.use_sft_multitask_loss=False \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.ref.use_ref=True \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=0 \
    actor_rollout_ref.rollout.temperature=1.0 \
    algorithm.adv_estimator=grpo \
    algorithm.kl_ctrl.kl_coef=0.0 \
    algorithm.sdft.distillation_mode=sampled_token \
    algorithm.sdft.is_clip=2.0 \
    algorithm.sdft.teacher=base \
    algorithm.sdft.ema_rate=0.05 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.entropy_coeff=0.0 \
    "$@"
