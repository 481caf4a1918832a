"""The development package's vLLM general plugin (dev/luffy_pool_dev/vllm_plugin.py): installed as an entry point
vLLM's own loader finds, inert unless LUFFY_DEV_SPEEDUPS=1, and on a CPU platform it applies the CPU speed-ups; the
TP socket mesh (cpu_tp_sockets.py) comes with each CPU worker's devices and goes at its shutdown, and carries the sums
of a TP group whose communicator fell back to gloo (through a real TP engine: test_vllm_cpu_tp.py in
tests/verl/workers/rollout)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from tests.helpers.distributed_testing import run_gloo_ranks

pytest.importorskip("vllm")

SWITCHES = ("LUFFY_DEV_SPEEDUPS", "VERL_ACTOR_RUNTIME_ENV_HOOK", "LUFFY_FORK_WORKERS")


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter with the dev switches cleared, then ``env``; its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=dict(clean, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_plugin_is_an_installed_vllm_general_plugin():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("luffy_pool_dev_cpu") == "luffy_pool_dev.vllm_plugin:register", (
        "the development package is not installed: bash exp_scripts/setup_venv.sh"
    )


# vLLM's loader (the one EngineArgs calls), then what the plugin changed
PROBE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor.models import registry
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.worker.cpu_worker import CPUWorker
print(
    getattr(registry._run_in_subprocess, "luffy_in_process", False),
    getattr(CPUWorker.init_device, "luffy_socket_mesh", False),
    getattr(LLMEngine.from_engine_args.__func__, "without_gc", False),
)
"""


@pytest.mark.slow  # a fresh interpreter importing vLLM (~25 s)
def test_vllms_loader_runs_it_only_with_the_switch():
    assert _python(PROBE) == "False False False"  # the product's processes: vLLM as it ships
    assert _python(PROBE, LUFFY_DEV_SPEEDUPS="0") == "False False False"
    assert _python(PROBE, LUFFY_DEV_SPEEDUPS="1") == "True True True"  # this machine kind is a CPU platform


@pytest.mark.slow  # imports vLLM's model runners (~12 s)
def test_register_says_what_it_applied_and_nothing_when_off(monkeypatch):
    from luffy_pool_dev import vllm_plugin

    monkeypatch.delenv("LUFFY_DEV_SPEEDUPS", raising=False)
    assert vllm_plugin.register() == []
    applied = _python(
        "from luffy_pool_dev.vllm_plugin import register; print(sorted(register()))", LUFFY_DEV_SPEEDUPS="1"
    )
    for part in ("in-process model inspection", "TP socket mesh", "engine builds without gc"):
        assert part in applied


def test_the_cpu_workers_devices_bring_the_mesh_and_its_shutdown_closes_it(monkeypatch):
    from vllm.v1.worker.cpu_worker import CPUWorker

    from luffy_pool_dev import cpu_tp_sockets

    calls = []
    monkeypatch.setattr(CPUWorker, "init_device", lambda self: calls.append("groups") or "ready")
    monkeypatch.setattr(CPUWorker, "shutdown", lambda self: calls.append("teardown"))
    monkeypatch.setattr(cpu_tp_sockets, "use_socket_mesh_for_tp", lambda timeout_s: calls.append(("mesh", timeout_s)))
    monkeypatch.setattr(cpu_tp_sockets, "close_socket_mesh_for_tp", lambda: calls.append("close"))
    monkeypatch.setattr(cpu_tp_sockets, "_world_timeout_s", lambda: 60.0)
    assert cpu_tp_sockets.mesh_tp_groups() and cpu_tp_sockets.mesh_tp_groups()  # a second call wraps nothing twice
    worker = object.__new__(CPUWorker)
    assert worker.init_device() == "ready"
    worker.shutdown()
    assert calls == ["groups", ("mesh", 60.0), "close", "teardown"]


def _tp_communicator(rank, world, port):
    """A rank of a 2-rank gloo group whose vLLM CPU communicator for the TP group fell back to torch.distributed (vLLM's
    branch for ranks that share no shared-memory name; always taken by its AVX2 build, which has no shared-memory
    kernels): the mesh takes its sums until closed."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from vllm.distributed import parallel_state
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    from luffy_pool_dev.cpu_tp_sockets import TPSocketMesh, close_socket_mesh_for_tp, use_socket_mesh_for_tp

    CpuCommunicator._all_group_ranks_share_shm_group_name = lambda self: False
    dist.init_process_group("gloo")
    try:
        comm = CpuCommunicator(dist.group.WORLD, torch.device("cpu"), dist.group.WORLD, unique_name="tp:0")
        parallel_state._TP = SimpleNamespace(world_size=world, device_communicator=comm, cpu_group=dist.group.WORLD)
        assert use_socket_mesh_for_tp(60.0)
        mesh = comm.dist_module
        total = torch.full((4,), float(rank + 1))
        comm.all_reduce(total)
        close_socket_mesh_for_tp()
        return isinstance(mesh, TPSocketMesh), total.tolist(), comm.dist_module is dist and not mesh.peers
    finally:
        parallel_state._TP = None
        dist.destroy_process_group()


@pytest.mark.slow  # two gloo ranks importing vLLM's communicator (~10 s)
def test_a_tp_group_that_fell_back_to_gloo_sums_over_the_mesh_until_closed():
    assert run_gloo_ranks(_tp_communicator, 2, timeout_s=300) == [(True, [3.0] * 4, True)] * 2
