"""Gradient-norm clipping with the reduction on the compute device (param_offload on GPU, docs/DESIGN.md §2 item 7).

The values are checked against ``torch.nn.utils.clip_grad_norm_`` (plain tensors in process, FSDP2 DTensor
gradients on 2 gloo ranks). The device is checked with a fake accelerator, as the offload tests do: under
``FakeTensorMode`` tensors report ``cuda:0`` without a GPU, and every all-reduce the clip issues is
recorded, so a group with only an NCCL backend (no CPU one) would see only cuda tensors.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.distributed_testing import run_gloo_ranks
from verl.utils.grad_norm import clip_grad_norm_on_device


def _params_with_grads(seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params


@pytest.mark.parametrize("scale", [0.01, 10.0])  # below and above max_norm
def test_plain_gradients_match_torch_clip_grad_norm(scale):
    ours, ref = _params_with_grads(0, scale), _params_with_grads(0, scale)
    norm = clip_grad_norm_on_device(ours, 1.0, "cpu")
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm=1.0)
    assert norm.device == torch.device("cpu") and norm.dtype == torch.float32
    assert norm.item() == pytest.approx(ref_norm.item(), rel=1e-6)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


def test_parameters_without_gradients_are_skipped_and_a_nonfinite_norm_is_returned():
    params = _params_with_grads(1, 1.0)
    params.append(torch.nn.Parameter(torch.zeros(2)))  # no grad (frozen / unused)
    assert torch.isfinite(clip_grad_norm_on_device(params, 1.0, "cpu"))
    params[0].grad[0, 0] = float("nan")
    assert not torch.isfinite(clip_grad_norm_on_device(params, 1.0, "cpu"))  # the actor skips the step


def _fsdp_job(rank, world, port):
    """FSDP2 gradients (DTensor shards in host memory): values vs torch's clip, then devices on a fake GPU."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    from verl.utils import fsdp_utils
    from verl.utils import grad_norm as grad_norm_mod
    from verl.utils.fsdp_mesh import build_fsdp_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)

    def sharded_grads():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        model = fsdp_utils.apply_fsdp2(
            model,
            build_fsdp_mesh("cpu", world, -1),
            fsdp_utils.mixed_precision_policy(device="cpu"),
            layer_cls_names=["Linear"],
        )
        (model(torch.randn(3, 8, generator=torch.Generator().manual_seed(rank))) ** 2).sum().backward()
        return model

    ours, ref = sharded_grads(), sharded_grads()
    norm = clip_grad_norm_on_device(ours.parameters(), 0.5, "cpu")
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5).full_tensor()
    grad_diff = max(
        (a.grad.to_local() - b.grad.to_local()).abs().max().item() for a, b in zip(ours.parameters(), ref.parameters())
    )
    result = {
        "norm": norm.item(),
        "ref_norm": ref_norm.item(),
        "grad_diff": grad_diff,
        "grad_types": {type(p.grad).__name__ for p in ours.parameters()},
        "grad_devices": {p.grad.device.type for p in ours.parameters()},
    }

    fake = sharded_grads()
    reduced_on = []
    real_all_reduce = grad_norm_mod.dist.all_reduce
    grad_norm_mod.dist.all_reduce = lambda tensor, *a, **k: reduced_on.append(tensor.device)  # fake data: record only
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake_norm = clip_grad_norm_on_device(fake.parameters(), 0.5, torch.device("cuda", 0))
    finally:
        grad_norm_mod.dist.all_reduce = real_all_reduce
    result.update(reduced_on=reduced_on, fake_norm_device=fake_norm.device)
    dist.destroy_process_group()
    return result


@pytest.mark.slow  # forked gloo ranks
def test_fsdp2_sharded_gradients_reduce_on_the_compute_device_and_match_torch():
    for r in run_gloo_ranks(_fsdp_job, 2, timeout_s=300):
        assert r["grad_types"] == {"DTensor"} and r["grad_devices"] == {"cpu"}
        assert r["norm"] == pytest.approx(r["ref_norm"], rel=1e-6) and r["norm"] > 0.5  # clipping happened
        assert r["grad_diff"] < 1e-7
        # one all-reduce (one mesh, sharded on one dim), on the accelerator; none on the host
        assert r["reduced_on"] == [torch.device("cuda", 0)]
        assert r["fake_norm_device"] == torch.device("cuda", 0)


def test_the_actor_clips_through_it_when_given_a_device(monkeypatch):
    """dp_actor uses the device-side clip when the worker passes ``grad_norm_device`` (param_offload on GPU)."""
    from luffy_pool.config.compose import actor_config
    from verl.utils import grad_norm as grad_norm_mod
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    calls = []
    real = grad_norm_mod.clip_grad_norm_on_device

    def spy(parameters, max_norm, device):
        calls.append((max_norm, torch.device(device)))
        return real(parameters, max_norm, device)

    monkeypatch.setattr(grad_norm_mod, "clip_grad_norm_on_device", spy)
    model = torch.nn.Linear(3, 2)
    cfg = actor_config(grad_clip=1.0)
    for device, expected in ((None, []), ("cpu", [(1.0, torch.device("cpu"))])):
        calls.clear()
        actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.1), grad_norm_device=device)
        model(torch.randn(4, 3)).sum().backward()
        assert actor._optimizer_step() > 0
        assert calls == expected


@pytest.mark.parametrize(
    "param_offload,device,expected",
    [
        (True, "cuda", torch.device("cuda", 3)),  # host-resident gradients, NCCL group: reduce on the GPU
        (False, "cuda", None),  # gradients on the GPU: torch's own clip
        (True, "cpu", None),  # CPU run: gloo reduces host tensors
        (False, "cpu", None),
    ],
)
def test_the_worker_picks_the_reduce_device_from_param_offload_and_the_run_device(param_offload, device, expected):
    from verl.utils.grad_norm import grad_norm_device

    assert grad_norm_device(param_offload, device, torch.device("cuda", 3)) == expected
