"""The lean static-KV decode loop: same tokens and log-probs as the generic HF loop on every supported layout."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers import Qwen3Config, Qwen3ForCausalLM

from verl.workers.rollout.base import SamplingSpec
from verl.workers.rollout.hf_rollout import HFRollout, inverse_cdf_sample
from verl.workers.rollout.kv_decoder import KVDecoder, supports
from tests.helpers.sections import engine_section

GREEDY = SamplingSpec(temperature=0.0, return_logprobs=True)
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=128)


def _models():
    torch.manual_seed(0)
    return {
        "qwen2_gqa": Qwen2ForCausalLM(Qwen2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2)),
        "llama_mqa": LlamaForCausalLM(LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=1)),
        "llama_mha_bias": LlamaForCausalLM(
            LlamaConfig(**SMALL, num_attention_heads=2, num_key_value_heads=2, attention_bias=True)
        ),
        "llama_mlp_bias": LlamaForCausalLM(
            LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2, mlp_bias=True)
        ),
        "qwen3_qk_norm": Qwen3ForCausalLM(
            Qwen3Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        ),
    }


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    base = [torch.randint(3, 60, (n,), generator=g).tolist() for n in (5, 11, 3, 8)]
    # Repeated prompts (a GRPO group) share one prefill; lengths differ so left padding is exercised.
    return [base[0], base[1], base[0], base[2], base[3], base[1], base[0]]


def _pair(model):
    return (
        HFRollout("unused", engine_section(hf_decoder="generic"), model=model),
        HFRollout("unused", engine_section(hf_decoder="kv"), model=model),
    )


@pytest.mark.parametrize("name", ["qwen2_gqa", "llama_mqa", "llama_mha_bias", "llama_mlp_bias", "qwen3_qk_norm"])
def test_greedy_tokens_and_logprobs_equal_the_generic_loop(models, prompts, name):
    generic, kv = _pair(models[name])
    assert kv.kv_decoder is not None and generic.kv_decoder is None
    caps = [9, 4, 12, 0, 7, 12, 1]
    spec = SamplingSpec(temperature=0.0, return_logprobs=True, ignore_eos=True)
    a = generic.generate_token_ids(prompts, caps, spec)
    b = kv.generate_token_ids(prompts, caps, spec)
    assert a.token_ids == b.token_ids
    assert [len(t) for t in b.token_ids] == caps
    for x, y in zip(a.logprobs, b.logprobs):
        assert torch.allclose(torch.as_tensor(x), torch.as_tensor(y), atol=1e-5)


@pytest.mark.parametrize("extra_eos", [False, True])  # one EOS id (compared directly) or several (isin)
def test_rows_stop_at_eos_and_leave_the_batch(models, prompts, extra_eos):
    generic, kv = _pair(models["qwen2_gqa"])
    full = generic.generate_token_ids(prompts, [10] * len(prompts), SamplingSpec(temperature=0.0, ignore_eos=True))
    stop = full.token_ids[1][3]
    for engine in (generic, kv):
        engine.eos_ids = {stop, 63} if extra_eos else {stop}
    a = generic.generate_token_ids(prompts, [10] * len(prompts), GREEDY)
    b = kv.generate_token_ids(prompts, [10] * len(prompts), GREEDY)
    assert a.token_ids == b.token_ids
    assert b.token_ids[1] == full.token_ids[1][:4]  # stops on and includes EOS
    assert any(len(t) == 10 for t in b.token_ids)  # other rows run on to the cap


def test_decode_needs_a_positive_cap_per_row(models, prompts):
    kv = HFRollout("unused", engine_section(hf_decoder="kv"), model=models["qwen2_gqa"])
    kv.kv_decoder.refresh(0)
    with pytest.raises(ValueError, match="every cap must be >= 1"):
        kv.kv_decoder.decode(
            prompts[:2], [3, 0], 0, torch.tensor([1]), False, lambda logits: (logits.argmax(-1), logits[:, 0])
        )


def test_weight_push_rebuilds_the_fused_projections(models, prompts):
    model = models["llama_mqa"]
    kv = HFRollout("unused", engine_section(hf_decoder="kv"), model=model)
    before = kv.generate_token_ids(prompts, [6] * len(prompts), GREEDY)
    torch.manual_seed(5)
    other = LlamaForCausalLM(model.config)
    kv.update_weights(other.state_dict().items())
    kv.after_weight_update()
    after = kv.generate_token_ids(prompts, [6] * len(prompts), GREEDY)
    reference = HFRollout("unused", engine_section(hf_decoder="generic"), model=other).generate_token_ids(
        prompts, [6] * len(prompts), GREEDY
    )
    assert after.token_ids == reference.token_ids != before.token_ids


def test_seeded_sampling_reproducible_and_logprobs_are_the_models(models, prompts):
    model = models["qwen2_gqa"]
    kv = HFRollout("unused", engine_section(hf_decoder="kv"), model=model)
    spec = SamplingSpec(temperature=0.8, seed=3, return_logprobs=True, ignore_eos=True)
    a = kv.generate_token_ids(prompts, [8] * len(prompts), spec)
    assert a.token_ids == kv.generate_token_ids(prompts, [8] * len(prompts), spec).token_ids
    for prompt, ids, lps in zip(prompts, a.token_ids, a.logprobs):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / 0.8
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        assert torch.allclose(torch.as_tensor(lps), ref, atol=1e-5)


def test_unsupported_layouts_are_named_and_auto_falls_back():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    ok, why = supports(gpt2)
    assert not ok and "gpt2" in why
    assert HFRollout("unused", engine_section(hf_decoder="auto"), model=gpt2).kv_decoder is None
    with pytest.raises(ValueError, match="hf_decoder=kv: model_type 'gpt2'"):
        HFRollout("unused", engine_section(hf_decoder="kv"), model=gpt2)
    with pytest.raises(ValueError, match="cannot drive"):
        KVDecoder(gpt2)
    with pytest.raises(ValueError, match="hf_decoder.*'fast'"):  # refused with the section, before any engine
        engine_section(hf_decoder="fast")


def test_inverse_cdf_sample_frequencies_and_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2]]).repeat(20000, 1) * 3.0  # unnormalised rows are fine
    ids = inverse_cdf_sample(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(ids, minlength=5).float() / ids.numel()
    assert counts[0] == 0 and counts[2] == 0
    assert torch.allclose(counts[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2]), atol=0.015)
    again = inverse_cdf_sample(probs, torch.Generator().manual_seed(0))
    assert torch.equal(ids, again)
    # A single surviving id (top-k 1 / greedy-like rows) is always drawn.
    one_hot = torch.zeros(50, 7)
    one_hot[:, 6] = 1.0
    assert (inverse_cdf_sample(one_hot, None) == 6).all()


def test_yaml_hf_keys_reach_the_engine_config():
    from luffy_pool.config.compose import rollout_section
    from verl.workers.rollout.config import engine_config

    cfg = engine_config(rollout_section(hf_micro_batch_size=7, hf_decoder="generic"))
    assert cfg.hf_micro_batch_size == 7 and cfg.hf_decoder == "generic"
    assert engine_config(rollout_section()).hf_decoder == "auto"  # the YAML's default
