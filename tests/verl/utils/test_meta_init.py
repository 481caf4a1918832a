"""Meta-device init: checkpoint rows read exactly, buffers kept, shards equal from_pretrained's weights,
and a rank's peak memory during init is its shard, not a full fp32 copy."""

import json

import pytest
import torch

from tests.helpers.distributed_testing import run_gloo_ranks
from verl.utils.meta_init import checkpoint_entries, empty_model, parameters_on_meta


def test_safetensors_rows_are_read_exactly(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(7, 3, generator=g),
        "b": torch.randn(5, 2, 4, generator=g).bfloat16(),
        "s": torch.tensor(3.5),
        "i": torch.arange(6, dtype=torch.int64),
    }
    save_file({k: v for k, v in tensors.items() if k != "i"}, str(tmp_path / "part1.safetensors"))
    save_file({"i": tensors["i"]}, str(tmp_path / "part2.safetensors"))
    weight_map = {
        "a": "part1.safetensors",
        "b": "part1.safetensors",
        "s": "part1.safetensors",
        "i": "part2.safetensors",
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    entries = checkpoint_entries(str(tmp_path))
    assert set(entries) == set(tensors)
    assert torch.equal(entries["a"].read_rows(2, 6), tensors["a"][2:6])
    assert entries["b"].dtype == torch.bfloat16 and torch.equal(entries["b"].read_rows(4, 5), tensors["b"][4:5])
    assert torch.equal(entries["s"].read_rows(0, 0), tensors["s"])
    out = torch.empty(3, dtype=torch.int64)
    assert entries["i"].read_rows(3, 6, out=out) is out and torch.equal(out, tensors["i"][3:])


def test_bin_checkpoint_and_missing_checkpoint(tmp_path):
    torch.save({"w": torch.arange(12.0).view(4, 3)}, str(tmp_path / "pytorch_model.bin"))
    entry = checkpoint_entries(str(tmp_path))["w"]
    assert torch.equal(entry.read_rows(1, 3), torch.arange(3.0, 9.0).view(2, 3))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        checkpoint_entries(str(tmp_path / "nowhere"))


def test_parameters_on_meta_keeps_buffers(tiny_model_dir):
    from transformers import AutoConfig

    module = empty_model(AutoConfig.from_pretrained(tiny_model_dir), attn_implementation="sdpa")
    assert all(p.is_meta for p in module.parameters())
    buffers = dict(module.named_buffers())
    assert buffers and not any(b.is_meta for b in buffers.values())  # rotary inv_freq is real
    with parameters_on_meta():
        lin = torch.nn.Linear(3, 2)
    assert lin.weight.is_meta and lin.weight.requires_grad
    assert not torch.nn.Linear(3, 2).weight.is_meta  # the patch is gone


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _rank(rank, world, port, model_dir, measure):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.meta_init import build_sharded_model

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        hf_config = AutoConfig.from_pretrained(model_dir)
        base = _rss_kb("VmRSS")
        _reset_peak()
        model = build_sharded_model(
            model_dir, hf_config, lambda m: apply_fsdp2(m, mesh), "cpu", attn_implementation="sdpa"
        )
        ours_kb = _rss_kb("VmHWM") - base
        ref_kb = None
        if measure:  # the same measurement sees a full copy when every rank loads the whole model
            base = _rss_kb("VmRSS")
            _reset_peak()
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        if measure:
            # transformers may keep fp32 weights as lazy views of the mmapped file: read them all, as a
            # forward (or the old `.to(device)`) would, so their pages count
            with torch.no_grad():
                sum(float(p.sum()) for p in ref.parameters())
            ref_kb = _rss_kb("VmHWM") - base
        diff = 0.0
        with torch.no_grad():
            for (name, p), (name_ref, p_ref) in zip(model.named_parameters(), ref.named_parameters()):
                assert name == name_ref
                diff = max(diff, float((p.full_tensor() - p_ref).abs().max()))
            for (_, b), (_, b_ref) in zip(model.named_buffers(), ref.named_buffers()):
                diff = max(diff, float((b - b_ref).abs().max()))
            ids = torch.randint(0, hf_config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
            diff = max(diff, float((model(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()))
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        return rank, ours_kb, ref_kb, diff, tied
    finally:
        dist.destroy_process_group()


def _run_two_ranks(model_dir, measure=False):
    # spawn: a forked rank would start with the parent's resident pages in its RSS
    return run_gloo_ranks(_rank, 2, model_dir, measure, timeout_s=600, start_method="spawn")


@pytest.mark.slow
@pytest.mark.parametrize("tie", [False, True])
def test_two_ranks_hold_exactly_the_checkpoint_weights(tmp_path, tie):
    from luffy_pool.tiny import build_tiny_model
    from transformers import AutoConfig

    model_dir = build_tiny_model(str(tmp_path / "m"))
    if tie:  # re-save with tied embeddings: the checkpoint then has one tensor for both
        from transformers import AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(model_dir)
        cfg.tie_word_embeddings = True
        AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)
    for _, _, _, diff, tied in _run_two_ranks(model_dir):
        assert diff == 0.0 and tied == tie


@pytest.mark.slow
def test_peak_rss_per_rank_is_its_shard_not_a_full_fp32_copy(tmp_path):
    """A random Qwen2 of ~0.3B parameters (1.2 GB fp32) saved to disk, loaded on 2 gloo ranks: each rank's
    peak RSS during init stays near its half; every rank loading (and reading) the whole model with
    from_pretrained costs a full copy."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=20,
        num_attention_heads=16,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.25e9 < n_params < 0.35e9
    model.save_pretrained(str(tmp_path))
    del model
    full_kb = n_params * 4 / 1024
    results = _run_two_ranks(str(tmp_path), measure=True)
    for rank, ours_kb, ref_kb, diff, _ in results:
        print(
            f"rank {rank}: init peak +{ours_kb / 1024:.0f} MiB (ours) vs +{ref_kb / 1024:.0f} MiB (from_pretrained);"
            f" full fp32 copy {full_kb / 1024:.0f} MiB"
        )
        assert diff == 0.0
        assert ref_kb > 0.9 * full_kb, "the measurement should see a whole-model load"
        assert ours_kb < 0.65 * full_kb, (ours_kb, full_kb)
