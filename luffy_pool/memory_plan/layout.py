"""The actor's parallel layout in the memory plan: what one rank holds at tensor parallel ``tp`` x pipeline parallel
``pp`` x FSDP over the ``dp`` ranks, and the smallest ``(tp, pp)`` that fits a device when the configured one does not.

- Tensor parallel (``verl/utils/tensor_parallel.py``, Megatron-LM's layout): q/k/v/gate/up split by columns and o/down
  by rows, so a decoder layer's weights and their q/k/v biases are 1/tp per rank; the norms (and Qwen3's q/k norms,
  an MoE router) are replicated. The LM head and the input embedding are split by vocabulary rows (a vocab-parallel
  lookup). Activations: each rank of a tp group holds the
  micro-batch's hidden states whole inside the attention and MLP, its heads and MLP columns only (1/tp), between them
  1/tp of the sequence with ``actor.sequence_parallel`` (the checkpointed layer inputs; else whole), and
  ``[tokens, V / tp]`` logits (``verl/utils/vocab_parallel.py``).
- Pipeline parallel: a stage holds ceil(layers / pp) decoder layers; the first stage the embedding, the last the head
  and the final norm (a tied head: its own copy of the embedding). 1F1B (Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §2.2.1) keeps the activations of up to pp
  micro-batches in flight on the first stage, so per rank (ceil(layers / pp) layers x pp micro-batches) the saved
  activations of a stage equal those of the whole model for one micro-batch; GPipe keeps every micro-batch of the
  mini-batch, interleaved 1F1B 3pp - 1 chunks of layers / 2pp (``in_flight``). The bound below counts the first
  stage's activations with the last stage's LM head.
- FSDP2 shards the rank's tp/pp share over ``dp = world / (tp x pp)`` ranks (HSDP and Ulysses SP do not combine with
  tp). So parameters, gradients and AdamW moments per rank are ``params / (tp x pp x dp_shard)`` up to the replicated
  parts; what tp/pp change is the gathered layers, the activations and the logits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from luffy_pool.memory_plan.shapes import ModelShape

# The model types the actor's tensor-parallel plan covers (verl/utils/tensor_parallel.py SUPPORTED, copied so the plan
# imports no torch; tests/luffy_pool/memory_plan/test_layout.py keeps the two equal). The layout search tries tp > 1
# only for these.
TP_FAMILIES = ("qwen2", "qwen3", "llama")


def _replicated_per_layer(s: ModelShape) -> int:
    """Parameters of a decoder layer every tp rank holds whole: two norms, q/k norms, an MoE router, row biases."""
    router = s.hidden_size * s.num_experts if s.moe_layers else 0
    return 2 * s.hidden_size + (2 * s.head_dim if s.qk_norm else 0) + router + (s.hidden_size if s.mlp_bias else 0)


def _ends(s: ModelShape, tp: int) -> tuple[int, int]:
    """(embedding, head + final norm) parameters on one tp rank."""
    head = math.ceil(s.embed_params / tp)
    return head, head + s.hidden_size  # tied or not, the input embedding is split by vocabulary rows too


def stage_layers(s: ModelShape, pp: int) -> int:
    """Decoder layers of the largest pipeline stage."""
    return math.ceil(s.num_hidden_layers / pp)


def rank_params(s: ModelShape, tp: int = 1, pp: int = 1) -> int:
    """Parameters of the largest pipeline stage on one tp rank (before FSDP shards them over dp); ``params`` at 1 x 1."""
    if tp == 1 and pp == 1:
        return s.params
    L = s.num_hidden_layers
    body = s.params - s.embed_params * (1 if s.tie_word_embeddings else 2) - s.hidden_size
    repl = L * _replicated_per_layer(s)
    layers = stage_layers(s, pp)
    stage_body = math.ceil((body - repl) * layers / (L * tp)) + repl * layers // L
    embed, head = _ends(s, tp)  # head: the vocab rows + the final norm (a tied head shares the embedding at pp 1)
    if pp == 1:
        return stage_body + embed + (s.hidden_size if s.tie_word_embeddings else head)
    return stage_body + max(embed, head)


def rank_layer_params(s: ModelShape, tp: int = 1) -> int:
    """Parameters of the largest decoder layer on one tp rank (what FSDP2 all-gathers over dp for it)."""
    repl = _replicated_per_layer(s)
    return math.ceil((s.layer_params - repl) / tp) + repl


def rank_root_params(s: ModelShape, tp: int = 1, pp: int = 1) -> int:
    """FSDP2's root unit (embedding, head) on one rank: both at pp 1, the larger end on a stage at pp > 1."""
    if tp == 1 and pp == 1:
        return s.embed_params * (1 if s.tie_word_embeddings else 2)
    embed, head = _ends(s, tp)
    if pp > 1:
        return max(embed, head - s.hidden_size)
    return embed if s.tie_word_embeddings else embed + head - s.hidden_size


def tp_shape(s: ModelShape, tp: int) -> ModelShape:
    """The shape one tp rank computes with: its heads, MLP columns and vocabulary rows (hidden size whole)."""
    if tp == 1:
        return s
    return dataclasses.replace(
        s,
        num_attention_heads=max(1, s.num_attention_heads // tp),
        num_key_value_heads=max(1, s.num_key_value_heads // tp),
        intermediate_size=math.ceil(s.intermediate_size / tp),
        moe_intermediate_size=math.ceil(s.moe_intermediate_size / tp),
        vocab_size=math.ceil(s.vocab_size / tp),
    )


def tp_allreduces_per_layer() -> dict:
    """All-reduces over the tp group of one decoder layer (Megatron-LM's layout, Shoeybi et al. 2019 §3): forward,
    after the two row-parallel projections (o_proj, down_proj); backward, one per column-parallel module's input
    gradient (transformers' plan keeps q, k, v, gate and up separate: five). Gradient checkpointing recomputes the
    forward inside backward (two more). ``exp_scripts/bench_memory.py --tp 2`` counts them."""
    return {"forward": 2, "backward": 5}


def in_flight(s: ModelShape, pp: int, schedule: str = "1f1b", micro_batches: int = 1) -> tuple[int, int, str]:
    """``(micro-batch chunks in flight, layers per chunk, description)`` on the first pipeline rank, whose activations
    it holds at once (``actor.pipeline_schedule``, verl/utils/pipeline_parallel.py; torch.distributed.pipelining's
    schedules). 1F1B: pp micro-batches of the stage's layers. Interleaved 1F1B (2 stages a rank of L / 2pp layers):
    torch's warm-up on rank 0, (2 - 1) x pp + 2 x (pp - 1) forwards, and the first steady one: 3pp - 1 chunks.
    GPipe: every micro-batch of the mini-batch (``micro_batches``, at least pp)."""
    if pp <= 1:
        return 1, s.num_hidden_layers, f"{s.num_hidden_layers} layers"
    if schedule == "interleaved_1f1b":
        n, layers = 3 * pp - 1, math.ceil(s.num_hidden_layers / (2 * pp))
        return n, layers, f"{layers} layers x {n} stage-chunks in flight (PP {pp}, interleaved 1F1B)"
    if schedule == "gpipe":
        n = max(pp, micro_batches)
        return n, stage_layers(s, pp), f"{stage_layers(s, pp)} layers x {n} micro-batches in flight (PP {pp}, GPipe)"
    return pp, stage_layers(s, pp), f"{stage_layers(s, pp)} layers x {pp} micro-batches in flight (PP {pp}, 1F1B)"


def pp_micro_batches(i) -> int:
    """Pipeline micro-batches of one update mini-batch (GPipe holds them all): its rows per rank at the full width
    over the update's token budget, at least pp."""
    per = max(1, i.update_tokens // max(1, i.max_len))
    return max(i.pp, math.ceil(i.update_mini_rows / per))


def layout_text(world: int, tp: int, pp: int, sp: int, shard: int) -> str:
    dp = world // max(1, tp * pp * sp)
    return f"actor TP {tp} x PP {pp} x DP {dp}" + (f" (SP {sp})" if sp > 1 else "") + f", FSDP shard group {shard}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(
    s: ModelShape, world: int, sp: int, fsdp_size: int, schedule: str = "1f1b"
) -> list[tuple[int, int]]:
    """Every ``(tp, pp)`` the same GPUs can hold, smallest tp x pp first (then less pp: fewer pipeline bubbles): tp
    divides the query and kv heads (a family with a tp plan only; not with SP or HSDP), pp the decoder layers."""
    tps = [1]
    if sp == 1 and fsdp_size in (-1, 0, None) and s.model_type in TP_FAMILIES:
        tps = divisors(math.gcd(s.num_attention_heads, s.num_key_value_heads))
    stages = 2 if schedule == "interleaved_1f1b" else 1  # stages a rank holds: their count divides the layers
    out = [
        (tp, pp)
        for tp in tps
        for pp in divisors(s.num_hidden_layers)
        if world % (tp * pp * sp) == 0 and (pp == 1 or s.num_hidden_layers % (stages * pp) == 0)
    ]
    return sorted(out, key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[1], tp_pp[0]))


def smallest_fitting_layout(plan, fits, build_plan) -> Optional[tuple[int, int, object]]:
    """``(tp, pp, plan)`` of the smallest layout whose plan ``fits`` (a predicate on a plan), None when none does;
    ``build_plan(inputs, shape, device_bytes)`` plans a layout (estimate.py, which imports this module)."""
    i, s = plan.inputs, plan.shape
    for tp, pp in candidate_layouts(s, i.world, i.sp, i.fsdp_size, i.pp_schedule):
        if (tp, pp) == (i.actor_tp, i.pp):
            continue
        trial = build_plan(dataclasses.replace(i, actor_tp=tp, pp=pp), s, plan.device_bytes)
        if fits(trial):
            return tp, pp, trial
    return None


def layout_lines(plan) -> list[str]:
    """The report's TP / PP / MoE lines (what one rank holds, what each degree divides)."""
    i, s = plan.inputs, plan.shape
    out = []
    if i.actor_tp > 1:
        r = tp_shape(s, i.actor_tp)
        out.append(
            f"TP {i.actor_tp}: per rank {r.num_attention_heads}/{s.num_attention_heads} heads, "
            f"{r.num_key_value_heads}/{s.num_key_value_heads} kv heads, MLP {r.intermediate_size}/{s.intermediate_size}, "
            f"LM head {r.vocab_size}/{s.vocab_size} vocabulary rows; a layer's weights "
            f"{rank_layer_params(s, i.actor_tp) / 1e6:.0f} M of {s.layer_params / 1e6:.0f} M (norms replicated); "
            "all-reduces per layer: {forward} forward, {backward} backward".format(**tp_allreduces_per_layer())
        )
    if i.pp == 1 and i.actor_tp > 1:
        out.append(f"PP 1: no pipeline stages (all {s.num_hidden_layers} layers, embedding and head on every rank)")
    if i.pp > 1:
        out.append(
            f"PP {i.pp}: a stage holds {stage_layers(s, i.pp)} of {s.num_hidden_layers} layers (+ embedding or head); "
            f"the first stage holds {in_flight(s, i.pp, i.pp_schedule, pp_micro_batches(i))[2]}"
        )
    if i.actor_tp > 1 or i.pp > 1:
        out.append(
            f"per rank: {rank_params(s, i.actor_tp, i.pp) / 1e9:.2f} B params of the largest stage's TP share, / "
            f"{i.shard_group} (FSDP) = {rank_params(s, i.actor_tp, i.pp) / i.shard_group / 1e9:.2f} B "
            f"(total / world = {s.params / i.world / 1e9:.2f} B)"
        )
    if s.num_experts:
        out.append(
            f"MoE memory: {s.params / 1e9:.2f} B params (every one of the {s.num_experts} experts of "
            f"{s.moe_layers} layers is held, sharded like the dense weights)"
        )
        out.append(
            f"MoE compute: {s.active_params / 1e9:.2f} B active params per token (top-{s.num_experts_per_tok} "
            "routed experts): ~6 x active FLOPs per trained token"
        )
    return out
