"""HSDP (``fsdp_size``): mesh shapes, and on 4 gloo ranks the same update, weights, syncs and checkpoints as FSDP."""

import os

import pytest
import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

from verl.utils.fsdp_mesh import fsdp_mesh_shape
from tests.helpers.distributed_testing import run_gloo_ranks
from luffy_pool.config.compose import actor_config

JOB_TIMEOUT_S = 300


def test_fsdp_size_minus_one_or_world_is_plain_fsdp():
    assert fsdp_mesh_shape(8, -1) == (8,)
    assert fsdp_mesh_shape(8, 8) == (8,)
    assert fsdp_mesh_shape(8, None) == (8,)


def test_fsdp_size_divisor_gives_replicate_by_shard_mesh():
    assert fsdp_mesh_shape(16, 8) == (2, 8)
    assert fsdp_mesh_shape(4, 2) == (2, 2)
    assert fsdp_mesh_shape(4, 1) == (4, 1)


@pytest.mark.parametrize("bad", [3, 0, -2, 16])
def test_fsdp_size_that_does_not_divide_the_world_is_named(bad):
    with pytest.raises(ValueError, match=r"fsdp_config.fsdp_size'=.* divisor of the world size 8"):
        fsdp_mesh_shape(8, bad)


# ------------------------------------------------------------------------------ 4 gloo ranks
def _run_ranks(fn, world: int, *args) -> list:
    return run_gloo_ranks(fn, world, *args, timeout_s=JOB_TIMEOUT_S)


def _tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        eos_token_id=1,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg)


def _batch(rank: int):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, 64, (4, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # a left-padded prompt
    adv = torch.randn(4, 5, generator=g)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, 7:],
            "old_log_probs": -torch.rand(4, 5, generator=g) - 2.0,
            "advantages": adv,
        },
        meta_info={"temperature": 1.0},
    )


def _hsdp_job(rank, world, port, out_dir):
    import torch.distributed as dist
    from verl.utils import fsdp_utils
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_gather import iter_full_param_buckets
    from verl.utils.fsdp_mesh import build_fsdp_mesh
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = actor_config(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size=2,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=64,
        ppo_epochs=1,
        clip_ratio=0.2,
        entropy_coeff=0.01,
        grad_clip=1.0,
        use_kl_loss=False,
    )
    result = {}
    for name, fsdp_size in (("fsdp", -1), ("hsdp", 2)):
        mesh = build_fsdp_mesh("cpu", world, fsdp_size)
        model = fsdp_utils.apply_fsdp2(_tiny_model(), mesh, fsdp_utils.mixed_precision_policy(device="cpu"))
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
        actor = DataParallelPPOActor(cfg, model, optim)
        losses = []
        for _step in range(2):  # two steps: the second one also checks the AdamW moments agree
            metrics = actor.update_policy(_batch(rank))
            losses.append(metrics["actor/pg_loss"])
        full = dict(fsdp_utils.iter_full_params(model))
        packed = {n: t for bucket in iter_full_param_buckets(model, None, 4096) for n, t in bucket}
        result[name] = {
            "mesh": tuple(mesh.shape),
            "local_rows": model.model.embed_tokens.weight.to_local().shape[0],
            "losses": losses,
            "grad_norm": metrics["actor/grad_norm"],
            "full": full,
            "packed_equals_full": all(torch.equal(packed[n], full[n]) for n in full),
        }
        if name == "hsdp":
            ckpt = os.path.join(out_dir, "ckpt")
            FSDPCheckpointManager(model, optim).save_checkpoint(ckpt, global_step=2, save_hf=True)
            result["ckpt"] = ckpt
            for target_name, target_size in (("hsdp", 2), ("fsdp", -1)):
                fresh = fsdp_utils.apply_fsdp2(
                    _tiny_model(),
                    build_fsdp_mesh("cpu", world, target_size),
                    fsdp_utils.mixed_precision_policy(device="cpu"),
                )
                fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
                DataParallelPPOActor(cfg, fresh, fresh_opt).update_policy(_batch(rank))  # creates AdamW state
                FSDPCheckpointManager(fresh, fresh_opt).load_checkpoint(ckpt)
                reloaded = dict(fsdp_utils.iter_full_params(fresh))
                result[f"reload_into_{target_name}"] = max((reloaded[n] - full[n]).abs().max().item() for n in full)
                after = DataParallelPPOActor(cfg, fresh, fresh_opt).update_policy(_batch(rank))
                result[f"loss_after_reload_{target_name}"] = after["actor/pg_loss"]
            result["loss_next_step"] = actor.update_policy(_batch(rank))["actor/pg_loss"]
    dist.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def hsdp_run(tmp_path_factory):
    return _run_ranks(_hsdp_job, 4, str(tmp_path_factory.mktemp("hsdp")))


@pytest.mark.slow  # 4 forked gloo ranks
def test_hsdp_shards_within_groups_of_fsdp_size(hsdp_run):
    for r in hsdp_run:
        assert r["fsdp"]["mesh"] == (4,) and r["hsdp"]["mesh"] == (2, 2)
        assert r["fsdp"]["local_rows"] == 16 and r["hsdp"]["local_rows"] == 32  # 64-row embedding / 4 vs / 2


@pytest.mark.slow  # 4 forked gloo ranks
def test_hsdp_gives_the_same_loss_and_updated_weights_as_fsdp(hsdp_run):
    for r in hsdp_run:
        for a, b in zip(r["fsdp"]["losses"], r["hsdp"]["losses"]):
            assert a == pytest.approx(b, abs=1e-5)
        assert r["fsdp"]["grad_norm"] == pytest.approx(r["hsdp"]["grad_norm"], abs=1e-5)
        names = r["fsdp"]["full"].keys()
        diff = max((r["fsdp"]["full"][n] - r["hsdp"]["full"][n]).abs().max().item() for n in names)
        assert diff < 1e-5
    # and the update did move the weights, identically on every rank
    first = hsdp_run[0]["hsdp"]["full"]
    assert all(torch.equal(first[n], r["hsdp"]["full"][n]) for r in hsdp_run for n in first)
    assert max((first[n] - _tiny_model().state_dict()[n]).abs().max().item() for n in first) > 1e-3


@pytest.mark.slow  # 4 forked gloo ranks
def test_hsdp_weight_sync_gathers_only_over_the_shard_dim(hsdp_run):
    for r in hsdp_run:
        assert r["hsdp"]["packed_equals_full"] and r["fsdp"]["packed_equals_full"]


@pytest.mark.slow  # 4 forked gloo ranks
def test_hsdp_checkpoint_reloads_into_hsdp_and_plain_fsdp(hsdp_run):
    for r in hsdp_run:
        assert r["reload_into_hsdp"] == 0.0 and r["reload_into_fsdp"] == 0.0
        # the optimizer state came back too: the next step equals the uninterrupted one
        assert r["loss_after_reload_hsdp"] == pytest.approx(r["loss_next_step"], abs=1e-6)
        assert r["loss_after_reload_fsdp"] == pytest.approx(r["loss_next_step"], abs=1e-5)


@pytest.mark.slow  # 4 forked gloo ranks
def test_hsdp_hf_export_writes_the_full_weights(hsdp_run):
    from safetensors.torch import load_file

    r0 = hsdp_run[0]
    hf = load_file(os.path.join(r0["ckpt"], "huggingface", "model.safetensors"))
    # the export happened after two updates: the HSDP model's full weights at that time
    assert max((hf[n] - r0["hsdp"]["full"][n]).abs().max().item() for n in r0["hsdp"]["full"]) == 0.0
