"""FSDP2 helpers: full-weight streaming, buckets, full state dicts, on 2 gloo ranks and in one process."""

import warnings

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

from verl.utils import fsdp_utils
from tests.helpers.distributed_testing import run_gloo_ranks
from tests.helpers.sections import engine_section

JOB_TIMEOUT_S = 240


def run_ranks(fn, world: int, *args) -> list:
    return run_gloo_ranks(fn, world, *args, timeout_s=JOB_TIMEOUT_S)


def _tiny_config(tied: bool):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
        eos_token_id=1,
        pad_token_id=0,
    )


def _two_rank_job(rank, world, port, model_dir):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    from verl.workers.rollout.base import SamplingSpec
    from verl.workers.rollout.hf_rollout import HFRollout

    fsdp_utils.init_distributed("cpu")
    mesh = fsdp_utils.create_device_mesh("cpu")
    results = {}
    for tied in (False, True):
        torch.manual_seed(0)
        reference = Qwen2ForCausalLM(_tiny_config(tied))
        model = Qwen2ForCausalLM(_tiny_config(tied))
        model.load_state_dict(reference.state_dict())
        fsdp_utils.apply_fsdp2(model, mesh, fsdp_utils.mixed_precision_policy(device="cpu"))
        local_rows = model.model.embed_tokens.weight.to_local().shape[0]
        full = list(fsdp_utils.iter_full_params(model))
        expected = reference.state_dict()
        results[f"tied={tied}"] = {
            "version": fsdp_utils.fsdp_version(model),
            "local_rows": local_rows,
            "names": [n for n, _ in full],
            "max_diff": max((t - expected[n]).abs().max().item() for n, t in full),
            "bucket_sizes": [len(b) for b in fsdp_utils.iter_buckets(fsdp_utils.iter_full_params(model), 100_000)],
        }
        fresh = Qwen2ForCausalLM(_tiny_config(tied))
        fsdp_utils.apply_fsdp2(fresh, mesh)
        fsdp_utils.load_full_state_dict_into_fsdp2(fresh, expected if rank == 0 else {})
        results[f"tied={tied}"]["loaded_max_diff"] = max(
            (t - expected[n]).abs().max().item() for n, t in fsdp_utils.iter_full_params(fresh)
        )
        results[f"tied={tied}"]["full_sd_keys"] = sorted(fsdp_utils.get_fsdp_full_state_dict(fresh))

    # An FSDP2 actor trained one step, streamed into an HF rollout, generates like the unsharded model.
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    fsdp_utils.apply_fsdp2(actor, mesh)
    opt = torch.optim.SGD(actor.parameters(), lr=0.5)
    batch = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(rank))
    actor(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    rollout = HFRollout(model_dir, engine_section())
    for bucket in fsdp_utils.iter_buckets(fsdp_utils.iter_full_params(actor), 50_000):
        rollout.update_weights(bucket)
    rollout.after_weight_update()
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    got = rollout.generate_token_ids(prompts, [10, 10], SamplingSpec(temperature=0.0, ignore_eos=True)).token_ids
    full_sd = fsdp_utils.get_fsdp_full_state_dict(actor, rank0_only=False)
    unsharded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    unsharded.load_state_dict(full_sd)
    with torch.no_grad():
        want = [
            unsharded.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    results["rollout_greedy_equal"] = got == want
    results["weights_moved"] = any(
        not torch.equal(v, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()[k])
        for k, v in full_sd.items()
    )
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def two_rank_results(tiny_model_dir):
    return run_ranks(_two_rank_job, 2, tiny_model_dir)


@pytest.mark.parametrize("tied", [False, True])
def test_iter_full_params_on_fsdp2_equals_the_unsharded_state_dict(two_rank_results, tied):
    for res in two_rank_results:
        r = res[f"tied={tied}"]
        assert r["version"] == 2 and r["local_rows"] == 32  # 64-row embedding split over 2 ranks
        assert r["max_diff"] == 0.0
        assert ("lm_head.weight" in r["names"]) is (not tied)  # a tied head is the embedding, sent once
        assert len(r["names"]) == (26 if tied else 27)


def test_buckets_and_full_state_dict_round_trip_on_fsdp2(two_rank_results):
    rank0, rank1 = (res["tied=False"] for res in two_rank_results)
    assert rank0["bucket_sizes"] == rank1["bucket_sizes"] and sum(rank0["bucket_sizes"]) == 27
    assert len(rank0["bucket_sizes"]) > 1
    assert rank0["loaded_max_diff"] == rank1["loaded_max_diff"] == 0.0
    assert len(rank0["full_sd_keys"]) == 27 and rank1["full_sd_keys"] == []  # rank 0 only


def test_hf_rollout_fed_from_a_trained_fsdp2_actor_generates_like_the_unsharded_model(two_rank_results):
    for res in two_rank_results:
        assert res["weights_moved"] and res["rollout_greedy_equal"]


# ------------------------------------------------------------------------------ one process
def test_clean_param_name_strips_wrapper_prefixes():
    assert (
        fsdp_utils.clean_param_name(
            "_orig_mod.model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.up_proj.weight"
        )
        == "model.layers.0.mlp.up_proj.weight"
    )


def test_buckets_respect_the_byte_bound_and_let_a_large_tensor_travel_alone():
    # fp32 Linear(10, 10): weight 400 B, bias 40 B
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    named = list(fsdp_utils.iter_full_params(model))
    assert [[n for n, _ in b] for b in fsdp_utils.iter_buckets(named, 450)] == [
        ["0.weight", "0.bias"],
        ["1.weight", "1.bias"],
    ]
    assert [len(b) for b in fsdp_utils.iter_buckets(named, 100)] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(fsdp_utils.iter_buckets(named, 0))


def test_plain_modules_stream_detached_tensors_in_the_requested_dtype():
    model = nn.Linear(3, 2)
    (name, weight), (_, bias) = fsdp_utils.iter_full_params(model, dtype="bf16")
    assert name == "weight" and weight.dtype == torch.bfloat16 and not weight.requires_grad
    assert fsdp_utils.fsdp_version(model) == 0


def test_cpu_policies_offload_nothing_and_compute_in_fp32():
    # Optimizer-state offload lives in verl/utils/offload.py alone (tests/verl/utils/test_offload.py).
    assert fsdp_utils.cpu_offload_policy(True, "cpu") is None
    assert fsdp_utils.cpu_offload_policy(False, "cuda") is None
    assert fsdp_utils.mixed_precision_policy(device="cpu").param_dtype == torch.float32
    assert fsdp_utils.mixed_precision_policy(device="cuda").param_dtype == torch.bfloat16


def test_unknown_dtype_and_missing_layer_classes_are_named():
    with pytest.raises(ValueError, match="int3"):
        fsdp_utils.to_torch_dtype("int3")
    with pytest.raises(ValueError, match="NoSuchLayer"):
        fsdp_utils.decoder_layer_classes(nn.Sequential(nn.Linear(2, 2)), ["NoSuchLayer"])


def _packed_gather_job(rank, world, port):
    import torch.distributed as dist
    from transformers import Qwen2Config

    from verl.utils.fsdp_gather import iter_full_param_buckets

    fsdp_utils.init_distributed("cpu")
    mesh = fsdp_utils.create_device_mesh("cpu")
    # Odd sizes over 3 ranks: uneven chunks (41 rows -> 14/14/13; 8 rows -> 3/3/2) exercise the padding.
    cfg = Qwen2Config(
        vocab_size=41,
        hidden_size=24,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    reference = Qwen2ForCausalLM(cfg)
    model = Qwen2ForCausalLM(cfg)
    model.load_state_dict(reference.state_dict())
    fsdp_utils.apply_fsdp2(model, mesh)
    expected = list(fsdp_utils.iter_full_params(model))
    results = {}
    for bucket_bytes, dtype in ((1 << 30, None), (3000, None), (1 << 30, "bfloat16")):
        with warnings.catch_warnings(record=True) as caught:  # the console must not repeat a deprecation per sync
            warnings.simplefilter("always")
            buckets = list(iter_full_param_buckets(model, dtype, bucket_bytes))
        got = [item for b in buckets for item in b]
        want = expected if dtype is None else [(n, t.to(torch.bfloat16)) for n, t in expected]
        results[(bucket_bytes, dtype)] = {
            "names_equal": [n for n, _ in got] == [n for n, _ in want],
            "all_equal": all(torch.equal(a, b) and a.dtype == b.dtype for (_, a), (_, b) in zip(got, want)),
            "buckets": len(buckets),
            "deprecations": [
                str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
            ],
        }
    dist.destroy_process_group()
    return results


def test_packed_bucket_gather_equals_per_tensor_full_tensor():
    for rank, results in enumerate(run_ranks(_packed_gather_job, 3)):
        for key, r in results.items():
            assert r["names_equal"] and r["all_equal"], (rank, key)
            assert r["deprecations"] == [], (rank, key, r["deprecations"])
        assert results[(1 << 30, None)]["buckets"] == 1  # the whole model in one collective
        assert results[(3000, None)]["buckets"] > 3
