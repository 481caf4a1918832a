"""H6: ``actor_rollout_ref.nccl_timeout`` reaches every process group, not only the world group.

torch gives a group made by ``new_group`` / ``init_device_mesh`` its own default (10 min NCCL, 30 min gloo),
whatever the world group was given. On 4 gloo ranks the world is created with the worker's timeout and each
sub-group is read back from its backend's options: HSDP's two mesh dimensions, the Ulysses SP mesh, the rollout
TP groups, and (vllm tier) the groups vLLM's parallel state makes in a worker process.
"""

import datetime

import pytest
import torch  # noqa: F401  (imported once, before forking)

from tests.helpers.distributed_testing import run_gloo_ranks

TIMEOUT_S = 1234  # not a default of any backend
GLOO_DEFAULT_S = 1800.0


def _timeouts(rank, world, port, timeout_s):
    import torch.distributed as dist

    from verl.utils.fsdp_mesh import build_fsdp_mesh, build_ulysses_mesh
    from verl.workers.rollout.tp_group import TPLayout, build_tp_group, group_timeout_s

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        out = {"world": group_timeout_s(dist.group.WORLD)}
        hsdp = build_fsdp_mesh("cpu", world, 2, timeout_s=timeout_s)
        out.update({f"hsdp/{d}": group_timeout_s(hsdp.get_group(d)) for d in ("ddp", "fsdp")})
        fsdp = build_fsdp_mesh("cpu", world, -1, timeout_s=timeout_s)
        out["fsdp"] = group_timeout_s(fsdp.get_group("fsdp"))
        sp = build_ulysses_mesh("cpu", world, 2, timeout_s=timeout_s)
        out.update({f"sp/{d}": group_timeout_s(sp.get_group(d)) for d in ("dp", "sp")})
        out["tp"] = group_timeout_s(build_tp_group(TPLayout(rank, world, 2), timeout_s))
        return out
    finally:
        dist.destroy_process_group()


def test_nccl_timeout_reaches_hsdp_sp_and_tp_groups_on_4_ranks():
    results = run_gloo_ranks(_timeouts, 4, TIMEOUT_S, timeout_s=300)
    for rank, out in enumerate(results):
        assert set(out) == {"world", "hsdp/ddp", "hsdp/fsdp", "fsdp", "sp/dp", "sp/sp", "tp"}
        assert out == {k: float(TIMEOUT_S) for k in out}, (rank, out)


def test_without_a_timeout_the_sub_groups_keep_torchs_default():
    """What the worker's timeout replaces (the test above would not notice a group left out otherwise)."""
    out = run_gloo_ranks(_timeouts, 4, None, timeout_s=300)[0]
    assert out["world"] == TIMEOUT_S and out["fsdp"] == TIMEOUT_S  # the 1-D FSDP mesh is the world group itself
    assert {out[k] for k in ("hsdp/ddp", "hsdp/fsdp", "sp/dp", "sp/sp", "tp")} == {GLOO_DEFAULT_S}


def _vllm_groups(rank, world, port):
    import torch.distributed as dist
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    from verl.workers.rollout.tp_group import apply_world_timeout_to_vllm_groups, group_timeout_s, vllm_process_groups

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    with set_current_vllm_config(VllmConfig()):  # the groups an external_launcher engine makes in a worker
        parallel_state.init_distributed_environment(world, rank, "env://", rank, backend="gloo")
        parallel_state.initialize_model_parallel(world, 1, backend="gloo")
    groups = vllm_process_groups()
    before = [group_timeout_s(g) for g in groups]
    applied = apply_world_timeout_to_vllm_groups()
    return {"before": before, "applied": applied, "after": [group_timeout_s(g) for g in groups]}


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllm_process_groups_get_the_world_groups_timeout():
    out = run_gloo_ranks(_vllm_groups, 2, timeout_s=500, start_method="spawn")
    for rank_out in out:
        assert len(rank_out["after"]) >= 4  # world and TP coordinators at least, device + CPU group each
        assert GLOO_DEFAULT_S in rank_out["before"]
        assert rank_out["applied"] == TIMEOUT_S and set(rank_out["after"]) == {float(TIMEOUT_S)}
