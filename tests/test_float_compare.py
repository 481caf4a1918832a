"""tests/helpers/float_compare.py: the ulp comparison the golden and parity tests use across CPUs."""

import pytest
import torch

from tests.helpers.float_compare import assert_float_close, float_close, float_close_report

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


def test_last_bit_differences_pass_and_real_changes_fail():
    e = torch.tensor([1.0, -0.5, 3e-9, 0.0], dtype=torch.float32)
    one_ulp = torch.nextafter(e, torch.full_like(e, 10.0))
    assert float_close(one_ulp, e)
    # a near-zero element is judged at the tensor's scale (1.0), as its rounding error is: 1e-7 absolute passes ...
    assert float_close(e + torch.tensor([0.0, 0.0, 1e-7, 1e-7]), e)
    # ... a change the size of a wrong term does not
    assert not float_close(e + torch.tensor([1e-4, 0.0, 0.0, 0.0]), e)
    assert "beyond 8 ulps" in float_close_report(e * (1 + 1e-5), e)


def test_nan_inf_shape_dtype_and_integers():
    nan = torch.tensor([float("nan"), 1.0])
    assert float_close(nan.clone(), nan)
    assert float_close_report(torch.tensor([0.0, 1.0]), nan) == "NaN positions differ"
    assert float_close_report(torch.tensor([float("inf")]), torch.tensor([-float("inf")])) == "infinities differ"
    assert "shape" in float_close_report(torch.zeros(2), torch.zeros(3))
    assert "dtype" in float_close_report(torch.zeros(2, dtype=torch.float64), torch.zeros(2))
    assert float_close(torch.tensor([1, 2]), torch.tensor([1, 2]))
    assert "exactly" in float_close_report(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert float_close(torch.tensor(float("nan")), torch.tensor(float("nan")))  # a 0-d NaN loss (no SFT rows)


def test_the_assertion_names_the_value():
    with pytest.raises(AssertionError, match="grad: 1 of 2 elements"):
        assert_float_close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]), what="grad")


def test_float64_goldens_get_float64_ulps():
    e = torch.tensor([1.0], dtype=torch.float64)
    assert float_close(e + 1e-15, e) and not float_close(e + 1e-12, e)
