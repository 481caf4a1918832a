"""The hybrid engine's weight push and generation context: call order, buckets, RNG streams, the push-first rule,
and FSDP2 actors feeding real engines."""

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM  # noqa: F401  (imported once, before forking ranks)

from verl.workers.rollout.base import BaseRollout, GenerationOutput
from verl.workers.sharding_manager import FSDPShardingManager, is_engine_owner
from tests.helpers.distributed_testing import run_gloo_ranks
from tests.helpers.sections import engine_section

JOB_TIMEOUT_S = 300


class RecordingRollout(BaseRollout):
    """Remembers every call the manager makes, in order."""

    def __init__(self):
        self.calls, self.buckets = [], []

    def generate_token_ids(self, prompt_token_ids, max_tokens, sampling):
        return GenerationOutput(token_ids=[[] for _ in prompt_token_ids])

    def update_weights(self, named_tensors):
        self.calls.append("update_weights")
        self.buckets.append([(n, t.dtype) for n, t in named_tensors])

    def sleep(self):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake_up")

    def after_weight_update(self):
        self.calls.append("after_weight_update")


def two_linears():
    return nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))  # fp32: weight 400 B, bias 40 B


def test_the_push_streams_bucketed_weights_then_entering_wakes_and_leaving_sleeps():
    rollout = RecordingRollout()
    model = two_linears()
    model.eval()
    manager = FSDPShardingManager(model, rollout, bucket_bytes=450)
    manager.sync_weights()
    assert rollout.calls == ["wake_up", "update_weights", "update_weights", "after_weight_update"]
    with manager:
        assert rollout.calls[4:] == ["wake_up"]
    assert rollout.calls[5:] == ["sleep"]
    assert [[n for n, _ in b] for b in rollout.buckets] == [["0.weight", "0.bias"], ["1.weight", "1.bias"]]
    assert model.training
    assert manager.last_sync_buckets == 2 and manager.metrics["timing_s/weight_sync"] >= 0


def test_generation_without_a_push_since_the_last_one_is_refused():
    rollout = RecordingRollout()
    manager = FSDPShardingManager(two_linears(), rollout)
    with pytest.raises(RuntimeError, match="without a weight push"):
        manager.__enter__()
    manager.sync_weights()
    with manager:
        pass
    with pytest.raises(RuntimeError, match="call sync_weights"):  # one push serves one generation
        manager.__enter__()
    assert rollout.calls.count("sleep") == 1 and rollout.calls.count("after_weight_update") == 1


def test_held_generations_share_one_push_and_the_engine_sleeps_after_the_last():
    """The chunks of one validation: one push, the engine awake between them, asleep after the last; a failed
    held generation releases (sleeps, and the next generation needs a push)."""
    rollout = RecordingRollout()
    manager = FSDPShardingManager(two_linears(), rollout)
    manager.sync_weights()
    del rollout.calls[:]
    for hold in (True, True, False):
        with manager.hold(hold):
            pass
    assert rollout.calls == ["wake_up", "wake_up", "wake_up", "sleep"]
    with pytest.raises(RuntimeError, match="call sync_weights"):  # the last chunk released the push
        manager.__enter__()
    manager.sync_weights()
    with pytest.raises(ValueError, match="generation failed"):
        with manager.hold(True):
            raise ValueError("generation failed")
    assert rollout.calls[-1] == "sleep" and not manager.hold_weights
    with pytest.raises(RuntimeError, match="call sync_weights"):
        manager.__enter__()


def test_sync_dtype_casts_what_is_pushed():
    rollout = RecordingRollout()
    FSDPShardingManager(two_linears(), rollout, sync_dtype="bfloat16").sync_weights()
    assert {dtype for bucket in rollout.buckets for _, dtype in bucket} == {torch.bfloat16}


def test_tied_weights_are_pushed_once_under_the_embedding_name():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    rollout = RecordingRollout()
    FSDPShardingManager(Tied(), rollout).sync_weights()
    assert [n for b in rollout.buckets for n, _ in b] == ["embed.weight"]


def test_generation_rng_is_per_data_parallel_rank_and_continues_across_steps():
    model = two_linears()  # built before seeding: its init draws from the global RNG

    def first_draws(rank, steps=2):
        manager = FSDPShardingManager(model, RecordingRollout(), rank=rank, world_size=4, tp_size=2)
        draws = []
        for _ in range(steps):
            manager.sync_weights()
            with manager:
                draws.append(torch.rand(3))
        return draws

    torch.manual_seed(7)
    trainer_expected = torch.rand(2)
    torch.manual_seed(7)
    rank2 = first_draws(2)
    assert torch.equal(torch.rand(2), trainer_expected)  # the trainer's stream never saw generation
    rank3, rank1 = first_draws(3), first_draws(1)
    stream = torch.Generator().manual_seed(1000 + 1)  # dp rank 1 = ranks 2 and 3 with tp 2
    assert torch.equal(rank2[0], torch.rand(3, generator=stream))
    assert torch.equal(rank2[1], torch.rand(3, generator=stream))  # step 2 continues, not restarts
    assert all(torch.equal(a, b) for a, b in zip(rank2, rank3))  # same TP group, same samples
    assert not torch.equal(rank1[0], rank2[0])


def test_a_rank_without_an_engine_still_streams_and_times_the_sync():
    manager = FSDPShardingManager(two_linears(), None, bucket_bytes=100)
    manager.sync_weights()
    with manager:
        pass
    assert not manager.owns_engine and manager.last_sync_buckets == 4
    assert [is_engine_owner(r, 2) for r in range(4)] == [True, False, True, False]


def test_bad_placement_is_rejected():
    with pytest.raises(ValueError, match="tp_size=3 must divide world_size=4"):
        FSDPShardingManager(two_linears(), None, world_size=4, tp_size=3)
    with pytest.raises(ValueError, match="bucket_bytes"):
        FSDPShardingManager(two_linears(), None, bucket_bytes=0)


# ------------------------------------------------------------------------------ 2 gloo ranks
def run_ranks(fn, world: int, *args) -> list:
    return run_gloo_ranks(fn, world, *args, timeout_s=JOB_TIMEOUT_S)


def _fsdp_actor(model_dir, rank):
    """A tiny FSDP2 actor after one SGD step on this rank's half of the batch."""
    from verl.utils import fsdp_utils

    fsdp_utils.init_distributed("cpu")
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    fsdp_utils.apply_fsdp2(actor, fsdp_utils.create_device_mesh("cpu"))
    opt = torch.optim.SGD(actor.parameters(), lr=0.5)
    batch = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(rank))
    actor(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    opt.zero_grad()
    return actor


def _hf_engine_on_rank0_job(rank, world, port, model_dir):
    import torch.distributed as dist

    from verl.utils.fsdp_utils import get_fsdp_full_state_dict
    from verl.workers.rollout.base import SamplingSpec
    from verl.workers.rollout.hf_rollout import HFRollout

    actor = _fsdp_actor(model_dir, rank)
    rollout = (
        HFRollout(model_dir, engine_section()) if is_engine_owner(rank, tp_size=2) else None
    )  # one engine for the pair
    manager = FSDPShardingManager(actor, rollout, bucket_bytes=60_000, rank=rank, world_size=world, tp_size=2)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    manager.sync_weights()
    with manager:
        got = (
            rollout.generate_token_ids(prompts, [10, 10], SamplingSpec(temperature=0.0, ignore_eos=True)).token_ids
            if rollout
            else None
        )
    full_sd = get_fsdp_full_state_dict(actor)
    result = {"buckets": manager.last_sync_buckets, "sync_s": manager.metrics["timing_s/weight_sync"]}
    if rank == 0:
        unsharded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        unsharded.load_state_dict(full_sd)
        with torch.no_grad():
            want = [
                unsharded.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
        result["greedy_equal"] = got == want
    dist.destroy_process_group()
    return result


def test_fsdp2_actor_on_two_ranks_feeds_one_hf_engine_owned_by_rank0(tiny_model_dir):
    rank0, rank1 = run_ranks(_hf_engine_on_rank0_job, 2, tiny_model_dir)
    assert rank0["greedy_equal"] is True
    assert rank0["buckets"] == rank1["buckets"] > 1  # rank 1 took part in every gather


def _vllm_engine_per_rank_job(rank, world, port, model_dir):
    import torch.distributed as dist
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from verl.workers.rollout.vllm_rollout import VLLMRollout

    actor = _fsdp_actor(model_dir, rank)
    # Every rank owns an engine in its own process (SPMD, external_launcher over the trainer's group).
    rollout = VLLMRollout(model_dir, engine_section(prompt_length=128, response_length=128, dtype="float32"))
    seq = torch.randint(3, 300, (150,), generator=torch.Generator().manual_seed(9)).tolist()
    with torch.no_grad():
        logits = actor(torch.tensor([seq])).logits[0, :-1]
    actor_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
    manager = FSDPShardingManager(actor, rollout, bucket_bytes=100_000, rank=rank, world_size=world)
    manager.sync_weights()
    with manager:
        out = rollout.llm.generate(
            [TokensPrompt(prompt_token_ids=seq)],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
            use_tqdm=False,
        )[0]
    engine_lp = torch.tensor([step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], seq[1:])])
    rollout.shutdown()
    dist.destroy_process_group()
    return {"max_diff": (engine_lp - actor_lp).abs().max().item(), "buckets": manager.last_sync_buckets}


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_logprobs_equal_the_trained_fsdp2_actors_on_two_ranks(tiny_model_dir):
    pytest.importorskip("vllm")
    from vllm import LLM  # noqa: F401  (heavy import done once, inherited by the forked ranks)

    for result in run_ranks(_vllm_engine_per_rank_job, 2, tiny_model_dir):
        assert result["max_diff"] < 1e-5 and result["buckets"] > 1
