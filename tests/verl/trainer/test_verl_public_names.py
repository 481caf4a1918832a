"""verl's public names that users' own losses and scripts import keep verl's behaviour: ``from verl import
DataProto``, ``core_algos.agg_loss`` (verl's four ``loss_agg_mode`` values and its global-batch arguments),
``core_algos.compute_entropy_loss`` and ``kl_penalty``'s k1/k2/k3 names, compared with the values verl's own
functions gave on the same seeded tensors (tests/data/verl_reference/README.md says which commit)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

REFERENCE = pathlib.Path(__file__).resolve().parents[2] / "data" / "verl_reference" / "core_algos_reference.pt"
MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE, weights_only=True)


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


def test_from_verl_import_dataproto_is_the_protocol_class():
    import verl
    from verl import DataProto
    from verl.protocol import DataProto as protocol_dataproto

    assert DataProto is protocol_dataproto
    with pytest.raises(AttributeError, match="no attribute 'NotAName'"):
        verl.NotAName  # noqa: B018
    # loaded on first use: importing the package alone (the config checker) pulls in no torch
    probe = "import sys, verl; assert 'torch' not in sys.modules and 'verl.protocol' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=REFERENCE.parents[3])


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_equals_verls_in_every_mode(ref, mode):
    from verl.trainer.ppo.core_algos import agg_loss

    x = ref["inputs"]
    assert x["loss_mask"][2].sum() == 0  # a fully masked row: verl's seq modes leave it out of the mean
    _close(agg_loss(x["loss_mat"], x["loss_mask"], mode), ref["agg_loss"][mode])
    _close(
        agg_loss(x["loss_mat"], x["loss_mask"], loss_agg_mode=mode, **ref["agg_loss_global_args"]),
        ref["agg_loss_global"][mode],
    )


@pytest.mark.parametrize("mode", MODES)
def test_compute_entropy_loss_equals_verls(ref, mode):
    from verl.trainer.ppo.core_algos import compute_entropy_loss

    x = ref["inputs"]
    _close(compute_entropy_loss(x["logits"], x["loss_mask"], loss_agg_mode=mode), ref["compute_entropy_loss"][mode])


def test_agg_loss_names_the_valid_modes():
    from verl.trainer.ppo.core_algos import agg_loss

    with pytest.raises(ValueError, match=r"unknown loss_agg_mode 'seq-mean'.*'seq-mean-token-sum-norm'"):
        agg_loss(torch.ones(1, 2), torch.ones(1, 2), "seq-mean")


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_penalty_names_equal_verls(ref, name):
    from verl.trainer.ppo.core_algos import kl_penalty

    x = ref["inputs"]
    _close(kl_penalty(x["logprob"], x["ref_logprob"], name), ref["kl_penalty"][name])
    if name in ("low_var_kl", "k3"):  # the two |d| > 20 tokens reach the clamp, in verl and here
        assert ref["kl_penalty"][name][4, :2].tolist() == [10.0, 10.0]
