"""The model matrix, in process: each published config.json LUFFY users train, shrunk (sizes only), through
the actor's log-prob pass and one update, the HF rollout's decoder against transformers' generate, the
chunked LM head against full logits, and meta-device init + shard load against from_pretrained.

What differs between these models (tied embeddings, Llama-3.1's llama3 rope scaling, Qwen3's q/k norms,
Qwen2's qkv biases, head_dim apart from hidden/heads, MoE experts) is exactly what the tiny Qwen2 of
the other tests never exercises.
"""

import json
import os

import pytest
import torch
from luffy_pool.config.compose import actor_config, rollout_section
from luffy_pool.tiny import TinyModelSpec, build_tiny_model

from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.rollout.base import SamplingSpec
from verl.workers.rollout.hf_rollout import HFRollout

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "data", "model_configs")
# Qwen3-4B-Base: tied embeddings with q/k norms, and hidden (2560) != heads x head_dim (32 x 128)
DENSE = [
    "Qwen--Qwen2.5-Math-7B",
    "Qwen--Qwen2.5-Math-1.5B",
    "meta-llama--Llama-3.1-8B",
    "Qwen--Qwen3-8B-Base",
    "deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B",
    "Qwen--Qwen3-8B",
    "Qwen--Qwen3-4B-Base",
]
MOE = "Qwen--Qwen3-30B-A3B-Base"
ALL = DENSE + [MOE]


def _real(name):
    with open(os.path.join(CONFIGS, name + ".json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build_tiny_model(
                str(tmp_path_factory.mktemp(name.replace(".", "_"))),
                TinyModelSpec(num_key_value_heads=2),
                model_config=_real(name),
            )
        return cache[name]

    return get


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


@pytest.mark.parametrize("name", ALL)
def test_shrunk_model_keeps_the_real_architecture(model_dirs, name):
    from safetensors import safe_open
    from transformers import AutoConfig

    real, path = _real(name), model_dirs(name)
    cfg = AutoConfig.from_pretrained(path)
    with open(os.path.join(path, "tiny_config_record.json")) as f:
        record = json.load(f)
    assert cfg.model_type == real["model_type"] and cfg.architectures == real["architectures"]
    assert cfg.tie_word_embeddings == real["tie_word_embeddings"]
    assert cfg.rope_parameters["rope_theta"] == real["rope_theta"]
    for key, value in (real.get("rope_scaling") or {}).items():  # Llama-3.1: llama3 type, factor 8, 8192 original
        assert cfg.rope_parameters[key] == value, key
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert cfg.num_hidden_layers == 2 and head_dim == 32 and cfg.num_key_value_heads == 2
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.rms_norm_eps == real["rms_norm_eps"] and cfg.hidden_act == real["hidden_act"]
    if "use_sliding_window" in real:
        assert cfg.use_sliding_window == real["use_sliding_window"]
    assert (cfg.bos_token_id == cfg.eos_token_id) == (real["bos_token_id"] == real["eos_token_id"])
    assert {"tie_word_embeddings", "rope_theta", "model_type"} <= set(record["kept"])
    assert record["shrunk"]["num_hidden_layers"] == [real["num_hidden_layers"], 2]
    model = _load(path)
    if real["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    # the memory plan's shape of the same config.json counts exactly the model's parameters
    from luffy_pool.memory_plan.shapes import model_shape

    assert model_shape(path).params == sum(p.numel() for p in model.parameters())
    attn = model.model.layers[0].self_attn
    assert hasattr(attn, "q_norm") == real["model_type"].startswith("qwen3")
    assert (attn.q_proj.bias is not None) == (real["model_type"] == "qwen2")  # Qwen2's qkv bias
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:  # a bf16 checkpoint, as published
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        assert ("lm_head.weight" in f.keys()) != real["tie_word_embeddings"]


def test_llama3_rope_scaling_is_live():
    """The llama3 rope type changes the tiny model's frequencies (head_dim 32 has wavelengths > 8192 / 1)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    real = _real("meta-llama--Llama-3.1-8B")
    from luffy_pool.tiny.model_config import shrink_config

    tiny, _ = shrink_config(real, 2, 64, [2, 0, 1])
    fields = {k: v for k, v in tiny.items() if k != "model_type"}
    scaled = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **fields))
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **dict(fields, rope_scaling=None)))
    a, b = scaled.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq
    assert torch.equal(a[:4], b[:4]) and not torch.allclose(a[-4:], b[-4:])


def _prompts(vocab):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (7, 4, 9)]


def _generate(model, prompts, new):
    """transformers' greedy generate, one prompt at a time (no padding question), with its scores."""
    ids, lps = [], []
    for p in prompts:
        out = model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
        )
        toks = out.sequences[0, len(p) :]
        ids.append(toks.tolist())
        lps.append([float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, toks)])
    return ids, lps


@pytest.mark.parametrize("name", ALL)
def test_rollout_decoder_greedy_equals_transformers_generate(model_dirs, name):
    model = _load(model_dirs(name))
    engine = HFRollout("unused", rollout_section(hf_decoder="auto"), model=model)
    from verl.workers.rollout.kv_decoder import supports

    ok, why = supports(model)
    if name == MOE:  # experts are not the Llama MLP the lean loop fuses: the generic loop decodes, with the reason
        assert not ok and "qwen3_moe" in why and engine.kv_decoder is None
    else:
        assert ok, why
        assert engine.kv_decoder is not None
    prompts = _prompts(model.config.vocab_size)
    out = engine.generate_token_ids(
        prompts, [10] * 3, SamplingSpec(temperature=0.0, return_logprobs=True, ignore_eos=True)
    )
    ref_ids, ref_lps = _generate(model, prompts, 10)
    assert out.token_ids == ref_ids
    for a, b in zip(out.logprobs, ref_lps):
        assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-4)


def test_sliding_window_model_falls_back_to_the_generic_loop_with_the_reason():
    """Mistral applies ``sliding_window`` without a use_sliding_window switch: the lean loop (full attention)
    must not drive it; the generic loop then equals generate past the window."""
    from transformers import MistralConfig, MistralForCausalLM

    from verl.workers.rollout.kv_decoder import supports

    torch.manual_seed(0)
    model = MistralForCausalLM(
        MistralConfig(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=4,
        )
    ).eval()
    ok, why = supports(model)
    assert not ok and why == "sliding-window attention (sliding_window=4)"
    engine = HFRollout("unused", rollout_section(hf_decoder="auto"), model=model)
    assert engine.kv_decoder is None
    prompts = _prompts(64)
    out = engine.generate_token_ids(
        prompts, [10] * 3, SamplingSpec(temperature=0.0, return_logprobs=True, ignore_eos=True)
    )
    assert out.token_ids == _generate(model, prompts, 10)[0]


def _batch(vocab, rows=4, prompt=5, resp=6):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + resp), generator=g)
    attn = torch.ones(rows, prompt + resp, dtype=torch.long)
    attn[0, :2] = 0
    attn[1, -2:] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "responses": ids[:, prompt:]}


def _cfg():
    return actor_config(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size=2,
        use_dynamic_bsz=False,
        ppo_epochs=1,
        ppo_max_token_len_per_gpu=64,
        grad_clip=1e9,
        use_kl_loss=False,
    )


@pytest.mark.parametrize("name", ALL)
def test_actor_log_probs_and_one_update(model_dirs, name):
    model = _load(model_dirs(name))
    b = _batch(model.config.vocab_size)
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    direct = torch.log_softmax(logits[:, -7:-1].float(), -1).gather(-1, b["responses"][..., None])[..., 0]
    optim = torch.optim.SGD(model.parameters(), lr=0.5)
    actor = DataParallelPPOActor(_cfg(), model, optim, logprob_chunk_size=0)
    data = DataProto.from_dict(
        tensors=b, meta_info={"temperature": 1.0, "micro_batch_size": 2, "use_dynamic_bsz": False}
    )
    lp, _ = actor.compute_log_prob(data)
    mask = b["attention_mask"][:, -6:].bool()
    assert torch.allclose(lp[mask], direct[mask], atol=1e-5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(-1, 6).contiguous()
    metrics = actor.update_policy(
        DataProto.from_dict(tensors={**b, "old_log_probs": lp, "advantages": adv}, meta_info={"temperature": 1.0})
    )
    assert all(torch.isfinite(torch.tensor(v)).all() for k, v in metrics.items() if k.startswith("actor/"))
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "model.embed_tokens.weight" in moved and "model.layers.1.self_attn.o_proj.weight" in moved
    if model.config.tie_word_embeddings:  # one shared tensor, updated once by both uses' gradients
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert "lm_head.weight" in moved


@pytest.mark.parametrize("name", ALL)
def test_chunked_head_equals_full_logits(model_dirs, name):
    model = _load(model_dirs(name))
    b = _batch(model.config.vocab_size)
    mask = b["attention_mask"][:, -6:].bool()
    results = []
    for chunk in (4, 0):  # 4 tokens per chunk (the response head), 0 = the dense [rows, width, V] logits
        model.zero_grad()
        actor = DataParallelPPOActor(_cfg(), model, logprob_chunk_size=chunk)
        ent, lp = actor._forward_micro_batch(b, 0.8, calculate_entropy=True)
        (lp[mask].sum() + 0.3 * ent[mask].sum()).backward()
        head_grad = model.get_output_embeddings().weight.grad.clone()  # tied: embedding + head contributions
        results.append((lp.detach(), ent.detach(), head_grad))
    (lp_c, ent_c, g_c), (lp_d, ent_d, g_d) = results
    assert torch.allclose(lp_c[mask], lp_d[mask], atol=1e-5) and torch.allclose(ent_c[mask], ent_d[mask], atol=1e-5)
    assert torch.allclose(g_c, g_d, atol=1e-5, rtol=1e-4)


def test_meta_init_refuses_an_unlisted_fused_expert_layout_in_one_line(model_dirs, monkeypatch):
    """transformers 5 fuses a layer's experts on load (experts.gate_up_proj) while checkpoints keep one tensor
    per expert: a model type verl/utils/moe_layout.py does not list is refused by the shard loader in one line."""
    from transformers import AutoConfig

    from verl.utils import moe_layout
    from verl.utils.meta_init import build_sharded_model

    monkeypatch.setattr(moe_layout, "LAYOUTS", {})
    path = model_dirs(MOE)
    with pytest.raises(ValueError, match=r"experts.gate_up_proj' is built by transformers from \d+ checkpoint tensors"):
        build_sharded_model(path, AutoConfig.from_pretrained(path), lambda m: m, "cpu", attn_implementation="sdpa")


@pytest.mark.parametrize("name", ALL)  # Qwen3-MoE: its experts stacked from the per-expert tensors (moe_layout.py)
def test_meta_init_and_shard_load_equal_from_pretrained(model_dirs, name):
    from transformers import AutoConfig

    from verl.utils.meta_init import build_sharded_model

    path = model_dirs(name)
    model = build_sharded_model(path, AutoConfig.from_pretrained(path), lambda m: m, "cpu", attn_implementation="sdpa")
    ref = _load(path)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.dtype == torch.float32 and torch.equal(p, q), n  # bf16 checkpoint rows cast like from_pretrained
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == bool(model.config.tie_word_embeddings)
    ids = torch.randint(3, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)
