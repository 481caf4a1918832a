"""vLLM tensor parallel inside the hybrid engine (docs/DESIGN.md §2 item 2): 4 gloo ranks, TP 2, a recording engine.

The real worker method ``MIXActorRolloutRefWorker.generate_sequences`` runs on every rank with its own
prompts; the engine records what it was asked. Within a TP group both ranks must send the engine the
same prompts (the group's, in TP-rank order) with the same seed (that of the DP rank), DP groups must
differ, each rank must get back the rows of its own prompts, and the weight sync (FSDP2 shards over all
4 ranks) must deliver the full weights to the engine of every TP rank.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.distributed_testing import run_gloo_ranks
from verl.workers.rollout.tp_group import TPGeneration, TPLayout, split_rows


def test_layout_of_eight_ranks_in_tp_pairs():
    layouts = [TPLayout(r, 8, 2) for r in range(8)]
    assert [lay.dp_rank for lay in layouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [lay.tp_rank for lay in layouts] == [0, 1] * 4
    assert layouts[5].group_ranks == [4, 5] and layouts[5].describe() == "4 DP group(s) x TP 2"
    with pytest.raises(ValueError, match="tensor_model_parallel_size=3 must divide the 8 ranks"):
        TPLayout(0, 8, 3)


def test_split_rows_and_tp_one_is_identity():
    rows = {"x": torch.arange(12).view(6, 2)}
    assert torch.equal(split_rows(rows, 2, 1)["x"], torch.arange(6, 12).view(3, 2))
    with pytest.raises(RuntimeError, match="not divisible by TP size 4"):
        split_rows(rows, 4, 0)

    class Out:
        tensors, meta_info = {"y": torch.ones(2)}, {"m": 1}

    seen = []
    tensors, meta = TPGeneration(TPLayout(0, 1, 1)).run({"x": torch.zeros(1)}, lambda b: seen.append(b) or Out())
    assert list(seen[0]) == ["x"] and meta == {"m": 1} and torch.equal(tensors["y"], torch.ones(2))


def _tp_rank(rank, world, port):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from luffy_pool.config.compose import compose_config, rollout_section
    from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
    from luffy_pool.rollout.slot_plan import MixRolloutPlanner
    from verl.protocol import DataProto
    from verl.workers.config_sections import WorkerSections
    from verl.workers.rollout.base import BaseRollout, GenerationOutput
    from verl.workers.sharding_manager import FSDPShardingManager

    dist.init_process_group("gloo", rank=rank, world_size=world)

    class RecordingEngine(BaseRollout):
        def __init__(self):
            self.calls, self.pushed = [], {}

        def generate_token_ids(self, prompt_token_ids, max_tokens, sampling):
            self.calls.append({"prompts": prompt_token_ids, "seed": sampling.seed})
            # the response names its prompt: its last token, then 2
            return GenerationOutput(token_ids=[[p[-1], 2] for p in prompt_token_ids])

        def update_weights(self, named_tensors):
            self.pushed.update({k: v.clone() for k, v in named_tensors})

    torch.manual_seed(0)  # the same full weights on every rank before sharding
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 4))
    full = {k: v.detach().clone() for k, v in module.state_dict().items()}
    fully_shard(module, mesh=init_device_mesh("cpu", (world,)))
    engine = RecordingEngine()
    worker = MIXActorRolloutRefWorker.__new__(MIXActorRolloutRefWorker)
    worker.sections = WorkerSections.from_config(
        compose_config(
            [
                "actor_rollout_ref.rollout.seed=7",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "actor_rollout_ref.rollout.name=vllm",
            ]
        ).actor_rollout_ref
    )
    worker.planner = MixRolloutPlanner(
        engine, rollout_section(n=2, response_length=3, n_val=1), pad_token_id=0, eos_token_id=1
    )
    worker.sharding_manager = FSDPShardingManager(module, engine, rank=rank, world_size=world, tp_size=2)
    worker._is_rollout, worker.role = True, "actor_rollout"
    worker.tp_generation = TPGeneration.create(rank, world, worker.rollout_tp_size)
    # rank r's prompts end in 100 + 10 r + i, so every response row names the prompt it came from
    ids = torch.tensor([[5, 6, 100 + 10 * rank + i] for i in range(2)])
    mask = torch.ones_like(ids)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": mask.cumsum(-1) - 1,
            "prefix_ratios": torch.zeros(2, 2),
        },
        meta_info={"global_steps": 3},
    )
    worker.update_weights()  # the driver's stage before every generation (all ranks: the gathers are collectives)
    out = worker.generate_sequences(prompts)
    record = {
        "calls": engine.calls,
        "responses": out.batch["responses"].tolist(),
        "weights_full": sorted(engine.pushed) == sorted(full)
        and all(torch.equal(engine.pushed[k], full[k]) for k in full),
    }
    dist.destroy_process_group()
    return record


@pytest.mark.slow  # 4 gloo processes
def test_four_ranks_tp_two_generate_group_prompts_with_dp_seeds():
    recs = run_gloo_ranks(_tp_rank, 4)
    own = {r: [100 + 10 * r, 101 + 10 * r] for r in range(4)}
    for dp, (a, b) in enumerate([(0, 1), (2, 3)]):
        assert recs[a]["calls"] == recs[b]["calls"] and len(recs[a]["calls"]) == 1  # same prompts, same seed
        call = recs[a]["calls"][0]
        # the TP group's prompts in TP-rank order, each twice (n = 2 slots per prompt)
        assert [p[-1] for p in call["prompts"]] == [t for t in own[a] + own[b] for _ in range(2)]
        assert call["seed"] == 7 + 100_003 * 3 + dp  # seeded by the data-parallel rank
    assert recs[0]["calls"][0]["seed"] != recs[2]["calls"][0]["seed"]
    for r in range(4):
        # each rank gets back only its own prompts' rows, in order
        assert [row[0] for row in recs[r]["responses"]] == [t for t in own[r] for _ in range(2)]
        assert recs[r]["weights_full"], f"rank {r}'s engine did not receive the full weights"
