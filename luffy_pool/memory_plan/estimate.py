"""Per-rank device memory of every phase of a LUFFY step, from the config and the model's shape.

``PlanInputs.from_sections(sections, device)`` reads the keys that drive memory; ``build_plan(inputs,
device_bytes)`` returns a ``Plan``: phases (rollout, the old and ref log-prob passes, the update's
forward/backward and its optimizer step), each a list of lines ``(what, bytes, config key)`` that add
up to the phase's peak on one rank. All ranks of this project's layout hold the same shards, so one
rank's table is every rank's.

Where the numbers come from:
- vLLM (rollout): vLLM 0.32.0 ``vllm/v1/worker/utils.py`` ``request_memory`` (the engine takes
  ``ceil(gpu_memory_utilization x TOTAL device memory)``, and refuses to start when less than that is
  free) and ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory`` (KV cache = that request
  minus the non-KV memory the profile run measured: weights, activation peak at
  ``max_num_batched_tokens``, non-torch memory). The weights are exact; the activation peak and the
  non-torch part are estimates here, they only move bytes between the engine's lines, never its total.
  The CPU build sizes its KV cache from ``kv_cache_memory_bytes`` (``rollout.cpu_kv_cache_bytes``;
  vLLM's legacy ``VLLM_CPU_KVCACHE_SPACE`` GiB overrides it, ``vllm/platforms/cpu.py``).
- FSDP2 state: fp32 master parameters (the worker builds both actor and reference in fp32), fp32
  gradients, two fp32 AdamW moments, each sharded over the FSDP shard group (``fsdp_size``).
- Activations: tensors autograd keeps per decoder layer of an HF Llama/Qwen2-style block (RMSNorm in
  fp32, q/k/v, rotary inputs, attention output, the four MLP tensors), at the micro-batch's tokens per
  rank; the LM head as ``verl/utils/chunked_logprobs.py`` allocates it (chunks) or as full logits.
  The single-process CPU measurement in ``exp_scripts/bench_memory.py`` checks these lines.
- ReLIFT (``algorithm.method=relift``): its SFT stage's own AdamW, two more fp32 moments per shard, on the device
  when ``optimizer_offload`` is off (both optimizers' moments in every phase), else only during its stage (then
  the RL moments are on the host); the stage's forward/backward at ``sft_micro_batch_size`` padded rows of
  prompt + demonstration (``rollout.max_prefix_len``) per rank.
- AdamW's step: temporaries by ``optim.step_impl`` (foreach: one fp32 copy of the shard; for_loop: two
  of the largest tensor; fused: none).
- CUDA context: a fixed estimate (``CUDA_CONTEXT_BYTES``).
- NCCL (REVIEW H3): ``NCCL_BYTES_PER_COMMUNICATOR`` for each communicator the trainer side of a rank joins
  (``nccl_communicators``: the world/FSDP group, HSDP's shard and replicate groups, Ulysses SP, the rollout TP
  group of ``tp_group.py``). Published measurements: 0.5-0.7 GB per communicator on A100, 1.1-1.6 GB on H100
  with NVLS (NVLink SHARP buffers); the default 1.5 GiB is the H100+NVLS upper end, 0.75 GiB when the plan's
  environment sets ``NCCL_NVLS_ENABLE=0``. vLLM's own TP communicator (and its symmetric-memory all-reduce buffer)
  is built *before* vLLM's start-up memory snapshot, so it lies outside ``gpu_memory_utilization``; it survives
  sleep, so it is a line of every phase on the engine's GPUs (``engine_side.py`` has the vLLM source lines).
- Split engines (``hybrid_engine=False``): the weight receive's transient instead of the hybrid push's two buckets
  (``engine_side.receive_transient``: flat buffers, clones and vLLM's materialised shard of the largest tensor).
- Allocator fragmentation: ``FRAGMENTATION_FRACTION`` of the trainer's tensors of a phase (reserved above
  allocated in torch's caching allocator; AdamW's lazily allocated state lands in freed activation segments).
  The launcher runs the workers with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (vLLM's advice; its
  sleep-mode pool turns the flag off around itself), which keeps it small; the 5 % headroom stays on top.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from luffy_pool.memory_plan.engine_side import receive_transient, vllm_tp_communicator_bytes, vllm_tp_communicator_what
from luffy_pool.memory_plan.graph_pool import engine_graph_pool_bytes
from luffy_pool.memory_plan.host import ReplayPoolInputs, replay_pool_line
from luffy_pool.memory_plan.shapes import ModelShape

GiB = 2**30
# Estimates, not measurements: torch's CUDA context + cuBLAS/cuDNN workspaces per process (0.5-1 GiB on
# Hopper), and NCCL's buffers per communicator this rank joins.
CUDA_CONTEXT_BYTES = 1 * GiB
NCCL_BYTES_PER_COMMUNICATOR = 3 * GiB // 2  # H100 with NVLS, upper end (1.6 GB measured)
NCCL_BYTES_PER_COMMUNICATOR_NO_NVLS = 3 * GiB // 4  # A100 / NCCL_NVLS_ENABLE=0 (0.5-0.7 GB measured)
FRAGMENTATION_FRACTION = 0.03
# vLLM's non-torch memory during its profile run (its CUDA-graph pool: memory_plan/graph_pool.py).
VLLM_NON_TORCH_BYTES = GiB // 2
HEADROOM_FRACTION = 0.05
DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp32": 4, "float32": 4, "float": 4}

_A, _R, _REF, _M = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)


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
    # REVIEW H1: why the actor keeps padded rows ("" = packed with flash-attn's varlen kernel; "auto": only when
    # flash-attn does not import on the workers), the update's dynamic budget (0 = fixed micro-batches) and its
    # rows per rank of one mini-batch.
    padded_attention: str = ""
    update_budget: int = 0
    update_mini_rows: int = 0
    # ReLIFT's interleaved SFT stage: its own AdamW (0 tokens = no such stage) and tokens per rank of its micro-batch
    sft_optimizer: bool = False
    sft_tokens: int = 0
    # actor_rollout_ref.hybrid_engine=False: the engines have GPUs of their own (the rollout phase holds no actor
    # state, the trainer's phases no sleeping engine); set by from_sections, False for a hand-built plan.
    split_engines: bool = False
    # A method's extra actor forward ("" = none): ExGRPO's trajectory metric (entropy or log-probs of the stored
    # trajectories of the replayed questions) runs through the old-log-prob pass, micro-batched by its keys.
    metric_pass: str = ""
    # ExGRPO's experience pool on the driver (host RAM, not a phase's line): what bounds it (memory_plan/host.py)
    replay_pool: Optional[ReplayPoolInputs] = None

    @property
    def max_len(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def shard_group(self) -> int:
        return self.world if self.fsdp_size in (-1, 0, None) else int(self.fsdp_size)

    @classmethod
    def from_sections(cls, sections, device: str) -> "PlanInputs":
        """Read the run's ``ConfigSections`` (luffy_pool/config/sections.py); ``device`` is what the run computes on."""
        w, data, trainer = sections.workers, sections.data, sections.trainer
        actor, rollout, ref, model = w.actor, w.rollout, w.ref, w.model
        world, sp, n = trainer.nnodes * trainer.n_gpus_per_node, actor.ulysses_sequence_parallel_size, rollout.n
        dp = max(1, world // sp)
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
            metric_pass=_metric_pass(sections.algorithm),
            replay_pool=ReplayPoolInputs.from_sections(sections),
            **_sft_stage(sections, sp),
        )


def _sft_stage(sections, sp: int) -> dict:
    """ReLIFT's SFT stage: its optimizer, and its micro-batch (padded prompt + demonstration rows) per rank."""
    relift = getattr(sections.algorithm, "relift", None)
    if sections.algorithm.method != "relift" or relift is None or relift.sft_data_size == -1:
        return {}
    width = sections.data.max_prompt_length + sections.workers.rollout.max_prefix_len
    return {"sft_optimizer": True, "sft_tokens": math.ceil(relift.sft_micro_batch_size * width / sp)}


def _metric_pass(algorithm) -> str:
    """The name of the method's extra actor forward, "" when it has none."""
    if algorithm.method == "exgrpo" and algorithm.exgrpo.traj_metric != "random":
        return f"log-prob: ExGRPO trajectory {algorithm.exgrpo.traj_metric} (actor)"
    return ""


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
    """H1: what the update costs at the padded width when remove-padding is off (sdpa / eager, or the key off):
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


@dataclasses.dataclass
class Line:
    what: str
    bytes: int
    key: str


@dataclasses.dataclass
class Phase:
    name: str
    lines: list[Line]

    @property
    def total(self) -> int:
        return sum(line.bytes for line in self.lines)


@dataclasses.dataclass
class Plan:
    inputs: PlanInputs
    shape: ModelShape
    phases: list[Phase]
    device_bytes: Optional[int]
    kv_cache_bytes: int = 0
    kv_cache_tokens: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    host_lines: list[Line] = dataclasses.field(default_factory=list)  # the driver's RAM, not the device's

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def over(self, headroom: float = 0.0) -> list[Phase]:
        """Phases whose peak leaves less than ``headroom`` (a fraction) of the device's memory free."""
        if not self.device_bytes:
            return []
        return [p for p in self.phases if p.total > self.device_bytes * (1 - headroom)]


# ---------------------------------------------------------------------- activation model
def layer_saved_bytes(s: ModelShape, a: int) -> int:
    """Bytes per token autograd keeps for one decoder layer (Llama/Qwen2 block, flash/sdpa attention)."""
    h, hd = s.hidden_size, s.head_dim
    q, kv = s.num_attention_heads * hd, s.num_key_value_heads * hd
    norms = 2 * (4 * h + a * h)  # RMSNorm: fp32 input copy + normalised output in compute dtype
    attn = a * ((q + kv) + (q + 2 * kv) + q)  # pre-rotary q/k, q/k/v into attention, attention output
    mlp = 4 * a * s.intermediate_size  # gate, act(gate), up, act*up
    return norms + attn + mlp


def layer_working_bytes(s: ModelShape, a: int) -> int:
    """Bytes per token live inside one layer's forward without autograd (MLP tensors + residual + norm)."""
    return a * (3 * s.intermediate_size + 2 * s.hidden_size) + 4 * s.hidden_size


def head_bytes(
    s: ModelShape,
    tokens: int,
    chunk: int,
    a: int,
    backward: bool,
    positions: Optional[int] = None,
    response_positions: Optional[int] = None,
) -> tuple[int, str]:
    """(peak bytes, description) of the LM head scoring ``tokens`` response tokens of a ``positions``-token
    micro-batch. dp_actor keeps full logits while the micro-batch is no larger than one chunk; full logits
    cover every position (``[positions, V]`` in the compute dtype), then ``response_positions`` of them go
    through fp32 log_softmax, exp and their product (``torch_functional.logprobs_and_entropy_from_logits``)."""
    v, h = s.vocab_size, s.hidden_size
    positions = positions or tokens
    cast = 4 if a != 4 else 0  # the bf16 matmul output is cast to a separate fp32 buffer
    if 0 < chunk < positions:
        if not backward:  # fp32 logits + the softmax of the entropy term ([chunk, V] each), hidden gathered
            return a * tokens * h + 8 * chunk * v, f"LM head in chunks of {chunk} tokens"
        # Three [chunk, V] fp32 buffers (recomputed logits, exp, and a third measured on CPU: the transposed
        # operand of grad_z.t() @ h) + the bf16 copy of grad_z; dW summed in fp32 over several bf16 chunks.
        dw = 4 * v * h if (a != 4 and tokens > chunk) else 0
        return 2 * a * tokens * h + chunk * v * (
            12 + (a if a != 4 else 0)
        ) + dw, f"LM head backward in chunks of {chunk} tokens"
    # Forward's transients (logits, log_softmax, exp, their product) are the head's peak in the update too: its
    # backward holds fewer [r, V] buffers at once (checked by bench_memory.py --predict at 2 x 512 positions).
    r = response_positions or tokens
    return positions * v * a + r * v * (cast + 12), f"full [{positions}, {v}] logits"


# ---------------------------------------------------------------------- phases
def vllm_budget(i: PlanInputs, s: ModelShape, total: int) -> dict:
    """vLLM 0.32's split of ``ceil(util x total)`` (vllm/v1/worker/utils.py request_memory)."""
    requested = math.ceil(total * i.gpu_memory_utilization)
    weights = s.params * i.rollout_dtype_bytes // i.tp
    h, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    # profile_run: one forward of max_num_batched_tokens (per-layer working set) + the sampler on max_num_seqs rows.
    act = (
        i.max_num_batched_tokens
        * i.rollout_dtype_bytes
        * (2 * h + (q + 2 * kv) // i.tp + 2 * s.intermediate_size // i.tp)
    )
    act += min(i.max_num_seqs, i.max_num_batched_tokens) * s.vocab_size * 4 * 2
    graphs = engine_graph_pool_bytes(i, s)  # 0 with enforce_eager (memory_plan/graph_pool.py)
    non_torch = VLLM_NON_TORCH_BYTES + graphs
    kv_bytes = requested - weights - act - non_torch
    return dict(
        requested=requested,
        weights=weights,
        activation=act,
        non_torch=non_torch,
        graphs=graphs,
        kv=kv_bytes,
        kv_tokens=kv_cache_tokens(s, kv_bytes, i.rollout_dtype_bytes, i.tp),
    )


def kv_cache_tokens(s: ModelShape, kv_bytes: int, dtype_bytes: int, tp: int = 1, block_size: int = 16) -> int:
    """Tokens a vLLM KV cache of ``kv_bytes`` holds: whole blocks of ``block_size`` tokens, each block holding K
    and V of every layer (vllm/v1/core/kv_cache_utils.py: num_blocks = available // (page size x layers))."""
    per_block = block_size * s.kv_bytes_per_token(dtype_bytes, tp)
    return max(0, kv_bytes) // per_block * block_size


def cpu_kv_cache_bytes(cpu_kv_cache_bytes_key: int, environ=None) -> int:
    """The CPU build's KV cache size: ``rollout.cpu_kv_cache_bytes`` (passed as ``kv_cache_memory_bytes``), unless
    the legacy ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is set (vllm/platforms/cpu.py overrides it then)."""
    import os

    env = os.environ if environ is None else environ
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    return int(space) * GiB if space != "" else int(cpu_kv_cache_bytes_key)


def _state_lines(
    i: PlanInputs, s: ModelShape, *, optimizer_on_device: bool, grads: bool, sft_on_device: Optional[bool] = None
) -> list[Line]:
    """``sft_on_device``: ReLIFT's SFT AdamW moments on the device (None: as the RL optimizer's)."""
    f = i.shard_group if i.fsdp else 1
    lines = []
    if not i.actor_param_offload:
        lines.append(
            Line(f"actor fp32 params / {f} (FSDP shard)", 4 * s.params // f, f"{_A}.fsdp_config.param_offload")
        )
        if grads:
            lines.append(Line(f"actor fp32 grads / {f}", 4 * s.params // f, f"{_A}.fsdp_config.param_offload"))
        if optimizer_on_device:
            key = f"{_A}.fsdp_config.optimizer_offload"
            lines.append(Line(f"AdamW moments (2 x fp32) / {f}", 8 * s.params // f, key))
        if i.sft_optimizer and (optimizer_on_device if sft_on_device is None else sft_on_device):
            lines.append(
                Line(
                    f"ReLIFT SFT AdamW moments (2 x fp32) / {f}",
                    8 * s.params // f,
                    f"{_A}.fsdp_config.optimizer_offload",
                )
            )
    if i.use_ref and not i.ref_param_offload:
        lines.append(Line(f"ref fp32 params / {f}", 4 * s.params // f, f"{_REF}.fsdp_config.param_offload"))
    return lines


def nccl_communicators(i: PlanInputs) -> list[str]:
    """The NCCL communicators the trainer side of one rank joins (vLLM's own are inside its budget)."""
    names = ["world (FSDP)"] if i.world > 1 else []
    if i.shard_group != i.world:
        names += ["HSDP shard", "HSDP replicate"]
    if i.sp > 1:
        names.append("Ulysses SP")
    if i.tp > 1 and not i.split_engines:
        names.append("rollout TP (weight sync, prompts)")
    if i.split_engines:
        names.append("weight group (rank 0 -> engines)")
    return names


def nccl_bytes_per_communicator(environ=None) -> int:
    import os

    env = os.environ if environ is None else environ
    return (
        NCCL_BYTES_PER_COMMUNICATOR_NO_NVLS if env.get("NCCL_NVLS_ENABLE", "") == "0" else NCCL_BYTES_PER_COMMUNICATOR
    )


def _runtime_lines(i: PlanInputs) -> list[Line]:
    if i.device != "cuda":
        return []
    comms, per = nccl_communicators(i), nccl_bytes_per_communicator()
    lines = [Line("CUDA context + workspaces (estimate)", CUDA_CONTEXT_BYTES, "-")]
    if comms:
        lines.append(
            Line(
                f"NCCL, {len(comms)} communicator(s) x {per / GiB:.2f} GiB: {', '.join(comms)} (estimate)",
                len(comms) * per,
                f"{_R}.tensor_model_parallel_size / {_A}.ulysses_sequence_parallel_size",
            )
        )
    if not i.split_engines:  # the colocated engine's communicator stays on this GPU in every phase
        lines += vllm_tp_lines(i)
    return lines


def vllm_tp_lines(i: PlanInputs) -> list[Line]:
    """vLLM's own TP communicator on an engine's GPU, outside ``gpu_memory_utilization`` (engine_side.py)."""
    per = nccl_bytes_per_communicator()
    nbytes = vllm_tp_communicator_bytes(i.tp, per)
    return [Line(vllm_tp_communicator_what(i.tp, per), nbytes, f"{_R}.tensor_model_parallel_size")] if nbytes else []


def _fragmentation(i: PlanInputs, lines: list[Line]) -> list[Line]:
    """The caching allocator's margin over the trainer's tensors of a phase (not vLLM's pool, not fixed costs)."""
    if i.device != "cuda":
        return []
    torch_bytes = sum(ln.bytes for ln in lines if not ln.what.startswith(("vLLM", "CUDA", "NCCL")))
    return [
        Line(
            f"allocator fragmentation margin ({FRAGMENTATION_FRACTION:.0%} of the trainer's tensors, "
            "expandable_segments)",
            int(FRAGMENTATION_FRACTION * torch_bytes),
            "-",
        )
    ]


def _sleeping_engine(i: PlanInputs, vb: Optional[dict]) -> list[Line]:
    if vb is None:
        return []
    if not i.free_cache_engine:
        return [Line("vLLM engine awake (weights + KV, not released)", vb["requested"], f"{_R}.free_cache_engine")]
    if not i.enforce_eager:
        return [Line("vLLM CUDA graphs kept while asleep (estimate)", vb["graphs"], f"{_R}.enforce_eager")]
    return []


def _gathered(i: PlanInputs, s: ModelShape, grads: bool) -> list[Line]:
    """FSDP2 all-gathered blocks: the root unit (embeddings, head) for the whole pass, the current and the
    prefetched decoder layer; in backward a layer's unsharded grads and their fp32 reduce-scatter copy."""
    if not i.fsdp:
        return []
    a = i.param_dtype_bytes
    root = s.embed_params * (1 if s.tie_word_embeddings else 2)
    key = f"{_A}.fsdp_config.param_dtype"
    lines = [
        Line("unsharded root unit (embeddings + head)", root * a, key),
        Line(
            "unsharded decoder layers (current + prefetch)",
            2 * s.layer_params * a,
            f"{_A}.fsdp_config.reshard_after_forward",
        ),
    ]
    if grads:
        lines.append(
            Line(
                "unsharded grads of a layer + fp32 reduce copy",
                s.layer_params * (a + 4) + root * (a + 4) // 2,
                f"{_A}.fsdp_config.reduce_dtype",
            )
        )
    return lines


def _ulysses_lines(i: PlanInputs, s: ModelShape, tokens: int) -> list[Line]:
    """Ulysses SP: the all-to-all's send and receive buffers of q, k, v and the attention output of one layer
    (ulysses_forward.py; each rank holds all positions of 1/sp of the heads inside attention)."""
    if i.sp <= 1:
        return []
    hd = s.head_dim
    width = (2 * s.num_attention_heads + 2 * s.num_key_value_heads) * hd
    return [
        Line(
            f"Ulysses all-to-all buffers (SP {i.sp})",
            2 * tokens * i.param_dtype_bytes * width,
            f"{_A}.ulysses_sequence_parallel_size",
        )
    ]


def logprob_phase(i: PlanInputs, s: ModelShape, name: str, tokens: int, budget_key: str, vb: Optional[dict]) -> Phase:
    a = i.param_dtype_bytes
    lines = _state_lines(i, s, optimizer_on_device=not i.optimizer_offload, grads=False)
    lines += _runtime_lines(i) + _sleeping_engine(i, vb) + _gathered(i, s, grads=False)
    sp = f" (SP {i.sp}: 1/{i.sp} of each row per rank)" if i.sp > 1 else ""
    h = s.hidden_size
    lines.append(Line(f"hidden states in/out, {tokens} tokens/rank{sp}", 2 * tokens * a * h, budget_key))
    lines += _ulysses_lines(i, s, tokens)
    layer = tokens * layer_working_bytes(s, a)
    hb, what = head_bytes(
        s,
        i.logprob_scored_tokens or tokens,
        i.logprob_chunk_size,
        a,
        backward=False,
        positions=tokens,
        response_positions=i.response_positions,
    )
    # A layer's working set is freed before the head runs: the larger of the two is the pass's peak.
    if hb >= layer:
        lines.append(Line(f"{what} (> one layer's working set, {layer / GiB:.2f} GiB)", hb, f"{_M}.logprob_chunk_size"))
    else:
        lines.append(Line(f"one layer's working set (> {what}, {hb / GiB:.2f} GiB)", layer, budget_key))
    return Phase(name, lines + _fragmentation(i, lines))


def update_phases(i: PlanInputs, s: ModelShape, vb: Optional[dict], sft_stage: bool = False) -> list[Phase]:
    """The RL update's phases, or with ``sft_stage`` ReLIFT's SFT stage's (its optimizer on the device, the RL
    one's where offloading leaves it; fixed micro-batches of padded rows)."""
    a, t = i.param_dtype_bytes, (i.sft_tokens if sft_stage else i.update_tokens)
    offload = i.optimizer_offload
    state = (
        _state_lines(i, s, optimizer_on_device=not offload, grads=True, sft_on_device=True)
        if sft_stage
        else _state_lines(i, s, optimizer_on_device=True, grads=True, sft_on_device=not offload)
    )
    base = state + _runtime_lines(i) + _sleeping_engine(i, vb)
    name = "ReLIFT SFT stage" if sft_stage else "update"
    budget_key = "algorithm.relift.sft_micro_batch_size" if sft_stage else i.update_budget_key
    scored = None if sft_stage else i.update_scored_tokens
    fb = list(base) + _gathered(i, s, grads=True)
    ck = f"{_M}.enable_gradient_checkpointing"
    saved, work = layer_saved_bytes(s, a), layer_working_bytes(s, a)
    L = s.num_hidden_layers
    if i.gradient_checkpointing:
        fb.append(Line(f"checkpointed layer inputs, {L} x {t} tokens", L * t * a * s.hidden_size, ck))
        layer, layer_what = t * (saved + work), "one layer recomputed + its backward"
    else:
        fb.append(Line(f"saved activations, {L} layers x {t} tokens", L * t * saved, ck))
        layer, layer_what = t * work, "a layer's backward working set"
    fb.append(Line("embeddings + final norm (out, grad)", t * s.hidden_size * (3 * a + 4), budget_key))
    fb += _ulysses_lines(i, s, t)
    hb, what = head_bytes(
        s,
        scored or t,
        i.logprob_chunk_size,
        a,
        backward=True,
        positions=t,
        response_positions=None if sft_stage else i.response_positions,
    )
    # Backward runs the head first, then the layers one by one: the larger transient is the peak.
    if hb >= layer:
        fb.append(Line(f"{what} (> {layer_what}, {layer / GiB:.2f} GiB)", hb, f"{_M}.logprob_chunk_size"))
    else:
        fb.append(Line(f"{layer_what} (> {what}, {hb / GiB:.2f} GiB)", layer, ck))
    phases = [Phase(f"{name}: forward/backward", fb + _fragmentation(i, fb))]
    if not i.actor_param_offload:  # with param_offload AdamW steps on the host
        f = i.shard_group if i.fsdp else 1
        impl = i.step_impl if i.step_impl != "auto" else ("foreach" if i.device == "cuda" else "fused")
        # foreach: _foreach_sqrt of every second moment (one fp32 copy of the shard); for_loop: per tensor, the
        # sqrt and its division by the bias correction (two fp32 copies of the largest, the embedding); fused: none.
        temps = {"fused": 0, "for_loop": 2 * 4 * s.embed_params // f}.get(impl, 4 * s.params // f)
        step = list(base) + [Line(f"AdamW step temporaries ({impl})", temps, f"{_A}.optim.step_impl")]
        phases.append(Phase(f"{name}: optimizer step", step + _fragmentation(i, step)))
    return phases


def _weight_sync_line(i: PlanInputs, s: ModelShape) -> Line:
    """The colocated push's two buckets, or a split engine's receive transient (engine_side.receive_transient)."""
    bucket, key = i.weight_sync_bucket_mb * 2**20, f"{_R}.weight_sync_bucket_mb"
    if not i.split_engines:
        return Line("actor -> engine weight-sync bucket", 2 * bucket, key)
    nbytes, what = receive_transient(s, i.param_dtype_bytes, i.rollout_dtype_bytes, i.tp, bucket)
    return Line(what, nbytes, key)


def build_plan(i: PlanInputs, s: ModelShape, device_bytes: Optional[int]) -> Plan:
    """Every phase of a step on one rank; ``device_bytes`` is the device's total memory (None: unknown)."""
    notes = []
    vb = None
    phases = []
    if i.device == "cuda":
        total = device_bytes or 80 * GiB
        vb = vllm_budget(i, s, total)
        if i.split_engines:  # an engine's own GPU: no actor shards; its communicators are TP and the weight group
            rollout = [Line("CUDA context + workspaces (estimate)", CUDA_CONTEXT_BYTES, "-")]
            comms = (i.tp > 1) + 1
            rollout.append(
                Line(
                    f"NCCL, {comms} communicator(s): weight group{', rollout TP' if i.tp > 1 else ''} (estimate)",
                    comms * nccl_bytes_per_communicator(),
                    f"{_R}.tensor_model_parallel_size",
                )
            )
            rollout += vllm_tp_lines(i)
        else:
            rollout = _state_lines(i, s, optimizer_on_device=not i.optimizer_offload, grads=False) + _runtime_lines(i)
        ukey = f"{_R}.gpu_memory_utilization"
        rollout += [
            Line(f"vLLM weights / TP {i.tp}", vb["weights"], f"{_R}.tensor_model_parallel_size"),
            Line(
                f"vLLM activation peak at {i.max_num_batched_tokens} batched tokens (estimate)",
                vb["activation"],
                f"{_R}.max_num_batched_tokens",
            ),
            Line("vLLM non-torch + CUDA graphs (estimate)", vb["non_torch"], f"{_R}.enforce_eager"),
            Line(f"vLLM KV cache = {i.gpu_memory_utilization} x total - the lines above", max(0, vb["kv"]), ukey),
            _weight_sync_line(i, s),
        ]
        phases.append(
            Phase(
                "rollout (vLLM awake)" + (", its own GPUs" if i.split_engines else ""),
                rollout + _fragmentation(i, rollout),
            )
        )
        per_token = s.kv_bytes_per_token(i.rollout_dtype_bytes, i.tp)
        if vb["kv"] < i.max_len * per_token:
            notes.append(
                f"vLLM: KV cache {vb['kv'] / GiB:.2f} GiB holds {vb['kv_tokens']} tokens < one "
                f"{i.max_len}-token sequence; vLLM refuses to start -> raise {ukey}"
            )
        # At engine start the actor's fp32 shards are already on the device (built first in init_model).
        actor_on_gpu = not (i.actor_param_offload or i.split_engines)
        # vLLM's TP communicator is built before its start-up check (engine_side.py): it is not free either.
        free_at_start = (
            total
            - (4 * s.params // i.shard_group if actor_on_gpu else 0)
            - CUDA_CONTEXT_BYTES
            - vllm_tp_communicator_bytes(i.tp, nccl_bytes_per_communicator())
        )
        if free_at_start < vb["requested"]:
            notes.append(
                f"vLLM start: {free_at_start / GiB:.1f} GiB free < {ukey} x total = {vb['requested'] / GiB:.1f} "
                f"GiB; vLLM 0.32 raises 'Free memory on device ... less than desired'"
            )
    if i.split_engines:
        vb_trainer = None  # the trainer's GPUs hold no engine
    else:
        vb_trainer = vb
    padded = padded_update_note(i)
    if padded and "refuses" in padded:  # a certain failure; the other cases are an information line (report.render)
        notes.append(padded)
    phases.append(logprob_phase(i, s, "log-prob: old (actor)", i.old_logprob_tokens, i.old_budget_key, vb_trainer))
    if i.use_ref:
        phases.append(logprob_phase(i, s, "log-prob: ref", i.ref_logprob_tokens, i.ref_budget_key, vb_trainer))
    if i.metric_pass:  # same pass and micro-batches as the old log-probs (prompt + trajectory rows of width P + L)
        phases.append(logprob_phase(i, s, i.metric_pass, i.old_logprob_tokens, i.old_budget_key, vb_trainer))
    phases += update_phases(i, s, vb_trainer)
    if i.sft_optimizer:
        phases += update_phases(i, s, vb_trainer, sft_stage=True)
    pool = replay_pool_line(i.replay_pool)
    plan = Plan(i, s, phases, device_bytes, notes=notes, host_lines=[Line(*pool)] if pool else [])
    if vb is not None:
        plan.kv_cache_bytes, plan.kv_cache_tokens = vb["kv"], vb["kv_tokens"]
    return plan
