"""Model shapes from the published config.json files: parameter counts equal each model's published count
(tied heads have no separate lm_head weight; an MoE layer holds every expert; Llama has no qkv bias,
Qwen3 has q/k norms)."""

import os

import pytest

from luffy_pool.memory_plan.shapes import model_shape

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "data", "model_configs")
# The safetensors parameter counts of the checkpoints on the models' hub pages.
PUBLISHED = {
    "Qwen--Qwen2.5-Math-7B": 7_615_616_512,
    "Qwen--Qwen2.5-Math-1.5B": 1_543_714_304,  # tied: 1.78B - the 151936 x 1536 head
    "deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B": 1_777_088_000,  # same body, untied
    "meta-llama--Llama-3.1-8B": 8_030_261_248,
    "Qwen--Qwen3-8B-Base": 8_190_735_360,
    "Qwen--Qwen3-8B": 8_190_735_360,
    "Qwen--Qwen3-30B-A3B-Base": 30_532_122_624,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_the_published_one(name):
    assert model_shape(os.path.join(CONFIGS, name + ".json")).params == PUBLISHED[name]


def test_tied_head_counts_the_embedding_once():
    tied = model_shape(os.path.join(CONFIGS, "Qwen--Qwen2.5-Math-1.5B.json"))
    untied = model_shape(os.path.join(CONFIGS, "deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B.json"))
    assert tied.tie_word_embeddings and not untied.tie_word_embeddings
    assert untied.params - tied.params == 151936 * 1536 == tied.embed_params


def test_moe_counts_every_expert_and_the_routed_ones():
    s = model_shape(os.path.join(CONFIGS, "Qwen--Qwen3-30B-A3B-Base.json"))
    assert (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size, s.moe_layers) == (128, 8, 768, 48)
    # one layer: attention 2048x4096 q, 2x 2048x512 k/v, 4096x2048 o, q/k norms 2x128; 128 experts of
    # 3 x 2048 x 768; router 2048 x 128; two norms
    attn = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    assert s.layer_params == attn + 128 * 3 * 2048 * 768 + 2048 * 128 + 2 * 2048
    assert s.active_params == s.params - 48 * 120 * 3 * 2048 * 768  # ~3.35B active ("A3B")
    assert 3.3e9 < s.active_params < 3.4e9


def test_attention_biases_follow_the_architecture():
    llama = model_shape(os.path.join(CONFIGS, "meta-llama--Llama-3.1-8B.json"))
    qwen2 = model_shape(os.path.join(CONFIGS, "Qwen--Qwen2.5-Math-7B.json"))
    qwen3 = model_shape(os.path.join(CONFIGS, "Qwen--Qwen3-8B.json"))
    assert not llama.qkv_bias and qwen2.qkv_bias and not qwen3.qkv_bias and qwen3.qk_norm and not llama.qk_norm
