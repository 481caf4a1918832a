"""AdamW step-kernel choice (optim.step_impl): the kwargs each setting maps to, and the same update rule."""

import pytest
import torch

from verl.utils.optim import STEP_IMPLS, adamw_kernel_kwargs, build_adamw


def test_kernel_kwargs_per_setting():
    cpu = [torch.zeros(3)]
    assert adamw_kernel_kwargs("auto", cpu) == {"fused": True}  # CPU: torch would pick its per-tensor loop
    assert adamw_kernel_kwargs("auto", [torch.zeros(3, device="meta")]) == {}  # elsewhere: torch's own default
    assert adamw_kernel_kwargs("fused", cpu) == {"fused": True}
    assert adamw_kernel_kwargs("foreach", cpu) == {"foreach": True}
    assert adamw_kernel_kwargs("for_loop", cpu) == {"foreach": False}
    with pytest.raises(ValueError, match="optim.step_impl must be one of .*got 'fast'"):
        adamw_kernel_kwargs("fast", cpu)


def _three_steps(step_impl: str) -> torch.Tensor:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 5))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    opt = build_adamw([weight, frozen], lr=0.1, betas=[0.9, 0.99], weight_decay=0.01, step_impl=step_impl)
    assert len(opt.param_groups[0]["params"]) == 1  # frozen parameters stay out
    for k in range(3):
        opt.zero_grad()
        ((weight * (k + 1)) ** 2).sum().backward()
        opt.step()
    return weight.detach()


def test_every_kernel_applies_the_same_update():
    reference = _three_steps("for_loop")
    torch.manual_seed(0)
    assert not torch.allclose(reference, torch.randn(4, 5))  # the steps moved the weights
    for impl in STEP_IMPLS:
        assert torch.allclose(_three_steps(impl), reference, atol=1e-6), impl
