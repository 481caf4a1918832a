"""Qwen3-MoE experts: per-expert checkpoint tensors <-> the fused parameters transformers trains (moe_layout.py).

The tiny model is the published Qwen3-30B-A3B-Base config.json shrunk (4 experts, top-2; tests/data/model_configs),
saved by ``save_pretrained`` (per-expert names, bf16). transformers' own load of that folder is the reference for
the fusing; its ``save_pretrained`` for the split. Two gloo ranks check the FSDP2 path: meta-device init reads
only each rank's experts, logits equal ``from_pretrained``'s, dp2 gradients equal one rank's, the push has the
checkpoint's names and values.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.distributed_testing import run_gloo_ranks
from tests.helpers.float_compare import float_close_report
from verl.utils.moe_layout import (
    LAYOUTS,
    checkpoint_buckets,
    fuse_state_dict,
    per_expert_views,
    split_state_dict,
)

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "data", "model_configs", "Qwen--Qwen3-30B-A3B-Base.json")
LAYOUT = LAYOUTS["qwen3_moe"]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from luffy_pool.tiny import TinyModelSpec, build_tiny_model

    with open(CONFIG) as f:
        real = json.load(f)
    return build_tiny_model(str(tmp_path_factory.mktemp("moe")), TinyModelSpec(num_key_value_heads=2), real)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _checkpoint(path):
    return {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}


def test_fuse_equals_transformers_load_and_split_is_its_inverse(moe_dir):
    model = _load(moe_dir)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    ckpt = _checkpoint(moe_dir)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in ckpt and "model.layers.1.mlp.experts.gate_up_proj" in state
    fused = fuse_state_dict(ckpt, state, LAYOUT)
    assert sorted(fused) == sorted(state)
    for name, tensor in state.items():  # bf16 -> fp32 is exact: the same tensors, not close ones
        assert torch.equal(fused[name], tensor), name
    e, two_i, h = state["model.layers.0.mlp.experts.gate_up_proj"].shape
    assert (e, two_i // 2, h) == (4, model.config.moe_intermediate_size, model.config.hidden_size)
    split = split_state_dict(state, LAYOUT)
    assert sorted(split) == sorted(ckpt)
    for name, tensor in ckpt.items():
        assert torch.equal(split[name], tensor), name


def test_hf_export_writes_per_expert_names_that_load_back(moe_dir, tmp_path):
    from verl.utils.checkpoint.hf_export import write_hf_folder
    from transformers import AutoConfig

    model = _load(moe_dir)
    state = {k: v.detach() + 0.5 for k, v in model.state_dict().items()}  # DCP-style fused names
    write_hf_folder(str(tmp_path), state, AutoConfig.from_pretrained(moe_dir))
    written = load_file(os.path.join(tmp_path, "model.safetensors"))
    assert sorted(written) == sorted(_checkpoint(moe_dir))
    back = _load(str(tmp_path)).state_dict()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_hf_rollout_takes_the_per_expert_push(moe_dir):
    from luffy_pool.config.compose import rollout_section

    from verl.workers.rollout.hf_rollout import HFRollout

    engine = HFRollout("unused", rollout_section(), model=_load(moe_dir))
    source = _load(moe_dir)
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(-2.0)
    named = list(source.state_dict().items())
    bucket = next(iter(checkpoint_buckets(source, [named])))
    assert "model.layers.0.mlp.experts.2.gate_proj.weight" in dict(bucket)
    assert not any(n.endswith("experts.gate_up_proj") for n, _ in bucket)
    engine.update_weights(bucket)
    engine.after_weight_update()  # every per-expert view of every fused tensor was written
    mine = engine.model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in source.state_dict().items())
    views = per_expert_views(engine.model.state_dict(keep_vars=True), LAYOUT)  # views of the fused storage
    down = engine.model.model.layers[1].mlp.experts.down_proj
    assert views["model.layers.1.mlp.experts.3.down_proj.weight"].data_ptr() == down[3].data_ptr()


def _batch(vocab):
    return torch.randint(3, vocab, (4, 9), generator=torch.Generator().manual_seed(0))


def _loss(model, ids):
    logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()


def _fsdp_ranks(rank, world, port, path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig

    from verl.utils import moe_layout
    from verl.utils.fsdp_gather import iter_full_param_buckets
    from verl.utils.meta_init import build_sharded_model

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    reads = []
    original = moe_layout.StackedEntry.read_rows

    def counted(self, start, stop, out=None):
        reads.append((start, stop))
        return original(self, start, stop, out)

    moe_layout.StackedEntry.read_rows = counted

    def shard(module):
        for layer in module.model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(module, mesh=mesh)

    model = build_sharded_model(path, AutoConfig.from_pretrained(path), shard, "cpu", attn_implementation="sdpa")
    experts = model.model.layers[0].mlp.experts.gate_up_proj
    ids = _batch(model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    _loss(model, ids[2 * rank : 2 * rank + 2]).backward()  # FSDP2 averages the two ranks' gradients
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    push = [x for b in checkpoint_buckets(model, iter_full_param_buckets(model, None, 1 << 16)) for x in b]
    dist.destroy_process_group()
    return {
        "placements": str(experts.placements),
        "local_rows": experts.to_local().shape[0],
        "reads": sorted(set(reads)),
        "logits": logits,
        "grads": grads if rank == 0 else None,
        "push": [(n, t.clone()) for n, t in push] if rank == 0 else None,
    }


@pytest.mark.slow  # forks two gloo ranks
def test_fsdp2_meta_init_logits_grads_and_push_on_two_ranks(moe_dir):
    results = run_gloo_ranks(_fsdp_ranks, 2, moe_dir, timeout_s=600)
    ref = _load(moe_dir)
    ids = _batch(ref.config.vocab_size)
    with torch.no_grad():
        ref_logits = ref(input_ids=ids).logits
    ((_loss(ref, ids[:2]) + _loss(ref, ids[2:])) / 2).backward()
    for rank, r in enumerate(results):
        # experts sharded on the expert dim: each rank read (only) its 2 of the 4 experts, per fused tensor
        assert r["placements"] == "(Shard(dim=0),)" and r["local_rows"] == 2
        assert r["reads"] == [(2 * rank, 2 * rank + 2)], r["reads"]
        assert float_close_report(r["logits"], ref_logits) == "", rank
    grads = results[0]["grads"]
    for name, p in ref.named_parameters():
        rel = (grads[name] - p.grad).norm() / p.grad.norm().clamp_min(1e-30)
        assert rel < 1e-5, (name, float(rel))
    push, ckpt = results[0]["push"], _checkpoint(moe_dir)
    assert [n for n, _ in push] == [n for n in split_state_dict(ref.state_dict(), LAYOUT)]
    assert sorted(n for n, _ in push) == sorted(ckpt)
    assert all(torch.equal(t, ckpt[n]) for n, t in push)


def test_vllm_on_cpu_refuses_a_push_into_moe_experts_in_one_line(tmp_path):
    """vLLM's CPU build prepacks its experts at load and its in-place reload does not reach them (measured: a push
    fails at TP 2, leaves log-probs 0.04-0.24 off at TP 1): the push is refused, naming the HF engine."""
    from verl.workers.rollout.vllm_rollout.vllm_rollout import _cpu_moe_refusal

    with open(CONFIG) as f:
        (tmp_path / "config.json").write_text(f.read())
    why = _cpu_moe_refusal(str(tmp_path), "cpu")
    assert "qwen3_moe is a mixture of experts" in why and "rollout.name=hf" in why and "\n" not in why
    assert _cpu_moe_refusal(str(tmp_path), "cuda") is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 2}))
    assert _cpu_moe_refusal(str(tmp_path), "cpu") is None
