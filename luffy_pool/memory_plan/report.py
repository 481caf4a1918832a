"""The plan as a table, and the one or two config changes that bring an over-budget phase under.

``render(plan)`` prints per rank: each phase's total and its lines (GiB, what, the key that drives it),
then the peak, the device's memory and the headroom; the KV cache in tokens against the sequences that can be
live at once (``kv_demand_line``). ``suggestions(plan)`` tries single key changes
(lower ``gpu_memory_utilization``, optimizer / parameter offload, a smaller token budget, the chunked LM
head, gradient checkpointing) on the plan's own inputs and returns those after which every phase that
was over fits with the 5 % margin, as ``key=value`` overrides.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from luffy_pool.memory_plan.layout import layout_lines
from luffy_pool.memory_plan.estimate import GiB, HEADROOM_FRACTION, Plan, build_plan, padded_update_note

_A, _R, _REF, _M = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)


def gib(n: int) -> str:
    return f"{n / GiB:7.2f}"


def rollout_rows_per_engine(sections) -> int:
    """Sequences one vLLM engine generates per training step: ``train_batch_size x n`` over the engines (each
    of the world / TP engines generates the prompts of its TP group); ``sections`` is the run's ConfigSections."""
    rollout, trainer = sections.workers.rollout, sections.trainer
    ranks = sections.workers.rollout_world_size or trainer.nnodes * trainer.n_gpus_per_node  # split engines: their own
    engines = max(1, ranks // rollout.tensor_model_parallel_size)
    return math.ceil(sections.data.train_batch_size * rollout.n / engines)


def kv_demand_line(plan: Plan, rows_per_engine: Optional[int] = None) -> Optional[str]:
    """H10: the KV cache (tokens) against what can be live at once, ``min(max_num_seqs, the step's rows per engine)``
    sequences of the full prompt + response length. Over the cache vLLM preempts and recomputes: slower, not fatal."""
    i = plan.inputs
    if not plan.kv_cache_tokens:
        return None
    live = i.max_num_seqs if rows_per_engine is None else min(i.max_num_seqs, rows_per_engine)
    why = (
        f"max_num_seqs {i.max_num_seqs}"
        if rows_per_engine is None
        else f"min(max_num_seqs {i.max_num_seqs}, {rows_per_engine} rollout rows per engine)"
    )
    demand = live * i.max_len
    ratio = demand / plan.kv_cache_tokens
    verdict = (
        "fits"
        if demand <= plan.kv_cache_tokens
        else (
            f"{ratio:.1f}x the cache: at most {plan.kv_cache_tokens // max(1, i.max_len)} run at full length, vLLM "
            "preempts and recomputes the rest (slower, not fatal)"
        )
    )
    return (
        f"vLLM KV demand: {live} live sequences ({why}) x {i.max_len:,} tokens = {demand:,} tokens vs "
        f"{plan.kv_cache_tokens:,} in the cache: {verdict}"
    )


def render(plan: Plan, title: str = "", rows_per_engine: Optional[int] = None) -> str:
    i, s = plan.inputs, plan.shape
    out = []
    if title:
        out.append(title)
    out.append(
        f"model: {s.params / 1e9:.2f} B params, {s.num_hidden_layers} layers, hidden {s.hidden_size}, "
        f"vocab {s.vocab_size} ({s.source})"
    )
    out.append(
        f"layout: {i.world} ranks ({i.nodes} node(s)), FSDP shard group {i.shard_group}, Ulysses SP {i.sp}, "
        f"vLLM TP {i.tp}, actor TP {i.actor_tp}, PP {i.pp}; per rank "
        + ("(every rank holds the same shares)" if i.pp == 1 else "(the largest pipeline stage)")
    )
    out += layout_lines(plan)
    width = max(len(line.what) for p in plan.phases for line in p.lines) + 2
    out.append(f"{'phase / line':<{width + 2}}{'GiB':>7}  config key")
    for phase in plan.phases:
        out.append(f"{phase.name:<{width + 2}}{gib(phase.total)}")
        for line in phase.lines:
            out.append(f"  {line.what:<{width}}{gib(line.bytes)}  {line.key}")
    for line in plan.host_lines:
        out.append(f"driver host RAM: {line.what}: {line.bytes / GiB:.2f} GiB ({line.key})")
    if plan.kv_cache_bytes:
        out.append(
            f"vLLM KV cache holds {plan.kv_cache_tokens:,} tokens per engine "
            f"({plan.kv_cache_tokens // max(1, i.max_len)} full {i.max_len}-token sequences)"
        )
        demand = kv_demand_line(plan, rows_per_engine)
        if demand:  # None when the cache holds no token (an engine that refuses to start: its note says so)
            out.append(demand)
    padded = padded_update_note(i)
    if padded and padded not in plan.notes:
        out.append(f"attention: {padded}")
    out += [f"note: {n}" for n in plan.notes]
    peak = plan.peak
    out.append(f"peak: {peak.name} {peak.total / GiB:.2f} GiB")
    if plan.device_bytes:
        room = plan.device_bytes - peak.total
        out.append(f"device memory: {plan.device_bytes / GiB:.2f} GiB")
        flag = (
            ""
            if room >= HEADROOM_FRACTION * plan.device_bytes
            else f"  <-- under the {HEADROOM_FRACTION:.0%} margin"
            if room >= 0
            else "  <-- DOES NOT FIT"
        )
        out.append(f"headroom: {room / GiB:.2f} GiB ({room / plan.device_bytes:.1%}){flag}")
    return "\n".join(out)


def _fits(plan: Plan, names: set[str]) -> bool:
    limit = plan.device_bytes * (1 - HEADROOM_FRACTION)
    return all(p.total <= limit for p in plan.phases if p.name in names) and not plan.notes


def _candidates(plan: Plan, phase: str):
    """(field changes, override text) to try for ``phase``, cheapest first."""
    i = plan.inputs
    cands = []
    if phase.startswith("rollout") and any("refuses" in n for n in plan.notes):  # KV cache too small: raise it
        for step in range(math.floor(i.gpu_memory_utilization * 20) + 1, 20):
            cands.append(({"gpu_memory_utilization": step / 20}, f"{_R}.gpu_memory_utilization={step / 20:.2f}"))
    elif phase.startswith("rollout"):
        over = plan.phase(phase).total - plan.device_bytes * (1 - HEADROOM_FRACTION)
        util = math.floor((i.gpu_memory_utilization - over / plan.device_bytes) * 20) / 20  # a multiple of 0.05
        if 0.05 <= util < i.gpu_memory_utilization:
            cands.append(({"gpu_memory_utilization": util}, f"{_R}.gpu_memory_utilization={util:.2f}"))
    if not i.optimizer_offload and not phase.startswith("update"):
        cands.append(({"optimizer_offload": True}, f"{_A}.fsdp_config.optimizer_offload=True"))
    if i.use_ref and not i.ref_param_offload:
        cands.append(({"ref_param_offload": True}, f"{_REF}.fsdp_config.param_offload=True"))
    if i.logprob_chunk_size == 0 and not phase.startswith("rollout"):
        cands.append(({"logprob_chunk_size": 1024}, f"{_M}.logprob_chunk_size=1024"))
    floor = math.ceil(i.max_len / i.sp)  # a row is never split: a smaller budget changes nothing
    field, key = (
        ("update_tokens", i.update_budget_key)
        if phase.startswith("update")
        else ("ref_logprob_tokens", i.ref_budget_key)
        if phase.startswith("log-prob: ref")
        else ("old_logprob_tokens", i.old_budget_key)
        if phase.startswith("log-prob")
        else (None, "")
    )
    if field and key.endswith("max_token_len_per_gpu"):
        value = getattr(i, field) // 2
        while value >= floor:
            cands.append(({field: value}, f"{key}={value}"))
            value //= 2
    if phase.startswith("update") and not i.gradient_checkpointing:
        cands.append(({"gradient_checkpointing": True}, f"{_M}.enable_gradient_checkpointing=True"))
    if phase.startswith("update") and not i.actor_param_offload:
        cands.append(({"actor_param_offload": True}, f"{_A}.fsdp_config.param_offload=True"))
    return cands


def suggestions(plan: Plan, limit: int = 2) -> list[str]:
    """Up to ``limit`` single overrides, each bringing every over-budget phase under the margin."""
    if not plan.device_bytes:
        return []
    over = {p.name for p in plan.over(HEADROOM_FRACTION)}
    if plan.notes:  # vLLM would refuse to start: the rollout phase's keys
        over.add(plan.phases[0].name)
    found: list[str] = []
    tried = set()
    for name in sorted(over):
        for change, text in _candidates(plan, name):
            if text in tried:
                continue
            tried.add(text)
            trial = build_plan(dataclasses.replace(plan.inputs, **change), plan.shape, plan.device_bytes)
            if _fits(trial, over):
                found.append(text)
                break  # the smallest change of this kind; then another kind
        if len(found) >= limit:
            break
    if len(found) < limit:  # a second, different remedy for the first phase
        for name in sorted(over):
            for change, text in _candidates(plan, name):
                if text in found or any(text.split("=")[0] == f.split("=")[0] for f in found):
                    continue
                trial = build_plan(dataclasses.replace(plan.inputs, **change), plan.shape, plan.device_bytes)
                if _fits(trial, over):
                    found.append(text)
                    break
            if len(found) >= limit:
                break
    return found[:limit]


def markdown_table(rows: list[tuple[str, str, int, Plan]]) -> str:
    """``(recipe, gpu label, nodes, plan)`` rows -> docs/memory.md's table of each phase's peak and headroom (GiB)."""
    names = [p.name for p in rows[0][3].phases]
    head = "| recipe | GPU | nodes | " + " | ".join(names) + " | headroom |"
    out = [head, "|" + "---|" * (4 + len(names))]
    for recipe, gpu, nodes, plan in rows:
        room = plan.device_bytes - plan.peak.total
        cells = [f"{p.total / GiB:.1f}" for p in plan.phases]
        out.append(
            f"| {recipe} | {gpu} ({plan.device_bytes / GiB:.1f} GiB) | {nodes} | "
            + " | ".join(cells)
            + f" | {room / GiB:.1f} ({room / plan.device_bytes:.0%}) |"
        )
    return "\n".join(out)
