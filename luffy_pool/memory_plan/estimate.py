"""Per-rank device memory of every phase of a LUFFY step, from the config and the model's shape.

``PlanInputs.from_sections(sections, device)`` reads the keys that drive memory; ``build_plan(inputs,
device_bytes)`` returns a ``Plan``: phases (rollout, the old and ref log-prob passes, the update's
forward/backward and its optimizer step), each a list of lines ``(what, bytes, config key)`` that add
up to the phase's peak on one rank. All ranks of this project's layout hold the same shards, so one
rank's table is every rank's.

Where the numbers come from:
- vLLM (rollout, ``engine_budget.py``): vLLM 0.32.0 ``vllm/v1/worker/utils.py`` ``request_memory`` (the engine takes
  ``ceil(gpu_memory_utilization x TOTAL device memory)``, and refuses to start when less than that is
  free) and ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory`` (KV cache = that request
  minus the non-KV memory the profile run measured: weights, activation peak at
  ``max_num_batched_tokens``, non-torch memory). The weights are exact; the activation peak and the
  non-torch part are estimates here, they only move bytes between the engine's lines, never its total.
  The CPU build sizes its KV cache from ``kv_cache_memory_bytes`` (``rollout.cpu_kv_cache_bytes``;
  vLLM's legacy ``VLLM_CPU_KVCACHE_SPACE`` GiB overrides it, ``vllm/platforms/cpu.py``).
- FSDP2 state: fp32 master parameters (the worker builds both actor and reference in fp32), fp32
  gradients, two fp32 AdamW moments, each sharded over the FSDP shard group (``fsdp_size``); with the actor's
  tensor / pipeline parallel layout, the rank's tp share of its stage over the dp ranks (``layout.py``, which also
  gives the gathered units, the activations per stage and the vocabulary split of the LM head).
- Activations: tensors autograd keeps per decoder layer of an HF Llama/Qwen2-style block (RMSNorm in
  fp32, q/k/v, rotary inputs, attention output, the four MLP tensors), at the micro-batch's tokens per
  rank; the LM head as ``verl/utils/chunked_logprobs.py`` allocates it (chunks) or as full logits
  (``activations.py``). The single-process CPU measurement in ``exp_scripts/bench_memory.py`` checks these lines.
- A method's extra passes and state (an SFT stage with its own optimizer, an extra actor forward, a host-side
  pool): ``method_extras.py``, the one place that names methods.
- AdamW's step: temporaries by ``optim.step_impl`` (foreach: one fp32 copy of the shard; for_loop: two
  of the largest tensor; fused: none).
- CUDA context: a fixed estimate (``CUDA_CONTEXT_BYTES``).
- NCCL: ``NCCL_BYTES_PER_COMMUNICATOR`` for each communicator the trainer side of a rank joins
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
from typing import Optional

from luffy_pool.memory_plan.activations import head_bytes, layer_saved_bytes, layer_working_bytes
from luffy_pool.memory_plan.engine_budget import vllm_budget
from luffy_pool.memory_plan.engine_side import receive_transient, vllm_tp_communicator_bytes, vllm_tp_communicator_what
from luffy_pool.memory_plan.host import replay_pool_line
from luffy_pool.memory_plan.layout import (
    in_flight,
    pp_micro_batches,
    rank_layer_params,
    rank_params,
    rank_root_params,
    tp_shape,
)
from luffy_pool.memory_plan.inputs import ACTOR_KEY, MODEL_KEY, REF_KEY, ROLLOUT_KEY, PlanInputs, padded_update_note
from luffy_pool.memory_plan.shapes import ModelShape

GiB = 2**30
# Estimates, not measurements: torch's CUDA context + cuBLAS/cuDNN workspaces per process (0.5-1 GiB on
# Hopper), and NCCL's buffers per communicator this rank joins.
CUDA_CONTEXT_BYTES = 1 * GiB
NCCL_BYTES_PER_COMMUNICATOR = 3 * GiB // 2  # H100 with NVLS, upper end (1.6 GB measured)
NCCL_BYTES_PER_COMMUNICATOR_NO_NVLS = 3 * GiB // 4  # A100 / NCCL_NVLS_ENABLE=0 (0.5-0.7 GB measured)
FRAGMENTATION_FRACTION = 0.03
HEADROOM_FRACTION = 0.05

_A, _R, _REF, _M = ACTOR_KEY, ROLLOUT_KEY, REF_KEY, MODEL_KEY


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


def _state_lines(
    i: PlanInputs, s: ModelShape, *, optimizer_on_device: bool, grads: bool, sft_on_device: Optional[bool] = None
) -> list[Line]:
    """``sft_on_device``: the SFT stage's AdamW moments (method_extras.py) on the device (None: as the RL
    optimizer's)."""
    f = i.shard_group if i.fsdp else 1
    # tp x pp: the rank's share of the largest stage (layout.py), then / f; the divisor in the line's text
    p = rank_params(s, i.actor_tp, i.pp)
    div = f"{f}" if (i.actor_tp, i.pp) == (1, 1) else f"(TP {i.actor_tp} x PP {i.pp} x FSDP {f})"
    lines = []
    if not i.actor_param_offload:
        lines.append(Line(f"actor fp32 params / {div} (FSDP shard)", 4 * p // f, f"{_A}.fsdp_config.param_offload"))
        if grads:
            lines.append(Line(f"actor fp32 grads / {div}", 4 * p // f, f"{_A}.fsdp_config.param_offload"))
        if optimizer_on_device:
            key = f"{_A}.fsdp_config.optimizer_offload"
            lines.append(Line(f"AdamW moments (2 x fp32) / {div}", 8 * p // f, key))
        if i.sft_optimizer and (optimizer_on_device if sft_on_device is None else sft_on_device):
            lines.append(Line(f"{i.sft_moments} / {div}", 8 * p // f, f"{_A}.fsdp_config.optimizer_offload"))
    if i.use_ref and not i.ref_param_offload:
        lines.append(Line(f"ref fp32 params / {div}", 4 * p // f, f"{_REF}.fsdp_config.param_offload"))
    return lines


def nccl_communicators(i: PlanInputs) -> list[str]:
    """The NCCL communicators the trainer side of one rank joins (vLLM's own are inside its budget)."""
    layered = i.actor_tp > 1 or i.pp > 1  # a (dp, pp, tp) mesh: FSDP on its dp groups, beside the world group
    names = (["world (FSDP)"] if not layered else ["world"]) if i.world > 1 else []
    if layered and i.shard_group > 1:
        names.append("FSDP dp group")
    if i.actor_tp > 1:
        names.append("actor TP")
    if i.pp > 1:  # send/recv with the previous and the next stage
        names += ["PP send/recv"] * min(2, i.pp - 1)
    if i.shard_group != i.world and not layered:
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
                f"{_R}.tensor_model_parallel_size / {_A}.ulysses_sequence_parallel_size / {_A}.*_model_parallel_size",
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
    root, layer = rank_root_params(s, i.actor_tp, i.pp), rank_layer_params(s, i.actor_tp)
    key = f"{_A}.fsdp_config.param_dtype"
    per_tp = f" (1/{i.actor_tp}: TP)" if i.actor_tp > 1 else ""
    lines = [
        Line(
            "unsharded root unit (embeddings + head)"
            + (f" (TP {i.actor_tp}, PP {i.pp})" if i.pp > 1 or per_tp else ""),
            root * a,
            key,
        ),
        Line(
            "unsharded decoder layers (current + prefetch)" + per_tp,
            2 * layer * a,
            f"{_A}.fsdp_config.reshard_after_forward",
        ),
    ]
    if grads:
        lines.append(
            Line(
                "unsharded grads of a layer + fp32 reduce copy" + per_tp,
                layer * (a + 4) + root * (a + 4) // 2,
                f"{_A}.fsdp_config.reduce_dtype",
            )
        )
    return lines


def _pp_lines(i: PlanInputs, s: ModelShape, tokens: int) -> list[Line]:
    """PP: the send and receive buffers of a micro-batch's hidden states between neighbouring stages."""
    if i.pp <= 1:
        return []
    nbytes = 2 * tokens * s.hidden_size * i.param_dtype_bytes
    return [
        Line(f"PP {i.pp}: hidden states sent + received, {tokens} tokens", nbytes, f"{_A}.pipeline_model_parallel_size")
    ]


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
    lines += _ulysses_lines(i, s, tokens) + _pp_lines(i, s, tokens)
    r = tp_shape(s, i.actor_tp)  # one tp rank's heads, MLP columns and vocabulary rows
    layer = tokens * layer_working_bytes(r, a)
    hb, what = head_bytes(
        r,
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
    """The RL update's phases, or with ``sft_stage`` a method's SFT stage's (method_extras.py; its optimizer on the
    device, the RL one's where offloading leaves it; fixed micro-batches of padded rows)."""
    a, t = i.param_dtype_bytes, (i.sft_tokens if sft_stage else i.update_tokens)
    offload = i.optimizer_offload
    state = (
        _state_lines(i, s, optimizer_on_device=not offload, grads=True, sft_on_device=True)
        if sft_stage
        else _state_lines(i, s, optimizer_on_device=True, grads=True, sft_on_device=not offload)
    )
    base = state + _runtime_lines(i) + _sleeping_engine(i, vb)
    name = i.sft_stage_name if sft_stage else "update"
    budget_key = i.sft_budget_key if sft_stage else i.update_budget_key
    scored = None if sft_stage else i.update_scored_tokens
    fb = list(base) + _gathered(i, s, grads=True)
    ck = f"{_M}.enable_gradient_checkpointing"
    r = tp_shape(s, i.actor_tp)  # one tp rank's heads, MLP columns and vocabulary rows
    saved, work = layer_saved_bytes(r, a), layer_working_bytes(r, a)
    # PP: a stage's layers x the micro-batches in flight on the first stage, by schedule (layout.py)
    m, L, of = in_flight(s, i.pp, i.pp_schedule, pp_micro_batches(i))
    if i.gradient_checkpointing:
        # sequence-parallel norms: each tp rank stores its 1/tp of every layer's input (sequence_parallel_norms.py)
        split = i.actor_tp if i.actor_tp_sequence_parallel else 1
        what = f"checkpointed layer inputs, {of} x {t} tokens" + (
            f" / {split} (sequence parallel)" if split > 1 else ""
        )
        fb.append(Line(what, m * L * -(-t // split) * a * s.hidden_size, ck))
        layer, layer_what = t * (saved + work), "one layer recomputed + its backward"
    else:
        fb.append(Line(f"saved activations, {of} x {t} tokens", m * L * t * saved, ck))
        layer, layer_what = t * work, "a layer's backward working set"
    fb.append(Line("embeddings + final norm (out, grad)", t * s.hidden_size * (3 * a + 4), budget_key))
    fb += _ulysses_lines(i, s, t) + _pp_lines(i, s, t)
    hb, what = head_bytes(
        r,
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
        p = rank_params(s, i.actor_tp, i.pp)
        largest = rank_root_params(s, i.actor_tp, 2)  # the larger end (embedding or head): the largest tensor
        temps = {"fused": 0, "for_loop": 2 * 4 * largest // f}.get(impl, 4 * p // f)
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
            - (4 * rank_params(s, i.actor_tp, i.pp) // i.shard_group if actor_on_gpu else 0)
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
