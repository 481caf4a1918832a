"""Test support for multi-rank code on one machine: run a function on N forked gloo ranks.

Used by the test suite (FSDP, HSDP, Ulysses, weight-sync tests) and usable by anyone checking
distributed code on CPU; ships with the package the way ``torch.testing`` does.
"""
from __future__ import annotations

import socket
import time

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on the loopback that nothing is listening on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo_ranks(fn, world: int, *args, timeout_s: float = 300.0) -> None:
    """Run ``fn(rank, world, port, *args)`` on ``world`` forked ranks; fail on a rank's error or on timeout.

    Fork, not spawn: the children inherit the already imported torch/transformers (~15 s per child on a
    busy 2-core box).
    """
    if torch.distributed.is_initialized():
        # An in-process vLLM engine of an earlier test leaves a world-1 group here; forked ranks would inherit it
        # (init_distributed then skips joining their own group) and run as world 1 on a shared gloo context.
        torch.distributed.destroy_process_group()
    ctx = mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            raise TimeoutError(f"{fn.__name__} did not finish in {timeout_s:g} s")
