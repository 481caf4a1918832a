"""Resume on a different world size (verl #1377, torchtitan #811): an FSDP2 checkpoint written by 2 gloo ranks
loads on 4, and the one those 4 write loads on 2; DCP reshards the weights and AdamW moments, so the full
tensors after each load equal the ones saved, and the lr scheduler's step comes back on every rank. The
2 -> 1 case is in test_fsdp_checkpoint_manager.py. Three short gloo groups (2, 4, 2 forked ranks that inherit
the imports) serve both directions."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers.distributed_testing import run_gloo_ranks
from tests.verl.utils.checkpoint.test_fsdp_checkpoint_manager import (
    STEPS_BEFORE_SAVE,
    _init_group,
    _max_diff,
    _optim_tensors,
    build_sharded_actor,
    full_states,
    train_step,
)
from verl.utils.checkpoint import layout


def _train_and_save(rank, world_size, port, model_dir, dst):
    import torch.distributed as dist

    from verl.utils.checkpoint import FSDPCheckpointManager

    mesh = _init_group(rank, world_size)
    model, optim, sched = build_sharded_actor(model_dir, mesh, seed=0)
    for step in range(STEPS_BEFORE_SAVE):
        train_step(model, optim, sched, rank, world_size, step)
    FSDPCheckpointManager(model, optim, sched).save_checkpoint(dst, global_step=STEPS_BEFORE_SAVE)
    saved_model, saved_optim = full_states(model, optim)
    dist.destroy_process_group()
    return {"model": saved_model, "optim": saved_optim} if rank == 0 else None


def _load_then_save(rank, world_size, port, model_dir, src, dst):
    """Load ``src`` into a differently initialised model on this world size; save it again under ``dst``."""
    import torch.distributed as dist

    from verl.utils.checkpoint import FSDPCheckpointManager

    mesh = _init_group(rank, world_size)
    model, optim, sched = build_sharded_actor(model_dir, mesh, seed=99)
    mgr = FSDPCheckpointManager(model, optim, sched)
    mgr.load_checkpoint(src)
    loaded_model, loaded_optim = full_states(model, optim)
    lr = sched.get_last_lr()[0]
    if dst is not None:
        mgr.save_checkpoint(dst, global_step=STEPS_BEFORE_SAVE)
    dist.destroy_process_group()
    out = {"lr": lr}
    if rank == 0:
        out.update(model=loaded_model, optim=loaded_optim)
    return out


@pytest.fixture(scope="module")
def two_four_two(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("world_size_change")
    on_two, on_four = str(root / "two" / "actor"), str(root / "four" / "actor")
    saved = run_gloo_ranks(_train_and_save, 2, tiny_model_dir, on_two, timeout_s=600)[0]
    four = run_gloo_ranks(_load_then_save, 4, tiny_model_dir, on_two, on_four, timeout_s=600)
    two = run_gloo_ranks(_load_then_save, 2, tiny_model_dir, on_four, None, timeout_s=600)
    return saved, four, two, on_two, on_four


@pytest.mark.slow  # forks gloo ranks
def test_manifest_records_the_world_size_that_wrote_it(two_four_two):
    *_, on_two, on_four = two_four_two
    for path, size in ((on_two, 2), (on_four, 4)):
        with open(os.path.join(path, layout.META_FILE)) as f:
            assert json.load(f)["world_size"] == size
        assert os.path.exists(os.path.join(path, layout.extra_state_file(size, size - 1)))


@pytest.mark.slow  # forks gloo ranks
@pytest.mark.parametrize("case", ["2->4", "4->2"])
def test_checkpoint_is_resharded_onto_a_different_world_size(two_four_two, case):
    saved, four, two, *_ = two_four_two
    loaded = four if case == "2->4" else two
    # the 4-rank checkpoint was written from what the 4 ranks loaded, so both hops compare with the 2-rank save
    assert _max_diff(loaded[0]["model"], saved["model"]) == 0.0
    assert _max_diff(_optim_tensors(loaded[0]["optim"]), _optim_tensors(saved["optim"])) == 0.0
    lr_after_two_steps = 1e-2 / (1 + STEPS_BEFORE_SAVE)  # LambdaLR(1 / (1 + s)) of build_sharded_actor
    assert all(abs(r["lr"] - lr_after_two_steps) < 1e-12 for r in loaded)
