"""Float comparisons for golden and parity tests that hold on any x86 CPU.

torch picks its vectorised kernels by the CPU (``ATEN_CPU_CAPABILITY``: default, avx2, avx512; oneDNN and MKL by
their own dispatch), and a reduction summed 8 or 16 lanes at a time rounds differently: a float32 loss or gradient
recorded on an AVX2 machine differs from the same computation on an AVX-512 one in the last bit or two. So a
golden value computed by floating-point reductions, or the same quantity computed along two code paths, is
compared within a few units in the last place (ulps) of its own scale; exact equality is kept only where the
arithmetic is order-free (integers, masks, selections and copies, a value computed by the very same function).

The bound is ``|a - e| <= ulps * eps(dtype) * max(|e|, scale)`` element-wise, where ``scale`` is the largest
``|e|`` of the tensor: a summed element's rounding error is relative to the size of the terms it sums, which the
tensor's largest value stands for, not to its own (possibly cancelled, near-zero) size. NaN must sit where the
expected NaN sits; shapes and dtypes must be equal.
"""

from __future__ import annotations

import torch

# A reduction's result moves by a few ulps between lane widths (seen: at most ~1 ulp of the tensor's scale between
# AVX2 and AVX-512 on the family's float32 gradients); 8 leaves room for a deeper reduction tree, and is still far
# below any change of the math (a wrong term moves a value by ~1e-3 of its scale or more).
DEFAULT_ULPS = 8


def float_close_report(actual: torch.Tensor, expected: torch.Tensor, ulps: int = DEFAULT_ULPS) -> str:
    """'' when ``actual`` equals ``expected`` within ``ulps`` of the tensor's scale, else why not (one line)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    if not expected.is_floating_point():
        return "" if torch.equal(actual, expected) else "integer tensors differ (compared exactly)"
    a, e = actual.detach().double(), expected.detach().double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        return "NaN positions differ"
    a, e = a[~nan_e], e[~nan_e]
    if a.numel() == 0:
        return ""
    inf = torch.isinf(e)
    if not torch.equal(a[inf], e[inf]):
        return "infinities differ"
    a, e = a[~inf], e[~inf]
    if a.numel() == 0:
        return ""
    eps = torch.finfo(expected.dtype).eps
    scale = e.abs().max()
    bound = ulps * eps * torch.maximum(e.abs(), scale)
    excess = (a - e).abs() - bound
    if (excess > 0).any():
        worst = int(torch.argmax(excess))
        return (
            f"{int((excess > 0).sum())} of {e.numel()} elements beyond {ulps} ulps of scale {float(scale):.3g}; "
            f"worst: {float(a[worst]):.10g} vs {float(e[worst]):.10g}"
        )
    return ""


def float_close(actual, expected, ulps: int = DEFAULT_ULPS) -> bool:
    return not float_close_report(actual, expected, ulps)


def assert_float_close(actual, expected, ulps: int = DEFAULT_ULPS, what: str = "") -> None:
    """Assert ``actual`` equals ``expected`` within ``ulps`` (see the module docstring); ``what`` names the value."""
    why = float_close_report(actual, expected, ulps)
    assert not why, f"{what}: {why}" if what else why
