"""The memory plan per actor layout (luffy_pool/memory_plan/layout.py): what one rank holds at tensor parallel tp x
pipeline parallel pp x FSDP over dp, the activations per stage under 1F1B, the LM head's vocabulary split, the
communicators, and the smallest (tp, pp) that fits when the configured layout does not. Hand-computed values."""

from __future__ import annotations

import dataclasses
import os

from luffy_pool.memory_plan.estimate import GiB, build_plan, nccl_communicators
from luffy_pool.memory_plan.layout import (
    candidate_layouts,
    rank_layer_params,
    rank_params,
    rank_root_params,
    smallest_fitting_layout,
    tp_shape,
)
from luffy_pool.memory_plan.shapes import model_shape

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "data", "model_configs")
Q32 = model_shape(os.path.join(CONFIGS, "config_only", "Qwen--Qwen2.5-32B.json"))
MOE = model_shape(os.path.join(CONFIGS, "Qwen--Qwen3-30B-A3B-Base.json"))
H, L, V = 5120, 64, 152064


def _inputs(**changes):
    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.sections import ConfigSections
    from luffy_pool.memory_plan.inputs import PlanInputs

    sections = ConfigSections.from_config(compose_config(["actor_rollout_ref.model.path=m"]))
    return dataclasses.replace(PlanInputs.from_sections(sections, device="cuda"), **changes)


def test_published_32b_count_and_one_rank_share_per_layout():
    assert Q32.params == 32_763_876_352  # the safetensors count of the checkpoint (Qwen2.5-32B architecture)
    assert rank_params(Q32, 1, 1) == Q32.params
    # tp splits every layer's weights and q/k/v biases and the head's and the input embedding's vocabulary rows; the
    # two norms of each layer and the final norm stay whole on every tp rank
    replicated = L * 2 * H + H
    for tp in (2, 4, 8):
        assert abs(tp * rank_params(Q32, tp, 1) - (tp - 1) * replicated - Q32.params) < tp
    # pp 2: 32 of 64 layers, and the larger end (the embedding on the first stage; head + final norm on the last)
    body = Q32.params - 2 * V * H - H
    assert rank_params(Q32, 1, 2) == body // 2 + V * H + H
    # tp 4 x pp 2: a quarter of 32 layers' split weights + their norms, and the larger end: a quarter of the head + the
    # final norm (the first stage's embedding is a quarter too)
    split = body - L * 2 * H
    assert abs(rank_params(Q32, 4, 2) - (split // 8 + 32 * 2 * H + V * H // 4 + H)) <= 1


def test_gathered_units_and_the_shape_one_tp_rank_computes_with():
    assert rank_layer_params(Q32, 1) == Q32.layer_params
    assert rank_layer_params(Q32, 4) == (Q32.layer_params - 2 * H) // 4 + 2 * H
    assert rank_root_params(Q32, 1, 1) == 2 * V * H  # embedding + untied head
    assert rank_root_params(Q32, 4, 1) == 2 * (V * H // 4)  # the head and the embedding split by vocabulary rows
    assert rank_root_params(Q32, 4, 2) == V * H // 4  # a stage holds one end, a quarter of its vocabulary rows
    r = tp_shape(Q32, 4)
    assert (r.num_attention_heads, r.num_key_value_heads, r.intermediate_size, r.vocab_size) == (10, 2, 6912, 38016)
    assert r.hidden_size == H  # hidden states stay whole (no sequence parallel)


def test_state_lines_divide_by_tp_pp_and_the_fsdp_group():
    i = _inputs(world=16, nodes=2, actor_tp=4, pp=2)
    assert i.shard_group == 2
    plan = build_plan(i, Q32, int(79.2 * GiB))
    update = plan.phase("update: forward/backward")
    params = next(ln for ln in update.lines if ln.what.startswith("actor fp32 params"))
    moments = next(ln for ln in update.lines if ln.what.startswith("AdamW moments"))
    assert params.what == "actor fp32 params / (TP 4 x PP 2 x FSDP 2) (FSDP shard)"
    assert params.bytes == 4 * rank_params(Q32, 4, 2) // 2 and moments.bytes == 2 * params.bytes
    # without tp / pp the same 16 ranks shard all parameters: the same total per rank up to the replicated parts
    flat = build_plan(_inputs(world=16, nodes=2), Q32, int(79.2 * GiB)).phase("update: forward/backward")
    flat_params = next(ln for ln in flat.lines if ln.what.startswith("actor fp32 params"))
    assert flat_params.bytes == 4 * Q32.params // 16 < params.bytes < 1.2 * flat_params.bytes


def test_1f1b_keeps_pp_micro_batches_of_a_stages_layers_and_tp_splits_the_head():
    i = _inputs(world=16, nodes=2, gradient_checkpointing=True, update_tokens=8192)
    t, a = 8192, i.param_dtype_bytes

    def line(plan, start):
        return next(ln for ln in plan.phase("update: forward/backward").lines if ln.what.startswith(start))

    one = build_plan(i, Q32, None)
    pp4 = build_plan(dataclasses.replace(i, pp=4), Q32, None)
    assert line(one, "checkpointed").bytes == L * t * a * H
    ck = line(pp4, "checkpointed")  # 16 layers a stage x 4 micro-batches in flight on the first stage
    assert ck.bytes == 4 * 16 * t * a * H and "16 layers x 4 micro-batches in flight (PP 4, 1F1B)" in ck.what
    assert line(pp4, "PP 4: hidden states sent + received").bytes == 2 * t * H * a
    # the LM head's chunks at tp 4: a quarter of the vocabulary per [chunk, V] buffer
    lp = dataclasses.replace(i, logprob_chunk_size=1024, old_logprob_tokens=t)
    head = [
        ln.bytes
        for tp in (1, 4)
        for ln in build_plan(dataclasses.replace(lp, actor_tp=tp), Q32, None).phase("log-prob: old (actor)").lines
        if "LM head" in ln.what or "working set" in ln.what
    ]
    assert head[1] < head[0]


def test_sequence_parallel_norms_store_a_tp_ranks_share_of_each_layer_input():
    i = _inputs(world=16, nodes=2, gradient_checkpointing=True, update_tokens=8192, actor_tp=4)
    t, a = 8192, i.param_dtype_bytes

    def checkpointed(inputs):
        plan = build_plan(inputs, Q32, None)
        return next(ln for ln in plan.phase("update: forward/backward").lines if ln.what.startswith("checkpointed"))

    whole = checkpointed(dataclasses.replace(i, actor_tp_sequence_parallel=False))
    split = checkpointed(dataclasses.replace(i, actor_tp_sequence_parallel=True))
    assert whole.bytes == L * t * a * H and split.bytes == L * (t // 4) * a * H
    assert split.what.endswith("/ 4 (sequence parallel)")
    # the YAML's default turns it on wherever tp > 1
    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.sections import ConfigSections
    from luffy_pool.memory_plan.inputs import PlanInputs

    cfg = compose_config(["actor_rollout_ref.model.path=m", "actor_rollout_ref.actor.tensor_model_parallel_size=2"])
    assert PlanInputs.from_sections(ConfigSections.from_config(cfg), device="cuda").actor_tp_sequence_parallel


def test_communicators_of_a_tp_pp_rank():
    assert nccl_communicators(_inputs(world=16, tp=2, actor_tp=4, pp=2)) == [
        "world",
        "FSDP dp group",
        "actor TP",
        "PP send/recv",
        "rollout TP (weight sync, prompts)",
    ]
    assert nccl_communicators(_inputs(world=16, tp=2, actor_tp=1, pp=4))[:4] == [
        "world",
        "FSDP dp group",
        "PP send/recv",
        "PP send/recv",
    ]
    assert nccl_communicators(_inputs(world=16, tp=2)) == ["world (FSDP)", "rollout TP (weight sync, prompts)"]


def test_layout_search_tries_divisors_of_kv_heads_and_layers_smallest_first():
    lay = candidate_layouts(Q32, 16, 1, -1)
    assert lay[:4] == [(1, 1), (2, 1), (1, 2), (4, 1)]  # tp x pp ascending, less pp first
    assert {tp for tp, _ in lay} == {1, 2, 4, 8} and {pp for _, pp in lay} == {1, 2, 4, 8, 16}
    assert all(16 % (tp * pp) == 0 and L % pp == 0 for tp, pp in lay)
    assert {tp for tp, _ in candidate_layouts(MOE, 16, 1, -1)} == {1}  # no tensor-parallel plan for qwen3_moe
    assert {tp for tp, _ in candidate_layouts(Q32, 16, 2, -1)} == {1}  # TP does not combine with Ulysses SP


def test_smallest_fitting_layout_is_the_first_candidate_that_fits():
    plan = build_plan(_inputs(world=16, nodes=2, update_tokens=32768), Q32, int(79.2 * GiB))
    tried = []

    def fits(trial):
        tried.append((trial.inputs.actor_tp, trial.inputs.pp))
        return trial.inputs.actor_tp * trial.inputs.pp >= 4

    tp, pp, trial = smallest_fitting_layout(plan, fits, build_plan)
    assert (tp, pp) == (4, 1) and tried == [(2, 1), (1, 2), (4, 1)] and trial.inputs.shard_group == 4
    assert smallest_fitting_layout(plan, lambda trial: False, build_plan) is None


def test_the_plans_tp_families_are_the_actors():
    from luffy_pool.memory_plan.layout import TP_FAMILIES
    from verl.utils.tensor_parallel import SUPPORTED

    assert set(TP_FAMILIES) == set(SUPPORTED)  # the plan's copy (it imports no torch) of the actor's TP plans


def test_in_flight_activations_by_pipeline_schedule():
    from luffy_pool.memory_plan.layout import in_flight

    assert in_flight(Q32, 1)[:2] == (1, 64)
    assert in_flight(Q32, 4, "1f1b")[:2] == (4, 16)  # 4 x 16 = 64 layer activations: the unpipelined model's
    assert in_flight(Q32, 4, "interleaved_1f1b")[:2] == (11, 8)  # rank 0: 4 + 2 x 3 warm-up forwards + 1; 8 layers
    assert in_flight(Q32, 4, "gpipe", micro_batches=16)[:2] == (16, 16) and in_flight(Q32, 4, "gpipe")[0] == 4
    assert all(64 % (2 * pp) == 0 for _, pp in candidate_layouts(Q32, 16, 1, -1, "interleaved_1f1b") if pp > 1)
