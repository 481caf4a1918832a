"""Dynamic batch size on 2 FSDP2 ranks with uneven token counts (docs/DESIGN.md §2 item 3).

Rank 0 holds short rows (1 micro-batch under the token budget), rank 1 long rows (2 micro-batches).
Without an agreed count rank 0 runs one FSDP forward/backward and rank 1 two: the all-gathers no longer
pair up and gloo fails ("Connection closed by peer") or hangs. With the actor's data-parallel group
(what the worker passes) both ranks run max = 2 micro-batches in ``compute_log_prob`` and in
``update_policy``, and the log-probs come back in row order.
"""

from __future__ import annotations

import pytest
import torch
from luffy_pool.config.compose import actor_config

from tests.helpers.distributed_testing import load_fully_sharded, run_gloo_ranks


def _uneven_rank(rank, world_size, port, model_dir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=__import__("datetime").timedelta(seconds=120)
    )
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = load_fully_sharded(model_dir, mesh)
    cfg = actor_config(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size=2,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=40,
        ppo_epochs=1,
        clip_ratio=0.2,
        entropy_coeff=0.0,
        grad_clip=1.0,
        use_kl_loss=False,
    )
    actor = DataParallelPPOActor(
        cfg, model, torch.optim.AdamW(model.parameters(), lr=1e-3), dp_group=mesh.get_group("dp")
    )
    # The valid-token budget (flash-attn's packed path) is the one whose counts differ by rank; sdpa turns packing
    # off and padded rows of one width give every rank the same count by construction (REVIEW H1).
    actor.use_remove_padding = True
    seq, resp = 20, 6
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, model.config.vocab_size, (4, seq), generator=g)
    # rank 0: 4 rows of 8 valid tokens (32 <= 40: one micro-batch); rank 1: 4 rows of 20 (80: two)
    valid = 8 if rank == 0 else 20
    attn = torch.zeros(4, seq, dtype=torch.long)
    attn[:, seq - valid :] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    data = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": ids[:, -resp:],
            "advantages": torch.ones(4, resp),
        },
        meta_info={"temperature": 1.0, "micro_batch_size": 2, "use_dynamic_bsz": True, "max_token_len": 40},
    )
    calls = {"n": 0}
    original = actor._forward_micro_batch

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    actor._forward_micro_batch = counting
    log_probs, _ = actor.compute_log_prob(data)
    n_log_prob = calls["n"]
    # row order survives the balancing: each row's log-probs equal a one-row forward's
    ref = [
        original(
            {k: data.batch[k][i : i + 1] for k in ("input_ids", "attention_mask", "position_ids", "responses")},
            1.0,
            False,
        )[1]
        for i in range(4)
    ]
    in_order = torch.allclose(log_probs, torch.cat(ref), atol=1e-5)
    calls["n"] = 0
    data.batch["old_log_probs"] = log_probs
    model.reshard()  # the root stays unsharded after a forward; compare sharded parameters
    before = [p.to_local().clone() for p in model.parameters()]
    actor.update_policy(data)
    model.reshard()
    moved = not all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    dist.destroy_process_group()
    return {"log_prob_calls": n_log_prob, "update_calls": calls["n"], "in_order": in_order, "moved": moved}


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_uneven_token_counts_run_the_same_number_of_micro_batches(tiny_model_dir):
    # unequal micro-batch counts desynchronise FSDP: a rank error or a TimeoutError
    results = run_gloo_ranks(_uneven_rank, 2, tiny_model_dir, timeout_s=600)
    assert [r["log_prob_calls"] for r in results] == [2, 2]
    assert [r["update_calls"] for r in results] == [2, 2]
    assert all(r["in_order"] for r in results)
    assert all(r["moved"] for r in results)
