"""What drives a LUFFY step's device memory, read from the run's config sections (``PlanInputs.from_sections``), and
the note on what the update costs when the actor keeps padded rows (``padded_update_note``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from luffy_pool.memory_plan.host import ReplayPoolInputs
from luffy_pool.memory_plan.method_extras import method_inputs

DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp32": 4, "float32": 4, "float": 4}
# The config sections' key prefixes, as the plan's lines name them.
ACTOR_KEY, ROLLOUT_KEY, REF_KEY, MODEL_KEY = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)
_A, _R, _REF, _M = ACTOR_KEY, ROLLOUT_KEY, REF_KEY, MODEL_KEY


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What drives memory, read from the run's sections (``from_sections``); no key has a default here, each
    comes from the config (the YAML gives every key its default). Only the CPU benchmark's measurement knobs
    (scored tokens, ``fsdp=False``) have defaults: they are no config key."""

    world: int
    nodes: int
    fsdp_size: int
    sp: int
    tp: int
    param_dtype_bytes: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    free_cache_engine: bool
    rollout_dtype_bytes: int
    weight_sync_bucket_mb: int
    max_prompt_length: int
    max_response_length: int
    n: int
    actor_param_offload: bool
    optimizer_offload: bool
    use_ref: bool
    ref_param_offload: bool
    gradient_checkpointing: bool
    logprob_chunk_size: int
    update_tokens: int  # tokens per rank of one update micro-batch
    old_logprob_tokens: int  # ... of one old-log-prob micro-batch
    ref_logprob_tokens: int
    update_budget_key: str  # the key that bounds each of those micro-batches
    old_budget_key: str
    ref_budget_key: str
    step_impl: str
    device: str
    # Positions the LM head scores (response tokens); None = every token of the micro-batch (the GPU plan's
    # bound: a packed micro-batch may be all response). The padded CPU benchmark sets them.
    update_scored_tokens: Optional[int] = None
    logprob_scored_tokens: Optional[int] = None
    response_positions: Optional[int] = None  # padded rows x response width (full-logits path); None = tokens
    fsdp: bool = True  # False: one plain module (the CPU benchmark): no shards, no gathers
    # Why the actor keeps padded rows ("" = packed with flash-attn's varlen kernel; "auto": only when
    # flash-attn does not import on the workers), the update's dynamic budget (0 = fixed micro-batches) and its
    # rows per rank of one mini-batch.
    padded_attention: str = ""
    update_budget: int = 0
    update_mini_rows: int = 0
    # actor_rollout_ref.hybrid_engine=False: the engines have GPUs of their own (the rollout phase holds no actor
    # state, the trainer's phases no sleeping engine); set by from_sections, False for a hand-built plan.
    split_engines: bool = False
    # The actor's (and reference's) tensor- and pipeline-parallel degrees (memory_plan/layout.py); ``tp`` above is
    # the rollout engine's.
    actor_tp: int = 1
    # actor.sequence_parallel at actor_tp > 1: the residual stream (and the checkpointed layer inputs) is 1/tp per rank
    actor_tp_sequence_parallel: bool = False
    pp: int = 1
    pp_schedule: str = "1f1b"
    # The per-method fields (the rest of this class), set by method_extras.method_inputs.
    # A method's interleaved SFT stage: its own AdamW, tokens per rank of its micro-batch, its phase's name, the key
    # of its micro-batch and its moments' line
    sft_optimizer: bool = False
    sft_tokens: int = 0
    sft_stage_name: str = ""
    sft_budget_key: str = ""
    sft_moments: str = ""
    # A method's extra actor forward ("" = none): it runs through the old-log-prob pass, micro-batched by its keys.
    metric_pass: str = ""
    # A method's trajectory pool on the driver (host RAM, not a phase's line): what bounds it (memory_plan/host.py)
    replay_pool: Optional[ReplayPoolInputs] = None

    @property
    def max_len(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def shard_group(self) -> int:
        """FSDP's shard group: the dp ranks of the (dp, pp, tp) layout (all ranks without tp/pp), or HSDP's."""
        return self.world // (self.actor_tp * self.pp) if self.fsdp_size in (-1, 0, None) else int(self.fsdp_size)

    @classmethod
    def from_sections(cls, sections, device: str) -> "PlanInputs":
        """Read the run's ``ConfigSections`` (luffy_pool/config/sections.py); ``device`` is what the run computes on."""
        w, data, trainer = sections.workers, sections.data, sections.trainer
        actor, rollout, ref, model = w.actor, w.rollout, w.ref, w.model
        world, sp, n = trainer.nnodes * trainer.n_gpus_per_node, actor.ulysses_sequence_parallel_size, rollout.n
        actor_tp, pp = int(actor.tensor_model_parallel_size), int(actor.pipeline_model_parallel_size)
        dp = max(1, world // (sp * actor_tp * pp))  # the ranks of an SP / TP group and of a pipeline share rows
        width = data.max_prompt_length + data.max_response_length

        def tokens(dynamic: bool, budget: int, micro: Optional[int], micro_per_gpu: Optional[int] = None) -> int:
            # Dynamic: a micro-batch holds up to the budget per rank, but one row is never split (SP: 1/sp
            # of it per rank). Fixed: rows per rank x the padded width, 1/sp per rank.
            if dynamic:
                return max(budget, math.ceil(width / sp))
            rows = micro_per_gpu if micro_per_gpu else max(1, micro * n // dp)
            return math.ceil(rows * width / sp)

        pdtype = actor.fsdp_config.param_dtype
        pbytes = (2 if device == "cuda" else 4) if pdtype == "auto" else DTYPE_BYTES[pdtype]
        return cls(
            world=world,
            nodes=trainer.nnodes,
            fsdp_size=actor.fsdp_config.fsdp_size,
            sp=sp,
            tp=rollout.tensor_model_parallel_size,
            param_dtype_bytes=pbytes,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            max_num_seqs=rollout.max_num_seqs,
            enforce_eager=rollout.enforce_eager,
            free_cache_engine=rollout.free_cache_engine,
            rollout_dtype_bytes=DTYPE_BYTES.get(rollout.dtype, 2),  # auto: the model's dtype, bf16 for these models
            weight_sync_bucket_mb=rollout.weight_sync_bucket_mb,
            max_prompt_length=data.max_prompt_length,
            max_response_length=data.max_response_length,
            n=n,
            actor_param_offload=actor.fsdp_config.param_offload,
            optimizer_offload=actor.fsdp_config.optimizer_offload,
            use_ref=ref.use_ref,
            ref_param_offload=ref.fsdp_config.param_offload,
            gradient_checkpointing=model.enable_gradient_checkpointing,
            logprob_chunk_size=model.logprob_chunk_size,
            update_tokens=tokens(
                actor.use_dynamic_bsz,
                actor.ppo_max_token_len_per_gpu,
                actor.ppo_micro_batch_size,
                actor.ppo_micro_batch_size_per_gpu,
            ),
            old_logprob_tokens=tokens(
                rollout.log_prob_use_dynamic_bsz,
                rollout.log_prob_max_token_len_per_gpu,
                rollout.log_prob_micro_batch_size,
            ),
            # The reference pass uses the rollout's micro-batch rows (the worker copies them) and its own budget.
            ref_logprob_tokens=tokens(
                ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu, rollout.log_prob_micro_batch_size
            ),
            update_budget_key=f"{_A}.ppo_max_token_len_per_gpu"
            if actor.use_dynamic_bsz
            else f"{_A}.ppo_micro_batch_size",
            old_budget_key=(
                f"{_R}.log_prob_max_token_len_per_gpu"
                if rollout.log_prob_use_dynamic_bsz
                else f"{_R}.log_prob_micro_batch_size"
            ),
            ref_budget_key=(
                f"{_REF}.log_prob_max_token_len_per_gpu"
                if ref.log_prob_use_dynamic_bsz
                else f"{_R}.log_prob_micro_batch_size"
            ),
            step_impl=actor.optim.step_impl,
            device=device,
            padded_attention=_padded_attention(model.use_remove_padding, model.attn_implementation, device),
            update_budget=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else 0,
            update_mini_rows=max(1, actor.ppo_mini_batch_size * n // dp),
            split_engines=not w.hybrid_engine,
            actor_tp=actor_tp,
            actor_tp_sequence_parallel=actor_tp > 1 and bool(getattr(actor, "sequence_parallel", False)),
            pp=pp,
            pp_schedule=str(getattr(actor, "pipeline_schedule", "1f1b")),  # verl/utils/pipeline_parallel.py
            **method_inputs(sections, sp),
        )


def _padded_attention(use_remove_padding: bool, attn_implementation: str, device: str) -> str:
    """Why the actor's forward keeps padded rows (dp_actor packs only with a flash-attention varlen kernel)."""
    if not use_remove_padding:
        return f"{_M}.use_remove_padding=False"
    if attn_implementation == "auto":
        return "auto" if device == "cuda" else f"{_M}.attn_implementation=auto on {device} (sdpa)"
    if "flash" not in attn_implementation:
        return f"{_M}.attn_implementation={attn_implementation}"
    return ""


def padded_update_note(i: "PlanInputs") -> Optional[str]:
    """What the update costs at the padded width when remove-padding is off (sdpa / eager, or the key off):
    dynamic micro-batches then hold ``floor(budget / width)`` whole padded rows (dp_actor._micro_batches)."""
    if not i.padded_attention or not i.update_budget:
        return None
    width, budget = i.max_len, i.update_budget * i.sp
    rows = budget // width
    if i.padded_attention == "auto":
        head = (
            f"if flash-attn does not import on the workers, {_M}.attn_implementation=auto falls back to sdpa "
            "and remove-padding is off"
        )
    else:
        head = f"remove-padding is off ({i.padded_attention})"
    key = f"{_A}.ppo_max_token_len_per_gpu"
    # "refuse" marks a certain failure (memory_plan/__init__.over_budget_message stops the run on it).
    verdict = "the first update would stop on it" if i.padded_attention == "auto" else "the update refuses it"
    if rows < 1:
        return (
            f"{head}: one padded row is {width:,} positions > {key}={i.update_budget:,}"
            f"{f' x SP {i.sp}' if i.sp > 1 else ''}; {verdict} -> set {key}>={math.ceil(width / i.sp)}"
        )
    micro = math.ceil(i.update_mini_rows / rows)
    return (
        f"{head}: the update's dynamic micro-batches hold {rows} padded rows x {width:,} = {rows * width:,} "
        f"positions ({key}={i.update_budget:,}{f' x SP {i.sp}' if i.sp > 1 else ''}), {micro} forward/backward "
        f"passes per mini-batch of {i.update_mini_rows} rows per rank, each computing at the full width"
    )
