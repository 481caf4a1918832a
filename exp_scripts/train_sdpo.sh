#!/usr/bin/env bash
# SDPO (arXiv 2601.20802, algorithm.method=sdpo; luffy_pool/methods/sdpo.py): self-distillation policy optimisation.
# Each rollout is distilled toward the policy's own log-probs of its sampled tokens under a teacher prompt holding a
# successful sibling rollout of its group (reverse KL on the sampled token, IS-clipped at 2); the teacher is an EMA
# (rate 0.05) of the policy, held as the worker's reference model. The reference followed is TRL 1.16.0
# (trl/experimental/sdpo, SDPOConfig's defaults: distillation_weight 1, success threshold 1.0, sampled_token,
# is_clip 2, teacher ema 0.05, loss_type dapo, beta 0, n=8, temperature 1); the SDPO authors' own verl fork
# (lasgroup/SDPO) and its scripts were not read, so this is LUFFY's train.sh with TRL's SDPO settings on top.
# Differences, each for a reason:
# - TRL's library defaults (max prompt 512 / completion 256 tokens, its batch sizes) are not a training recipe: the
#   lengths, batch 128, lr 1e-6 and epochs are train.sh's (LUFFY's math setup).
# - ppo_mini_batch_size=128 (train.sh: 64): TRL makes one optimizer step per generation batch (steps_per_generation
#   = gradient accumulation), and its EMA teacher moves once per optimizer step; here once per training step.
# - entropy_coeff=0 (train.sh: 0.001): TRL's SDPO loss has no entropy bonus.
# - The trainer's reference pass over the student rows (KL-in-reward, coefficient 0 here) still runs.
# grpo_use_std=True (train.sh: False) is TRL's scale_rewards=group; the advantage is read only when
# distillation_weight < 1. TRL's values, key by key with file and line: tests/exp_scripts/test_authors_settings.py.
#
# Usage: [ROOT=..] [MODEL_PATH=..] [DATA_DIR=..] [EXP_NAME=..] [WANDB_PROJECT=..] [RAY_STOP=1] [PYTHON=..] \
#          bash exp_scripts/train_sdpo.sh [key=value ...]
# Env variables as exp_scripts/train.sh (EXP_NAME and WANDB_PROJECT default SDPO); extra arguments are Hydra
# overrides, appended last.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ROOT=${ROOT:-$(dirname "$HERE")}
export DATA_DIR=${DATA_DIR:-$ROOT/data}
export EXP_NAME=${EXP_NAME:-SDPO}
export WANDB_PROJECT=${WANDB_PROJECT:-SDPO}
# algorithm.method=sdpo sets policy_loss=sdpo and turns LUFFY's off-policy loss and demonstration slot off; the
# method's preset (luffy_pool/config/method/sdpo.yaml) is stated here, since a contradicting value is refused.
exec bash "$HERE/train.sh" \
    algorithm.method=sdpo \
    actor_rollout_ref.actor.use_off_policy_loss=False \
    actor_rollout_ref.actor.use_sft_multitask_loss=False \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.ref.use_ref=True \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_prefix=0 \
    actor_rollout_ref.rollout.temperature=1.0 \
    algorithm.adv_estimator=grpo \
    algorithm.grpo_use_std=True \
    algorithm.kl_ctrl.kl_coef=0.0 \
    algorithm.sdpo.distillation_weight=1.0 \
    algorithm.sdpo.success_threshold=1.0 \
    algorithm.sdpo.distillation_mode=sampled_token \
    algorithm.sdpo.is_clip=2.0 \
    algorithm.sdpo.teacher=ema \
    algorithm.sdpo.ema_rate=0.05 \
    algorithm.sdpo.loss_type=dapo \
    algorithm.sdpo.max_reprompt_len=10240 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.entropy_coeff=0.0 \
    "$@"
