"""Optimizer-state offload: state in host memory between phases, on the accelerator for the update.

The accelerator is faked with ``FakeTensorMode``: its tensors report a real ``cuda`` device (and AdamW
runs on them) on a machine without a GPU, so every assertion checks the ``.device`` the real ``Tensor.to``
calls produced. The compute device is given with its index (``cuda:0``), as the worker passes it: a bare
``cuda`` would ask the (absent) CUDA runtime for the current device.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from verl.utils.offload import OptimizerOffload, move_optimizer_state, optimizer_state_devices, same_device

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.fixture
def fake_cuda_adamw():
    """AdamW with state on a fake CUDA device, inside the fake mode (yields params, optimizer)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = [
            torch.nn.Parameter(torch.empty(8, 4, device="cuda")),
            torch.nn.Parameter(torch.empty(4, device="cuda")),
        ]
        optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=False)
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()  # creates exp_avg / exp_avg_sq on the parameters' device
        yield params, optimizer


def test_adamw_state_starts_on_the_accelerator(fake_cuda_adamw):
    _, optimizer = fake_cuda_adamw
    assert optimizer_state_devices(optimizer) == {CUDA}


def test_offload_moves_the_moments_to_host_and_load_brings_them_back(fake_cuda_adamw):
    _, optimizer = fake_cuda_adamw
    offload = OptimizerOffload(optimizer, CUDA, enabled=True)
    assert offload.active
    assert offload.offload() == 4  # exp_avg + exp_avg_sq of two parameters
    assert optimizer_state_devices(optimizer) == {CPU}
    assert all(s["step"].device == CPU for s in optimizer.state.values())  # scalar counters stay on the host
    assert offload.load() == 4
    assert optimizer_state_devices(optimizer) == {CUDA}


def test_update_runs_with_state_on_the_accelerator_and_leaves_it_on_the_host(fake_cuda_adamw):
    params, optimizer = fake_cuda_adamw
    offload = OptimizerOffload(optimizer, CUDA, enabled=True)
    offload.offload()
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(optimizer_state_devices(opt)))
    with offload.on_compute_device():
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()
    assert seen == [{CUDA}]
    assert optimizer_state_devices(optimizer) == {CPU}


def test_state_returns_to_the_host_when_the_update_fails(fake_cuda_adamw):
    _, optimizer = fake_cuda_adamw
    offload = OptimizerOffload(optimizer, CUDA, enabled=True)
    with pytest.raises(RuntimeError, match="boom"):
        with offload.on_compute_device():
            assert optimizer_state_devices(optimizer) == {CUDA}
            raise RuntimeError("boom")
    assert optimizer_state_devices(optimizer) == {CPU}


def test_state_of_host_resident_parameters_stays_on_the_host(fake_cuda_adamw):
    """param_offload keeps some parameters in host memory: their state must come back there, not to the GPU."""
    params, optimizer = fake_cuda_adamw
    offload = OptimizerOffload(optimizer, CUDA, enabled=True)
    offload.offload()
    with FakeTensorMode(allow_non_fake_inputs=True):
        host_param = torch.nn.Parameter(torch.empty(3, device="cpu"))
        optimizer.add_param_group({"params": [host_param]})
        host_param.grad = torch.ones_like(host_param)
        optimizer.state[host_param] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(host_param),
            "exp_avg_sq": torch.zeros_like(host_param),
        }
    with offload.on_compute_device():
        assert {optimizer.state[p]["exp_avg"].device for p in params} == {CUDA}
        assert optimizer.state[host_param]["exp_avg"].device == CPU


def test_disabled_offload_leaves_the_state_alone(fake_cuda_adamw):
    _, optimizer = fake_cuda_adamw
    offload = OptimizerOffload(optimizer, CUDA, enabled=False)
    with offload.on_compute_device():
        pass
    assert offload.offload() == 0 and optimizer_state_devices(optimizer) == {CUDA}


def test_cpu_run_is_a_no_op_and_keeps_values():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state[model.weight].items()}
    offload = OptimizerOffload(optimizer, "cpu", enabled=True)
    assert not offload.active
    with offload.on_compute_device():
        pass
    assert all(torch.equal(before[k], v) for k, v in optimizer.state[model.weight].items())
    assert move_optimizer_state(optimizer, "cpu") == 0


def test_device_without_index_matches_any_index():
    assert same_device(torch.device("cuda", 3), "cuda")
    assert not same_device(torch.device("cuda", 3), "cuda:0")
    assert not same_device(CPU, "cuda")
