"""Run a function on N gloo ranks of this machine (forked or spawned processes) and collect what each returns.

The test suite's multi-rank tests (FSDP, HSDP, Ulysses, weight sync, checkpoints, dynamic batches, TP groups;
through tests/helpers/distributed_testing.py) and ``exp_scripts/bench_memory.py --sp`` use it: a CPU stand-in for a
multi-device launch, no Ray.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

from verl.single_controller.base.worker import find_free_port


def _rank_main(rank, fn, world, port, result_dir, args):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    result = fn(rank, world, port, *args)
    torch.save(result, os.path.join(result_dir, f"rank{rank}.pt"))


def _forget_vllm_groups() -> None:
    """Drop vLLM's group coordinators (module globals of vllm.distributed.parallel_state) over the default group just
    destroyed: the next in-process engine of this process would reuse them and fail with "not initialized in the
    world group map" (seen when a test after these ranks starts an engine in the same pytest worker)."""
    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is None:
        return
    for name, value in list(vars(state).items()):
        if isinstance(value, state.GroupCoordinator):
            setattr(state, name, None)


# What gloo prints when its full-mesh connect between two ranks of this machine fails at group creation: a peer's
# socket closed or refused during the handshake (seen once in ~3,000 suite runs of these tests, on a machine under
# load). A rank's work comes back only through its result file, so the whole set of ranks starts again, once, on a
# new port; any other error is the test's own and is raised as it is.
_TRANSIENT_CONNECT = ("connectFullMesh failed", "Address already in use")


def _transient(err: BaseException) -> bool:
    return isinstance(err, mp.ProcessRaisedException) and any(s in str(err) for s in _TRANSIENT_CONNECT)


def run_gloo_ranks(fn, world: int, *args, timeout_s: float = 300.0, start_method: str = "fork") -> list:
    """Run ``fn(rank, world, port, *args)`` on ``world`` ranks; return what each rank returned, in rank order.

    Each rank starts with MASTER_ADDR/MASTER_PORT (``port``), RANK, WORLD_SIZE, LOCAL_RANK and
    LOCAL_WORLD_SIZE set and one torch thread, so ``dist.init_process_group("gloo")`` (or
    ``fsdp_utils.init_distributed``) joins the group; ``fn`` joins and leaves it itself. A return value
    must be ``torch.save``-able (None is fine). Fails with the rank's error when a rank raises, and with
    TimeoutError (after killing the ranks) past ``timeout_s``.

    ``start_method``: "fork" (default) lets the ranks inherit the already imported torch/transformers
    (~15 s per child saved on a busy 2-core box); "spawn" gives fresh interpreters, for ranks that must
    not inherit the parent's state: one that measures its own memory (a forked child starts with the
    parent's resident pages), or one that starts a vLLM engine of its own.
    """
    try:
        return _run_once(fn, world, args, timeout_s, start_method)
    except mp.ProcessRaisedException as err:
        if not _transient(err):
            raise
        print(
            f"run_gloo_ranks: {fn.__name__}: gloo could not connect its ranks ({str(err).strip().splitlines()[-1][:200]}); "
            "starting them again on a new port",
            file=sys.stderr,
        )
        return _run_once(fn, world, args, timeout_s, start_method)


def _run_once(fn, world: int, args: tuple, timeout_s: float, start_method: str) -> list:
    if torch.distributed.is_initialized():
        # An in-process vLLM engine of an earlier test leaves a world-1 group here; forked ranks would inherit it
        # (init_distributed then skips joining their own group) and run as world 1 on a shared gloo context.
        torch.distributed.destroy_process_group()
        _forget_vllm_groups()
    result_dir = tempfile.mkdtemp(prefix="gloo_ranks_")
    try:
        # A forked rank must never garbage-collect what it inherited: a collection in the child runs finalizers
        # of the parent's objects (Ray/gRPC clients, thread pools) whose native state did not survive the fork,
        # and aborts the rank (seen as SIGABRT "Garbage-collecting" inside transformers' loader thread pool).
        # Frozen objects sit in the permanent generation the child's collector skips; the parent unfreezes.
        gc.freeze()
        try:
            ctx = mp.start_processes(
                _rank_main,
                args=(fn, world, find_free_port("127.0.0.1"), result_dir, args),
                nprocs=world,
                join=False,
                start_method=start_method,
            )
        finally:
            gc.unfreeze()
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                raise TimeoutError(f"{fn.__name__} did not finish in {timeout_s:g} s")
        return [torch.load(os.path.join(result_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
