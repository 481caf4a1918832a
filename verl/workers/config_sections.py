"""Typed sections of the ``actor_rollout_ref`` config group, as the FSDP worker and the actor read them.

Built once per worker (``WorkerSections.from_config``) from the composed config; every value comes from
the YAML (luffy_pool/config/mix_ppo_trainer.yaml documents each key next to its default), none is restated
here. Model, optimiser, FSDP, reference and rollout sections hold every key of their group
(tests/verl/workers/test_config_sections.py keeps them in step with the YAML); ``ActorSection`` holds the
actor keys the base PPO actor and worker read (the LUFFY loss keys live in luffy_pool.config_sections).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from verl.utils.config_section import build_section, nested


@dataclass(frozen=True)
class ModelSection:
    """``actor_rollout_ref.model``."""

    path: str
    external_lib: Optional[str]
    override_config: Any  # dict of HF config attributes to set
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    shared_prompt_forward: bool
    logprob_chunk_size: int
    attn_implementation: str
    trust_remote_code: bool


@dataclass(frozen=True)
class WrapPolicySection:
    """``fsdp_config.wrap_policy``."""

    min_num_params: int


@dataclass(frozen=True)
class ShardingSection:
    """``ref.fsdp_config``: how a module is sharded and in which dtypes it computes."""

    param_offload: bool
    param_dtype: str
    reduce_dtype: str
    reshard_after_forward: bool
    wrap_policy: WrapPolicySection = nested(WrapPolicySection)


@dataclass(frozen=True)
class FSDPSection(ShardingSection):
    """``actor.fsdp_config``: the reference's keys plus the trainable module's offload and mesh keys."""

    grad_offload: bool  # refused when True by config_check (FSDP2 keeps gradients with their parameters)
    optimizer_offload: bool
    fsdp_size: int


@dataclass(frozen=True)
class OptimSection:
    """``actor.optim``."""

    lr: float
    lr_warmup_steps_ratio: float
    warmup_style: str
    min_lr_ratio: Optional[float]
    total_training_steps: int
    weight_decay: float
    betas: Any  # [beta1, beta2]
    zero_lr_first_step: bool
    step_impl: str


@dataclass(frozen=True)
class CheckpointSection:
    """``actor.checkpoint``."""

    contents: Any  # subset of [model, optimizer, extra]


@dataclass(frozen=True)
class ActorSection:
    """The ``actor`` keys the base worker and PPO actor read: batch sizes, the PPO update, KL-in-loss,
    the non-finite policy, sequence parallelism, optimiser and FSDP."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size: Optional[int]
    ppo_micro_batch_size_per_gpu: Optional[int]
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    grad_clip: float
    clip_ratio: float
    clip_upper_bound: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    ppo_epochs: int
    ulysses_sequence_parallel_size: int
    loss_remove_token_mean: bool
    loss_remove_clip: bool
    on_nonfinite: str
    optim: OptimSection = nested(OptimSection)
    fsdp_config: FSDPSection = nested(FSDPSection)
    checkpoint: CheckpointSection = nested(CheckpointSection)

    @classmethod
    def from_actor_config(cls, actor_cfg) -> "ActorSection":
        return build_section(cls, actor_cfg, "actor_rollout_ref.actor")


@dataclass(frozen=True)
class RefSection:
    """``actor_rollout_ref.ref``."""

    use_ref: bool
    log_prob_micro_batch_size: Optional[int]
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int
    fsdp_config: ShardingSection = nested(ShardingSection)


@dataclass(frozen=True)
class RolloutSection:
    """``actor_rollout_ref.rollout``: sampling, engine, weight sync and LUFFY's prefix schedule keys."""

    name: str
    temperature: float
    val_temperature: float
    top_k: int
    top_p: float
    n: int
    n_val: int
    prompt_length: int
    response_length: int
    dtype: str
    gpu_memory_utilization: float
    ignore_eos: bool
    enforce_eager: bool
    free_cache_engine: bool
    sleep_level: int
    load_format: str
    tensor_model_parallel_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    log_prob_micro_batch_size: Optional[int]
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    do_sample: bool
    cpu_kv_cache_bytes: int
    hf_micro_batch_size: int
    hf_decoder: str
    seed: int
    weight_sync_bucket_mb: int
    weight_sync_packed: bool
    max_prefix_len: int
    prefix_share_across_samples: bool
    prefix_strategy: str
    n_prefix: int
    min_prefix_ratio: float
    max_prefix_ratio: float
    prefix_steps: int
    prefix_linear_max_ratio: float
    prefix_reward_weight_alpha: float
    prefix_reward_weight_beta: float
    prefix_linear_max_var: float
    prefix_reward_strategy: str

    @classmethod
    def from_rollout_config(cls, rollout_cfg) -> "RolloutSection":
        return build_section(cls, rollout_cfg, "actor_rollout_ref.rollout")

    @property
    def engine_ranks(self) -> int:
        """Ranks per rollout engine: vLLM's tensor parallel size (the HF engine is one rank each)."""
        return int(self.tensor_model_parallel_size) if self.name == "vllm" else 1


@dataclass(frozen=True)
class WorkerSections:
    """Everything one ``ActorRolloutRefWorker`` reads, built once from its ``actor_rollout_ref`` group."""

    model: ModelSection
    actor: ActorSection
    ref: RefSection
    rollout: RolloutSection
    nccl_timeout: int  # actor_rollout_ref.nccl_timeout: seconds, the process group's collective timeout

    @classmethod
    def from_config(cls, arr_cfg) -> "WorkerSections":
        """From the ``actor_rollout_ref`` group (what the driver hands each worker)."""
        return cls(model=build_section(ModelSection, arr_cfg.model, "actor_rollout_ref.model"),
                   actor=ActorSection.from_actor_config(arr_cfg.actor),
                   ref=build_section(RefSection, arr_cfg.ref, "actor_rollout_ref.ref"),
                   rollout=RolloutSection.from_rollout_config(arr_cfg.rollout),
                   nccl_timeout=int(_top_level(arr_cfg, "nccl_timeout")))


def _top_level(arr_cfg, key: str):
    """A plain key of the ``actor_rollout_ref`` group itself (not of one of its sections)."""
    if key not in arr_cfg:
        raise KeyError(f"actor_rollout_ref.{key} is missing from the config (compose it from "
                       f"luffy_pool/config/mix_ppo_trainer.yaml, which gives every key its default)")
    return arr_cfg[key]
