"""The run config as typed, read-only sections: the one declaration of every key of mix_ppo_trainer.yaml.

``ConfigSections`` mirrors the YAML's groups; each field is one key (verl/utils/config_section.key), from which
luffy_pool/config/check.py derives every check. The verl worker's keys are declared in verl/workers/config_sections.py,
LUFFY's keys of those groups here, in subclasses. Build once where the run starts (``ConfigSections.from_config``)
and pass it down; readers use attributes, so a misspelt name raises instead of taking a restated default.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from verl.utils.config_section import (
    AT_LEAST_ONE,
    DEFAULT_ONLY,
    NON_NEGATIVE,
    OFF_OR_POSITIVE,
    POSITIVE,
    UNIT,
    Bound,
    build_section,
    key,
    nested,
    not_shipped,
    values_of,
    view,
)
from verl.workers.config_sections import (
    ActorSection,
    PolicyLossSection,
    RolloutSection,
    WorkerSections,
    kl_estimators,
    policy_losses,
)

_A, _R, _REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
# No model has this many positions; the model-specific limit is checked at pre-flight (check_model_context).
MAX_RESPONSE_LENGTH = 1 << 20


_INERT = "the key is inert in LUFFY (read by no code path)"
_ACC_REBATCH = "it only acts with trainer.acc_rebatch=True, which is not shipped"
_RM_ONLY = "it is only used by model-based reward workers, which are not shipped"


def _inert(why: str = _INERT):
    """A key LUFFY parses but nothing acts on (or whose feature is not shipped): its YAML default only."""
    return key(luffy=DEFAULT_ONLY, why=why)


_MIX = "luffy_pool.algorithm.mix_core_alg"  # registers grpo_split, luffy_token, sft_multitask
_adv_estimators = values_of("verl.trainer.ppo.core_algos", "ADV_ESTIMATOR_REGISTRY", _MIX)


@dataclass(frozen=True)
class TrainerSection:
    """``trainer.*`` (meanings: the comments next to each key in mix_ppo_trainer.yaml)."""

    device: str = key(choices=("auto", "cpu", "cuda"))
    bundle_resources: str = key(choices=("auto", "gpu", "cpu"))
    cpu_bind: str = key(choices=values_of("verl.utils.cpu_bind", "MODES"))
    memory_plan: str = key(choices=values_of("luffy_pool.memory_plan", "MODES"))
    rollout_pipeline: str = key(choices=("sync", "one_step_off"))  # needs hybrid_engine=False (ConfigSections)
    total_epochs: int = key(bounds=AT_LEAST_ONE)
    total_training_steps: Optional[int] = key(bounds=AT_LEAST_ONE)
    stop_one_step_early: bool = key()
    project_name: str = key()
    experiment_name: str = key()
    logger: Union[list, str] = key(choices=values_of("verl.utils.tracking", "SUPPORTED_BACKENDS"))
    nnodes: int = key(bounds=AT_LEAST_ONE)
    n_gpus_per_node: int = key(bounds=AT_LEAST_ONE)
    save_freq: int = key(bounds=OFF_OR_POSITIVE)
    test_freq: int = key(bounds=OFF_OR_POSITIVE)
    critic_warmup: int = key(bounds=NON_NEGATIVE)
    default_hdfs_dir: Optional[str] = key()
    default_local_dir: str = key()
    resume_mode: str = key()  # auto | disable | resume_path | a .../global_step_N path (validate())
    # LUFFY's `resume_from_path: False` means "no path"; True names no checkpoint.
    resume_from_path: Union[str, bool, None] = key(refuse={True: "give a checkpoint path, or False / null for none"})
    max_optim_to_keep: int = key(bounds=AT_LEAST_ONE)
    max_actor_ckpt_to_keep: Optional[int] = key(bounds=AT_LEAST_ONE)
    checkpoint_checksums: bool = key()
    save_on_signal: bool = key()
    max_restarts: int = key(bounds=NON_NEGATIVE)
    restart_wait_s: int = key(bounds=NON_NEGATIVE)
    balance_batch: bool = key()
    seed: int = key()
    save_hf_on_save: bool = key()
    val_generations_to_log: int = key(bounds=NON_NEGATIVE)
    rollout_data_dir: Optional[str] = key()
    rejection_sample: bool = _inert()
    rejection_sample_multiplier: int = _inert()
    debug: bool = _inert("LUFFY's breakpoint() switch is not shipped")
    add_full_target_when_none: bool = _inert("it is a no-op branch in LUFFY")
    skip_valid_mask: bool = _inert("it only affects LUFFY's unused valid_mask")
    acc_rebatch: bool = _inert("LUFFY's accuracy-rebatching trainer (mix_trainer_acc_rebatch) is not shipped")
    skip_by_step: bool = _inert()
    # Optional `+trainer.` keys (not in the YAML): LUFFY's validate-before-training and validate-only switches.
    val_before_train: bool = key(default=True)
    val_only: bool = key(default=False)

    def validate(self) -> list[str]:
        mode, errors = self.resume_mode, []
        if mode not in ("auto", "disable", "resume_path") and "global_step_" not in mode:
            errors.append(
                f"'trainer.resume_mode'={mode!r} must be auto, disable, resume_path or a .../global_step_N path"
            )
        if mode == "resume_path" and not self.resume_from_path:
            errors.append("'trainer.resume_mode'=resume_path needs 'trainer.resume_from_path'")
        return errors

    def total_steps(self, batches_per_epoch: int) -> int:
        """The run's training steps: ``total_training_steps``, else epochs x batches per epoch."""
        if self.total_training_steps is not None:
            return int(self.total_training_steps)
        return int(batches_per_epoch) * int(self.total_epochs)


@dataclass(frozen=True)
class SelfReplaySection:
    """``data.self_replay.*``: the buffer of the run's own correct rollouts (luffy_pool/replay/buffer.py)."""

    enable: bool
    capacity: int = key(bounds=AT_LEAST_ONE)
    max_per_prompt: int = key(bounds=AT_LEAST_ONE)
    eviction: str = key(choices=values_of("luffy_pool.replay.buffer", "EVICTIONS"))
    max_age: int = key(bounds=Bound(lambda v: v >= -1, "must be -1 (no limit) or >= 0"))
    selection: str = key(choices=values_of("luffy_pool.replay.buffer", "SELECTIONS"))
    slots: int = key(bounds=AT_LEAST_ONE)


@dataclass(frozen=True)
class DataSection:
    """``data.*`` (meanings: the comments next to each key in mix_ppo_trainer.yaml)."""

    tokenizer: Optional[str]
    train_files: Union[str, list] = key()
    val_files: Union[str, list, None] = key()
    prompt_key: str = key()
    target_key: str = key()
    max_prompt_length: int = key(bounds=AT_LEAST_ONE)
    max_response_length: int = key(bounds=AT_LEAST_ONE)
    train_batch_size: int = key(bounds=AT_LEAST_ONE)
    val_batch_size: Optional[int] = key(bounds=AT_LEAST_ONE)
    shuffle: bool = key()
    seed: int = key()
    reward_impl_version: int = key()
    sample_target_ratio: float = key(bounds=UNIT)
    sample_target_mode: str = key(choices=values_of("luffy_pool.rollout.rl_dataset_with_target", "SAMPLE_TARGET_MODES"))
    filter_overlong_prompts: bool = key()
    disable_truncation_advantage: bool = key()
    truncate_off_policy: str = key(
        choices=values_of("luffy_pool.rollout.rl_dataset_with_target", "TRUNCATE_OFF_POLICY")
    )
    off_policy_files: Union[list, str] = key()
    off_policy_id_key: str = key()
    val_max_rows: Optional[int] = key(bounds=AT_LEAST_ONE)
    dataloader_num_workers: int = key(bounds=NON_NEGATIVE)
    return_raw_input_ids: bool = _inert(_RM_ONLY)
    return_raw_chat: bool = _inert(_RM_ONLY)
    filter_targets: bool = _inert()
    filter_accuracy: bool = _inert(_ACC_REBATCH)
    accuracy_lower_bound: float = _inert(_ACC_REBATCH)
    accuracy_upper_bound: float = _inert(_ACC_REBATCH)
    add_tgt_with_acc: bool = _inert("it only changes use_sft_prefix_reward's group size in LUFFY and is not shipped")
    add_tgt_acc_upper_bound: float = _inert()
    self_replay: SelfReplaySection = nested(SelfReplaySection)

    def validate(self) -> list[str]:
        if self.max_response_length > MAX_RESPONSE_LENGTH:
            return [
                f"'data.max_response_length'={self.max_response_length} is beyond any model context "
                f"(> {MAX_RESPONSE_LENGTH} tokens)"
            ]
        return []


@dataclass(frozen=True)
class LossSection(PolicyLossSection):
    """The ``actor_rollout_ref.actor`` keys that choose and parametrise the policy loss (luffy_pool/algorithm/mix_core_alg.py,
    verl/trainer/ppo/loss_inputs.py): the base loss keys plus LUFFY's. A view of the flat actor group (``actor.loss``)."""

    policy_loss: str = key(
        choices=policy_losses(_MIX, "luffy_pool.methods")
    )  # the registry's names (LUFFY's losses registered) or auto
    use_off_policy_loss: bool = key()
    use_sft_multitask_loss: bool = key()
    use_off_policy_probs: bool = key()
    use_ppo_kl_loss: bool = key()
    ppo_kl_loss_coef: float = key(bounds=NON_NEGATIVE)
    use_adaptive_temperature: bool = key()
    use_adaptive_temperature_fixed: bool = key()
    alpha_lr: float = key(bounds=NON_NEGATIVE)
    adaptive_temperature_clip: float = key(bounds=OFF_OR_POSITIVE)
    adaptive_temperature_target_entropy: float = key()
    clip_upper_bound: float = key()
    off_policy_cliprange: Optional[float] = _inert("LUFFY's token loss receives it but never uses it")
    off_policy_normalize: bool = key(refuse={True: "it only feeds LUFFY's unimplemented seq loss"})
    off_policy_max_clip: float = key(bounds=OFF_OR_POSITIVE)
    off_policy_min_clip: float = key(bounds=OFF_OR_POSITIVE)
    all_max_clip: float = key(bounds=OFF_OR_POSITIVE)
    off_policy_loss_coef: float = key(bounds=NON_NEGATIVE)
    off_policy_reshape: str = key(choices=values_of(_MIX, "OFF_POLICY_RESHAPES"))
    off_policy_reshape_weight: float = key()
    off_policy_reshape_pow_exp: float = key()
    on_policy_reshape: str = key(choices=values_of(_MIX, "ON_POLICY_RESHAPES"))
    on_policy_reshape_weight: float = key()
    on_policy_reshape_pow_exp: float = key()
    sft_loss_coef: float = key(bounds=NON_NEGATIVE)

    @classmethod
    def from_actor_config(cls, actor_cfg) -> "LossSection":
        """From the ``actor_rollout_ref.actor`` group itself (what the actor worker holds)."""
        return build_section(cls, actor_cfg, "actor_rollout_ref.actor")

    def validate(self) -> list[str]:
        """LUFFY's loss switches: one loss at a time, chosen by the switches (policy_loss=auto) or by name."""
        errors = []
        if self.use_sft_multitask_loss and self.use_off_policy_loss:
            errors.append(f"'{_A}.use_sft_multitask_loss'=True cannot be combined with '{_A}.use_off_policy_loss'=True")
        if self.policy_loss != "auto" and (self.use_off_policy_loss or self.use_sft_multitask_loss):
            errors.append(
                f"'{_A}.policy_loss'={self.policy_loss!r} conflicts with LUFFY's loss switches "
                "(use_off_policy_loss / use_sft_multitask_loss); set policy_loss=auto or turn the switches off"
            )
        if self.use_off_policy_probs and not self.use_off_policy_loss:
            errors.append(
                f"'{_A}.use_off_policy_probs'=True needs '{_A}.use_off_policy_loss'=True (the behaviour "
                "probabilities only enter the off-policy loss)"
            )
        if self.use_adaptive_temperature_fixed and not self.use_adaptive_temperature:
            errors.append(f"'{_A}.use_adaptive_temperature_fixed'=True needs '{_A}.use_adaptive_temperature'=True")
        return errors


@dataclass(frozen=True)
class LuffyActorSection(ActorSection):
    """``actor_rollout_ref.actor`` with LUFFY's keys: the loss view (``loss``) and the driver's switches."""

    loss: LossSection = view(LossSection)
    off_policy_loss_impl: str = key(
        choices=("token", "seq"), refuse={"seq": "is not implemented in LUFFY either; use token"}
    )
    use_sft_prefix_reward: bool = key()
    sft_prefix_reward_weight: float = key()
    recompute_old_log_prob: str = key(choices=("always", "auto"))
    use_sft_reward: bool = _inert()
    use_off_policy_clip: bool = _inert()
    debug: bool = _inert()
    use_target_lst: bool = _inert()


@dataclass(frozen=True)
class LuffyRolloutSection(RolloutSection):
    """``actor_rollout_ref.rollout`` with LUFFY's off-policy prefix plan (luffy_pool/rollout/off_policy_pool.py)."""

    max_prefix_len: int = key(bounds=AT_LEAST_ONE)
    prefix_share_across_samples: bool = key()
    prefix_strategy: str = key(choices=values_of("luffy_pool.rollout.off_policy_pool", "PREFIX_STRATEGIES"))
    n_prefix: int = key()  # -1 or [0, n]: validate()
    min_prefix_ratio: float = key(bounds=UNIT)
    max_prefix_ratio: float = key(bounds=UNIT)
    prefix_steps: int = key(bounds=AT_LEAST_ONE)
    prefix_linear_max_ratio: float = key(bounds=UNIT)
    prefix_reward_weight_alpha: float = key()
    prefix_reward_weight_beta: float = key()
    prefix_linear_max_var: float = _inert()
    prefix_reward_strategy: str = _inert()

    def validate(self) -> list[str]:
        """The prefix plan's rules (luffy_pool/rollout/off_policy_pool.PrefixRatioSampler draws from it unchecked)."""
        errors, n, n_prefix = [], self.n, self.n_prefix
        if n_prefix != -1 and not 0 <= n_prefix <= n:
            errors.append(f"'{_R}.n_prefix'={n_prefix} must be -1 (all slots) or in [0, rollout.n={n}]")
        if self.prefix_strategy == "linear" and not self.prefix_share_across_samples:
            errors.append(
                f"'{_R}.prefix_strategy'=linear needs '{_R}.prefix_share_across_samples'=True (as in LUFFY: "
                f"one shared ratio per step); use prefix_strategy=random or add "
                f"{_R}.prefix_share_across_samples=True"
            )
        if self.prefix_strategy == "fixed" and self.prefix_share_across_samples:
            errors.append(
                f"'{_R}.prefix_strategy'=fixed cannot be combined with '{_R}.prefix_share_across_samples'=True"
                " (as in LUFFY: fixed gives each slot its own ratio); set prefix_share_across_samples=False"
            )
        if self.min_prefix_ratio > self.max_prefix_ratio:
            errors.append(
                f"'{_R}.min_prefix_ratio'={self.min_prefix_ratio} exceeds "
                f"'{_R}.max_prefix_ratio'={self.max_prefix_ratio}"
            )
        return errors


@dataclass(frozen=True)
class LuffyWorkerSections(WorkerSections):
    """``actor_rollout_ref`` as the LUFFY worker and driver read it."""

    actor: LuffyActorSection = nested(LuffyActorSection)
    rollout: LuffyRolloutSection = nested(LuffyRolloutSection)
    # algorithm.method and its frozen knob section (luffy_pool/methods/base.MethodSelection): not a key of this
    # group, set by ConfigSections.from_config so every worker receives it once, at init
    method: Any = field(default=None, metadata={"absent": True})

    def validate(self) -> list[str]:
        errors = super().validate()
        if self.actor.use_sft_prefix_reward and self.rollout.n_prefix != -1:
            errors.append(f"'{_A}.use_sft_prefix_reward'=True needs '{_R}.n_prefix'=-1, got {self.rollout.n_prefix}")
        return errors


@dataclass(frozen=True)
class KLControlSection:
    """``algorithm.kl_ctrl``: the KL-in-reward controller."""

    type: str = key(choices=values_of("verl.trainer.ppo.kl", "KL_CONTROLLER_TYPES"))
    kl_coef: float = key(bounds=NON_NEGATIVE)
    target_kl: float = key()
    horizon: int = key()

    def validate(self) -> list[str]:
        if self.type == "adaptive" and not self.horizon > 0:
            return ["'algorithm.kl_ctrl.horizon' must be > 0 with algorithm.kl_ctrl.type=adaptive"]
        return []


@dataclass(frozen=True)
class RolloutCorrectionSection:
    """``algorithm.rollout_correction``: verl's truncated IS weights and rejection for the rollout/trainer
    mismatch (verl/trainer/ppo/rollout_corr.py; cross-key rule: its ``config_errors``)."""

    rollout_is: Optional[str] = key(
        bounds=Bound(lambda v: v in ("token", "sequence"), "must be null, token or sequence")
    )
    rollout_is_threshold: float = key(bounds=POSITIVE)
    rollout_is_batch_normalize: bool = key()
    rollout_rs: Optional[str] = key()  # comma-separated options: checked by rollout_corr.config_errors
    rollout_rs_threshold: Union[str, float, None] = key()
    bypass_mode: bool = key()


@dataclass(frozen=True)
class AlgorithmSection:
    """``algorithm.*``: the training method, the advantage estimator, KL-in-reward and rollout correction."""

    method: str = key(choices=values_of("luffy_pool.methods", "method_names"))

    gamma: float
    lam: float = _inert("only GAE reads it, and gae needs a critic, which is not shipped")
    adv_estimator: str = key(
        choices=_adv_estimators, refuse={"gae": "needs a critic (value model), which is not shipped; use grpo"}
    )
    grpo_use_std: bool = key()
    kl_penalty: str = key(choices=kl_estimators)
    surprisal_base: float = _inert()
    kl_ctrl: KLControlSection = nested(KLControlSection)
    rollout_correction: RolloutCorrectionSection = nested(RolloutCorrectionSection)


@dataclass(frozen=True)
class FormatRewardSection:
    """``reward.format_reward``."""

    enable: bool
    weight: float
    mode: str


@dataclass(frozen=True)
class OrmSection:
    """``reward.orm``: the LLM-as-judge outcome reward (deepscaler/rewards/orm.py)."""

    enable: bool
    base_url: Optional[str]
    model: Optional[str]
    api_key_env: str
    timeout_s: float = key(bounds=POSITIVE)
    max_retries: int = key(bounds=NON_NEGATIVE)
    requests_per_second: float = key(bounds=POSITIVE)
    cache_path: Optional[str] = key()
    max_failure_rate: float = key(bounds=UNIT)
    on_failure: str = key(choices=values_of("deepscaler.rewards.orm", "ON_FAILURE"))

    def validate(self) -> list[str]:
        missing = [k for k in ("base_url", "model") if self.enable and not getattr(self, k)]
        if missing:
            return [
                f"'reward.orm.enable'=True needs {' and '.join(f'reward.orm.{k}' for k in missing)} "
                "(the judge's OpenAI-compatible endpoint and model name)"
            ]
        return []


@dataclass(frozen=True)
class RewardSection:
    """``reward.*`` (read by verl/workers/reward_manager, which takes partial groups from eval scripts too)."""

    num_workers: Optional[int] = key(bounds=AT_LEAST_ONE)  # null: verl/workers/reward_manager default_num_workers
    timeout_s: float = key(bounds=POSITIVE)
    grade_budget_s: float = key(bounds=POSITIVE)
    grader: str = key()
    format_reward: FormatRewardSection = nested(FormatRewardSection)
    orm: OrmSection = nested(OrmSection)


_NO_RM = "model-based reward workers are not shipped"


@dataclass(frozen=True)
class RewardModelSection:
    """``reward_model``: LUFFY's model-based reward workers, not shipped."""

    enable: bool = key(refuse={True: f"{_NO_RM}; use reward.orm for a judge"})


@dataclass(frozen=True)
class RayInitSection:
    """``ray_init.*``: which Ray instance the driver joins or starts."""

    address: Optional[str]
    num_cpus: Optional[int] = key(bounds=AT_LEAST_ONE)
    max_direct_call_object_size: Optional[int] = key(bounds=AT_LEAST_ONE)


@dataclass(frozen=True)
class ConfigSections:
    """The typed sections of one run config, one per YAML group; build once (``from_config``) and pass around."""

    data: DataSection = nested(DataSection)
    actor_rollout_ref: LuffyWorkerSections = nested(LuffyWorkerSections)
    reward_model: RewardModelSection = nested(
        RewardModelSection, refused=f"{_NO_RM}; use reward.* (rule grader or reward.orm judge)"
    )
    reward: RewardSection = nested(RewardSection)
    algorithm: AlgorithmSection = nested(AlgorithmSection)
    trainer: TrainerSection = nested(TrainerSection)
    ray_init: RayInitSection = nested(RayInitSection)
    critic: None = not_shipped("the critic (value model) is not shipped; adv_estimator=gae is unsupported, use grpo")

    @classmethod
    def from_config(cls, config) -> "ConfigSections":
        """The sections of ``config``; the workers' group carries the selected method and its knob section."""
        import dataclasses

        from luffy_pool.methods import select_method

        sections = build_section(cls, config, "")
        workers = dataclasses.replace(sections.actor_rollout_ref, method=select_method(config))
        return dataclasses.replace(sections, actor_rollout_ref=workers)

    @property
    def knobs(self):
        """The selected method's knob section (``algorithm.<method>``), None for a method without knobs."""
        method = self.actor_rollout_ref.method
        return None if method is None else method.knobs

    def validate(self) -> list[str]:
        """Rules between groups: the loss against the estimator, self-replay against the loss and group size,
        the engine's lengths and the token budgets against the data's, and the layout against the world size."""
        errors, a, r, data = [], self.actor, self.workers.rollout, self.data
        if a.use_sft_multitask_loss and self.algorithm.adv_estimator != "grpo_split":
            errors.append(
                f"'{_A}.use_sft_multitask_loss'=True needs 'algorithm.adv_estimator'=grpo_split "
                f"(on-policy advantages without the off-policy rows), got {self.algorithm.adv_estimator!r}"
            )
        # kl_ctrl.kl_coef > 0 without a reference is accepted, as in LUFFY: there is no ref_log_prob, so the
        # KL-in-reward term is absent (beta = 0, critic/kl_coeff logs 0; verl/trainer/ppo/kl.apply_kl_penalty).
        replay = data.self_replay
        if replay.enable and not (a.use_off_policy_loss and a.use_off_policy_probs):
            errors.append(
                f"'data.self_replay.enable'=True needs '{_A}.use_off_policy_loss'=True and "
                f"'{_A}.use_off_policy_probs'=True (replayed traces are weighted by their behaviour log-probs)"
            )
        if replay.enable and replay.slots > r.n:
            errors.append(
                f"'data.self_replay.slots'={replay.slots} exceeds '{_R}.n'={r.n} (a group has only n rows to replace)"
            )
        if data.dataloader_num_workers > 0 and self.trainer.save_freq > 0:
            # Worker processes prefetch, so the sampler's cursor runs ahead of the batches trained on and a resume
            # would silently skip prompts.
            errors.append(
                f"'data.dataloader_num_workers'={data.dataloader_num_workers} with 'trainer.save_freq'="
                f"{self.trainer.save_freq}: the saved sampler position would be ahead of training; use "
                "dataloader_num_workers=0 to checkpoint"
            )
        for rollout_key, data_key in (
            ("prompt_length", "max_prompt_length"),
            ("response_length", "max_response_length"),
        ):
            if getattr(r, rollout_key) != getattr(data, data_key):
                errors.append(
                    f"'{_R}.{rollout_key}'={getattr(r, rollout_key)} must equal 'data.{data_key}'="
                    f"{getattr(data, data_key)} (leave it as the ${{data.{data_key}}} interpolation)"
                )
        from verl.trainer.ppo.rollout_corr import config_errors as rollout_corr_errors  # torch: imported when checked

        # algorithm.rollout_correction needs the engine's log-probs (rollout.calculate_log_probs) and their mode
        errors += rollout_corr_errors(lambda dotted: functools.reduce(getattr, dotted.split("."), self))
        knob_rules = getattr(self.knobs, "validate", None)  # the selected method's rules between its knobs
        errors += knob_rules() if knob_rules is not None else []
        from luffy_pool.config.run_rules import context_errors, layout_errors, pipeline_errors

        return errors + context_errors(self) + layout_errors(self) + pipeline_errors(self)

    @property
    def workers(self) -> LuffyWorkerSections:
        """``actor_rollout_ref``: what every worker builds from its group (model, actor, ref, rollout)."""
        return self.actor_rollout_ref

    @property
    def actor(self) -> LuffyActorSection:
        return self.actor_rollout_ref.actor
