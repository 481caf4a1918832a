"""Typed sections of the ``actor_rollout_ref`` config group: the one declaration of each key the verl worker, actor
and rollout engine read (verl/utils/config_section.py), built once per worker (``WorkerSections.from_config``); the
values and their documentation come from verl/trainer/config/ppo_worker.yaml. LUFFY's own keys of these groups are
declared in luffy_pool/config/sections.py, which extends these classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl.utils.config_section import (
    AT_LEAST_ONE,
    DEFAULT_ONLY,
    NON_NEGATIVE,
    OFF_OR_POSITIVE,
    OPEN_UNIT,
    POSITIVE,
    UNIT,
    Bound,
    build_section,
    key,
    nested,
    values_of,
    view,
)

# Dtype names the FSDP modules accept (verl/workers/fsdp_workers.py maps them to torch dtypes).
DTYPES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3")


kl_estimators = values_of("verl.trainer.ppo.kl", "KL_PENALTY_TYPES")
step_impls = values_of("verl.utils.optim", "STEP_IMPLS")


def policy_losses(*registering: str):
    """``auto`` and the names of ``POLICY_LOSS_REGISTRY`` once the ``registering`` modules are imported (a
    ``model.external_lib`` module imported before the check may have registered more)."""
    names = values_of("verl.trainer.ppo.core_algos", "POLICY_LOSS_REGISTRY", *registering)
    return lambda: ("auto",) + names()


def _engine(name: str):
    """A value list of the rollout engine's keys (verl/workers/rollout/engine_values.py), read when checked."""
    return values_of("verl.workers.rollout.engine_values", name)


@dataclass(frozen=True)
class ModelSection:
    """``actor_rollout_ref.model``."""

    path: str
    external_lib: Optional[str]
    override_config: dict = key(open_dict=True)  # HF config attributes to set; `+` adds fields
    enable_gradient_checkpointing: bool = key()
    use_remove_padding: bool = key()
    shared_prompt_forward: bool = key()
    logprob_chunk_size: int = key(bounds=NON_NEGATIVE)
    attn_implementation: str = key(choices=ATTN_IMPLEMENTATIONS)
    trust_remote_code: bool = key()


@dataclass(frozen=True)
class WrapPolicySection:
    """``fsdp_config.wrap_policy``."""

    min_num_params: int


@dataclass(frozen=True)
class ShardingSection:
    """``ref.fsdp_config``: how a module is sharded and in which dtypes it computes."""

    param_offload: bool
    param_dtype: str = key(choices=("auto",) + DTYPES)
    reduce_dtype: str = key(choices=DTYPES)
    reshard_after_forward: bool = key()
    wrap_policy: WrapPolicySection = nested(WrapPolicySection)


@dataclass(frozen=True)
class FSDPSection(ShardingSection):
    """``actor.fsdp_config``: the reference's keys plus the trainable module's offload and mesh keys."""

    grad_offload: bool = key(refuse={True: "FSDP2 keeps gradients with their parameters; use param_offload"})
    optimizer_offload: bool = key()
    fsdp_size: int = key(bounds=OFF_OR_POSITIVE)


BETAS = Bound(
    lambda b: len(b) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in b),
    "must be two numbers in [0, 1)",
    "'{key}' {message}, got {value!r}",
)


@dataclass(frozen=True)
class OptimSection:
    """``actor.optim``."""

    lr: float = key(bounds=NON_NEGATIVE)
    lr_warmup_steps_ratio: float = key(bounds=UNIT)
    warmup_style: str = key(choices=("constant", "cosine"))
    min_lr_ratio: Optional[float] = key(bounds=UNIT)
    # The launcher passes the run's step count to the worker (``total_training_steps``); a standalone actor (tests,
    # benchmarks, built without the checker) sets it here.
    total_training_steps: int = key(
        luffy=DEFAULT_ONLY,
        why="a run passes its own step count to the workers; set trainer.total_training_steps or trainer.total_epochs",
    )
    weight_decay: float = key(bounds=NON_NEGATIVE)
    betas: list = key(bounds=BETAS)
    zero_lr_first_step: bool = key()
    step_impl: str = key(choices=step_impls)


@dataclass(frozen=True)
class CheckpointSection:
    """``actor.checkpoint``."""

    contents: list = key(choices=("model", "optimizer", "extra"))


@dataclass(frozen=True)
class PolicyLossSection:
    """The actor keys every registered policy loss may read (verl/trainer/ppo/core_algos.py); the LUFFY losses
    read more (luffy_pool.config.sections.LossSection). A view of the flat actor group."""

    policy_loss: str = key(choices=policy_losses())
    clip_ratio: float = key(bounds=POSITIVE)
    entropy_coeff: float = key(bounds=NON_NEGATIVE)
    loss_remove_token_mean: bool = key()
    loss_remove_clip: bool = key()


@dataclass(frozen=True)
class ActorSection:
    """``actor_rollout_ref.actor``: batch sizes, the PPO update, KL-in-loss, the non-finite policy, sequence
    parallelism, optimiser, FSDP and (``loss``) the policy loss's keys, which sit in the same YAML group.
    Reading a loss key on the actor (``actor.clip_ratio``) reads it from that view."""

    ppo_mini_batch_size: int = key(bounds=AT_LEAST_ONE)
    ppo_micro_batch_size: Optional[int] = key()
    ppo_micro_batch_size_per_gpu: Optional[int] = key()
    use_dynamic_bsz: bool = key()
    ppo_max_token_len_per_gpu: int = key(bounds=AT_LEAST_ONE)
    grad_clip: float = key(bounds=POSITIVE)
    use_kl_loss: bool = key()
    kl_loss_coef: float = key(bounds=NON_NEGATIVE)
    kl_loss_type: str = key(choices=kl_estimators)
    ppo_epochs: int = key(bounds=AT_LEAST_ONE)
    shuffle: bool = key()
    ulysses_sequence_parallel_size: int = key(bounds=AT_LEAST_ONE)
    tensor_model_parallel_size: int = key(bounds=AT_LEAST_ONE)  # verl/utils/tensor_parallel.py
    sequence_parallel: bool = key()  # with tp > 1: verl/utils/sequence_parallel_norms.py
    pipeline_model_parallel_size: int = key(bounds=AT_LEAST_ONE)  # verl/utils/pipeline_parallel.py
    pipeline_schedule: str = key(choices=values_of("verl.utils.pipeline_parallel", "SCHEDULES"))
    on_nonfinite: str = key(choices=("skip", "stop"))
    skip_grad_bound: Optional[float] = key(bounds=POSITIVE)
    router_aux_loss_coef: float = key(bounds=NON_NEGATIVE)  # MoE: verl/workers/actor/moe_router.py
    metric_aggregation: str = key(choices=values_of("verl.utils.step_metrics", "METRIC_AGGREGATIONS"))
    strategy: str = key(choices=("fsdp", "fsdp2"))  # both name FSDP2 (fully_shard)
    optim: OptimSection = nested(OptimSection)
    fsdp_config: FSDPSection = nested(FSDPSection)
    checkpoint: CheckpointSection = nested(CheckpointSection)
    loss: PolicyLossSection = view(PolicyLossSection)

    def __getattr__(self, name: str):
        # Only called for names that are not fields: the loss keys, read through the loss view.
        if name.startswith("__") or name == "loss":
            raise AttributeError(name)
        return getattr(self.loss, name)

    @classmethod
    def from_actor_config(cls, actor_cfg) -> "ActorSection":
        return build_section(cls, actor_cfg, "actor_rollout_ref.actor")


@dataclass(frozen=True)
class RefSection:
    """``actor_rollout_ref.ref``."""

    use_ref: bool
    log_prob_micro_batch_size: Optional[int]
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int = key(bounds=AT_LEAST_ONE)
    ulysses_sequence_parallel_size: int = key(bounds=AT_LEAST_ONE)
    tensor_model_parallel_size: Optional[int] = key()  # null: the actor's (they share one worker's mesh)
    fsdp_config: ShardingSection = nested(ShardingSection)


_TOP_K = Bound(lambda v: v >= -1, "must be -1 (off), 0 (off, hf) or > 0")
_SLEEP_LEVEL = Bound(lambda v: v in (1, 2), "must be 1 or 2 (vLLM sleep levels)")


@dataclass(frozen=True)
class RolloutSection:
    """``actor_rollout_ref.rollout``: sampling, engine and weight sync (the engine's config is built from it,
    verl/workers/rollout/config.py)."""

    name: str = key(choices=("vllm", "hf"))
    temperature: float = key(bounds=POSITIVE)
    val_temperature: float = key(bounds=NON_NEGATIVE)
    top_k: int = key(bounds=_TOP_K)
    top_p: float = key(bounds=OPEN_UNIT)
    n: int = key(bounds=AT_LEAST_ONE)
    n_val: int = key(bounds=AT_LEAST_ONE)
    prompt_length: int = key()
    response_length: int = key()
    dtype: str = key(choices=_engine("DTYPES"))
    gpu_memory_utilization: float = key(bounds=OPEN_UNIT)
    ignore_eos: bool = key()
    enforce_eager: bool = key()
    free_cache_engine: bool = key()
    sleep_level: int = key(bounds=_SLEEP_LEVEL)
    load_format: str = key(choices=_engine("LOAD_FORMATS"))
    tensor_model_parallel_size: int = key(bounds=AT_LEAST_ONE)
    max_num_batched_tokens: int = key(bounds=AT_LEAST_ONE)
    max_num_seqs: int = key(bounds=AT_LEAST_ONE)
    enable_chunked_prefill: bool = key()
    enable_prefix_caching: bool = key()
    log_prob_micro_batch_size: Optional[int] = key()
    log_prob_use_dynamic_bsz: bool = key()
    log_prob_max_token_len_per_gpu: int = key(bounds=AT_LEAST_ONE)
    do_sample: bool = key()
    cpu_kv_cache_bytes: int = key(bounds=AT_LEAST_ONE)
    hf_micro_batch_size: int = key(bounds=AT_LEAST_ONE)
    hf_decoder: str = key(choices=_engine("HF_DECODERS"))
    seed: int = key()
    weight_sync_bucket_mb: int = key(bounds=AT_LEAST_ONE)
    weight_sync_packed: bool = key()
    weight_transport: str = key(choices=_engine("WEIGHT_TRANSPORTS"))
    logprobs_mode: str = key(choices=_engine("LOGPROBS_MODES"))
    calculate_log_probs: bool = key()
    max_engine_restarts: int = key(bounds=NON_NEGATIVE)
    max_model_len: Optional[int] = key(bounds=AT_LEAST_ONE)
    nnodes: int = key(bounds=AT_LEAST_ONE)  # the engines' own ranks with hybrid_engine=False (WorkerSections)
    n_gpus_per_node: int = key(bounds=NON_NEGATIVE)

    @classmethod
    def from_rollout_config(cls, rollout_cfg) -> "RolloutSection":
        return build_section(cls, rollout_cfg, "actor_rollout_ref.rollout")

    @property
    def engine_ranks(self) -> int:
        """Ranks per rollout engine: vLLM's tensor parallel size (the HF engine is one rank each)."""
        return int(self.tensor_model_parallel_size) if self.name == "vllm" else 1


@dataclass(frozen=True)
class WorkerSections:
    """``actor_rollout_ref``: everything one ``ActorRolloutRefWorker`` reads, built once from that group."""

    hybrid_engine: bool = key()  # False: rollout engines on their own ranks (rollout.nnodes x n_gpus_per_node)
    nccl_timeout: int = key(bounds=AT_LEAST_ONE)  # seconds, the process group's collective timeout
    model: ModelSection = nested(ModelSection)
    actor: ActorSection = nested(ActorSection)
    ref: RefSection = nested(RefSection)
    rollout: RolloutSection = nested(RolloutSection)

    @classmethod
    def from_config(cls, arr_cfg) -> "WorkerSections":
        """From the ``actor_rollout_ref`` group (what the driver hands each worker)."""
        return build_section(cls, arr_cfg, "actor_rollout_ref")

    def validate(self) -> list[str]:
        """Rules between the actor, reference and model keys: one worker holds actor and reference, so they share
        its Ulysses SP groups; SP needs an attention kernel that takes sharded heads, and a local model's heads
        must split over the SP ranks; the KL loss needs the reference policy."""
        from verl.utils.parallel_check import local_model_heads, sp_heads_error

        errors, sp, sp_key = [], self.actor.ulysses_sequence_parallel_size, f"{_A}.ulysses_sequence_parallel_size"
        if self.ref.ulysses_sequence_parallel_size != sp:
            errors.append(
                f"'{_REF}.ulysses_sequence_parallel_size'={self.ref.ulysses_sequence_parallel_size} must "
                f"equal '{sp_key}'={sp} (actor and reference share one worker and its SP groups)"
            )
        if sp > 1 and self.model.attn_implementation == "eager":
            errors.append(
                f"'{sp_key}'={sp} needs sdpa or flash attention; "
                f"'{_M}.attn_implementation'=eager is not supported with it"
            )
        heads = local_model_heads(self.model.path, self.model.override_config) if sp > 1 else None
        if heads is not None and sp_heads_error(*heads, sp):
            errors.append(f"{sp_heads_error(*heads, sp)} (from {self.model.path}/config.json)")
        from verl.utils.pipeline_parallel import section_errors

        errors += self._placement_errors() + self._tensor_parallel_errors() + section_errors(self)
        if self.actor.use_kl_loss and not self.ref.use_ref:
            errors.append(
                f"'{_A}.use_kl_loss'=True needs '{_REF}.use_ref'=True (the KL is to the reference policy; "
                f"LUFFY's actor fails reading ref_log_prob); add {_A}.use_kl_loss=False to train without one"
            )
        return errors

    def _tensor_parallel_errors(self) -> list[str]:
        """The actor's tensor parallelism (verl/utils/tensor_parallel.py): the reference follows it, Ulysses SP and
        HSDP do not combine with it, and a local model must have a plan and heads that split."""
        from verl.utils.parallel_check import local_model_config
        from verl.utils.tensor_parallel import TP_KEY, tp_layout_errors

        tp, ref_tp, errors = self.actor.tensor_model_parallel_size, self.ref.tensor_model_parallel_size, []
        if ref_tp is not None and ref_tp != tp:
            errors.append(
                f"'{_REF}.tensor_model_parallel_size'={ref_tp} must be null or equal '{TP_KEY}'={tp} (actor and "
                "reference share one worker and its (dp, tp) mesh)"
            )
        if tp == 1:
            return errors
        sp = self.actor.ulysses_sequence_parallel_size
        if sp > 1:
            errors.append(
                f"'{TP_KEY}'={tp} with '{_A}.ulysses_sequence_parallel_size'={sp}: tensor parallel x Ulysses SP is "
                "not supported; set one of them to 1"
            )
        if self.actor.fsdp_config.fsdp_size != -1:
            errors.append(
                f"'{TP_KEY}'={tp} with '{_A}.fsdp_config.fsdp_size'={self.actor.fsdp_config.fsdp_size}: tensor "
                "parallel shards over every dp rank (HSDP is not combined with it); keep fsdp_size=-1"
            )
        model_config = local_model_config(self.model.path, self.model.override_config)
        return errors + [f"{e} (from {self.model.path}/config.json)" for e in tp_layout_errors(model_config, tp)]

    @property
    def rollout_world_size(self) -> int:
        """Ranks of the rollout engines' own worker group (0 with the hybrid engine: they share the actor's)."""
        return 0 if self.hybrid_engine else int(self.rollout.nnodes) * int(self.rollout.n_gpus_per_node)

    def _placement_errors(self) -> list[str]:
        """The split placement's keys: rollout ranks of their own exactly when the hybrid engine is off."""
        n, nodes = self.rollout.n_gpus_per_node, self.rollout.nnodes
        if self.hybrid_engine and (n != 0 or nodes != 1):
            return [
                f"'{_R}.n_gpus_per_node'={n} / '{_R}.nnodes'={nodes} place the rollout engines on ranks of their "
                f"own, which needs 'actor_rollout_ref.hybrid_engine'=False (with True they share the actor's ranks;"
                f" keep 0 / 1)"
            ]
        if not self.hybrid_engine and n < 1:
            return [
                f"'actor_rollout_ref.hybrid_engine'=False needs '{_R}.n_gpus_per_node' >= 1 (the rollout engines' "
                f"own ranks per node), got {n}"
            ]
        if (
            not self.hybrid_engine
            and self.rollout.name == "vllm"
            and self.rollout_world_size % self.rollout.engine_ranks
        ):
            return [
                f"'{_R}.tensor_model_parallel_size'={self.rollout.tensor_model_parallel_size} must divide the "
                f"rollout ranks {self.rollout_world_size} ('{_R}.nnodes' * '{_R}.n_gpus_per_node')"
            ]
        return []


_M, _A, _REF, _R = (f"actor_rollout_ref.{g}" for g in ("model", "actor", "ref", "rollout"))
