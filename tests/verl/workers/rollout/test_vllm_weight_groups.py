"""Bucket re-cutting for vLLM's layerwise reload: whole decoder layers per call, carried across buckets."""

import pytest
import torch

from verl.workers.rollout.vllm_rollout.weight_groups import LayerAlignedRegrouper, weight_group_key

T = torch.zeros(1)


@pytest.mark.parametrize(
    "name,key",
    [
        ("model.layers.3.self_attn.q_proj.weight", "model.layers.3"),
        ("model.layers.12.mlp.down_proj.weight", "model.layers.12"),
        ("transformer.h.0.attn.c_attn.weight", "transformer.h.0"),
        ("model.embed_tokens.weight", "model.embed_tokens"),
        ("model.norm.weight", "model.norm"),
        ("lm_head.weight", "lm_head"),
        ("scale", "scale"),
    ],
)
def test_group_key_is_the_decoder_layer_or_parent_module(name, key):
    assert weight_group_key(name) == key


def _names(pairs):
    return [n for n, _ in pairs]


def test_a_layer_split_across_buckets_is_released_whole_with_the_next_bucket():
    r = LayerAlignedRegrouper()
    first = r.add([("model.embed_tokens.weight", T), ("model.layers.0.q_proj.weight", T)])
    assert _names(first) == ["model.embed_tokens.weight"]  # layer 0 may continue in the next bucket
    second = r.add([("model.layers.0.k_proj.weight", T), ("model.layers.1.q_proj.weight", T)])
    assert _names(second) == ["model.layers.0.q_proj.weight", "model.layers.0.k_proj.weight"]
    assert _names(r.flush()) == ["model.layers.1.q_proj.weight"]
    assert r.flush() == []


def test_a_layer_arriving_again_after_release_is_rejected():
    r = LayerAlignedRegrouper()
    r.add([("model.layers.0.q_proj.weight", T), ("model.layers.1.q_proj.weight", T)])
    with pytest.raises(ValueError, match="model.layers.0"):
        r.add([("model.layers.0.k_proj.weight", T)])


def test_the_same_tensor_twice_in_one_sync_is_rejected_and_reset_starts_a_new_sync():
    r = LayerAlignedRegrouper()
    r.add([("lm_head.weight", T)])
    with pytest.raises(ValueError, match="pushed twice"):
        r.add([("lm_head.weight", T)])
    r.reset()
    assert r.add([("lm_head.weight", T)]) == [] and _names(r.flush()) == ["lm_head.weight"]
