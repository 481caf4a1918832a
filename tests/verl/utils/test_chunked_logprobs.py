"""Chunked LM-head log-probs/entropy: hand values, equality with the dense path (values and gradients,
fp32 and bf16), and no [tokens, V] tensor kept for backward."""

import math

import pytest
import torch

from verl.utils.chunked_logprobs import chunked_logprobs_entropy, dense_logprobs_entropy

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


def test_hand_case_two_tokens_three_words():
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    labels = torch.tensor([0, 2])
    z = math.log(math.e + 2)  # both rows' logits are a permutation of (1, 0, 0)
    entropy = z - math.e / (math.e + 2)
    for chunk in (1, 2, 8):
        lp, ent = chunked_logprobs_entropy(hidden, weight, labels, chunk_size=chunk)
        assert torch.allclose(lp, torch.tensor([1 - z, -z]), atol=1e-6)
        assert torch.allclose(ent, torch.tensor([entropy, entropy]), atol=1e-6)
    # temperature 2: logits (0.5, 0, 0)
    z2 = math.log(math.exp(0.5) + 2)
    lp, _ = chunked_logprobs_entropy(hidden, weight, labels, temperature=2.0, chunk_size=1)
    assert torch.allclose(lp, torch.tensor([0.5 - z2, -z2]), atol=1e-6)


def _inputs(dtype, T=37, H=16, V=50, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 0.5).to(dtype)
    b = (torch.randn(V, generator=g) * 0.1).to(dtype) if bias else None
    labels = torch.randint(0, V, (T,), generator=g)
    return h, w, b, labels


def _run(fn, h, w, b, labels, g_lp, g_ent, **kw):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (h, w, b)]
    lp, ent = fn(leaves[0], leaves[1], labels, bias=leaves[2], **kw)
    loss = (lp * g_lp).sum() + ((ent * g_ent).sum() if ent is not None else 0)
    loss.backward()
    return lp.detach(), (ent.detach() if ent is not None else None), [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_fp32_values_and_gradients_equal_the_dense_path(chunk, temperature, with_entropy):
    h, w, b, labels = _inputs(torch.float32, bias=True)
    g = torch.Generator().manual_seed(1)
    g_lp, g_ent = torch.randn(len(labels), generator=g), torch.randn(len(labels), generator=g)
    kw = dict(temperature=temperature, with_entropy=with_entropy)
    lp, ent, grads = _run(chunked_logprobs_entropy, h, w, b, labels, g_lp, g_ent, chunk_size=chunk, **kw)
    lp_d, ent_d, grads_d = _run(dense_logprobs_entropy, h, w, b, labels, g_lp, g_ent, **kw)
    assert lp.dtype == torch.float32 and torch.allclose(lp, lp_d, atol=1e-5)
    if with_entropy:
        assert torch.allclose(ent, ent_d, atol=1e-5)
    else:
        assert ent is None
    for ours, ref in zip(grads, grads_d):
        assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk", [5, 100])
def test_bf16_matches_the_dense_path_to_bf16_rounding(chunk):
    """bf16 head: same values (matmul in bf16, softmax in fp32); gradients within bf16 rounding of the dense
    path's, measured against an fp64 evaluation of the same bf16 inputs."""
    h, w, _, labels = _inputs(torch.bfloat16, T=40, H=32, V=64)
    g = torch.Generator().manual_seed(2)
    g_lp, g_ent = torch.randn(len(labels), generator=g), torch.randn(len(labels), generator=g)
    lp, ent, (gh, gw, _) = _run(chunked_logprobs_entropy, h, w, None, labels, g_lp, g_ent, chunk_size=chunk)
    lp_d, ent_d, (gh_d, gw_d, _) = _run(dense_logprobs_entropy, h, w, None, labels, g_lp, g_ent)
    assert gh.dtype == gw.dtype == torch.bfloat16
    assert torch.allclose(lp, lp_d, atol=1e-5) and torch.allclose(ent, ent_d, atol=1e-5)
    _, _, (gh_x, gw_x, _) = _run(
        dense_logprobs_entropy, h.double(), w.double(), None, labels, g_lp.double(), g_ent.double()
    )
    for ours, dense, exact in ((gh, gh_d, gh_x), (gw, gw_d, gw_x)):
        err, err_dense = (ours.double() - exact).abs().max(), (dense.double() - exact).abs().max()
        assert err <= 2 * err_dense + 1e-3 * exact.abs().max(), (err, err_dense)


def test_no_grad_path_equals_the_autograd_path_and_empty_input():
    h, w, _, labels = _inputs(torch.float32)
    with torch.no_grad():
        lp, ent = chunked_logprobs_entropy(h, w, labels, chunk_size=4)
    lp2, ent2 = chunked_logprobs_entropy(h.requires_grad_(), w, labels, chunk_size=4)
    # exact: both paths run _chunk_logits / _chunk_forward on the same chunks (the same arithmetic)
    assert torch.equal(lp, lp2.detach()) and torch.equal(ent, ent2.detach())
    lp0, ent0 = chunked_logprobs_entropy(h[:0].detach(), w, labels[:0], chunk_size=4)
    assert lp0.shape == ent0.shape == (0,)


def test_backward_keeps_no_vocab_sized_activation():
    """Saved for backward: inputs and [T] results only, never a [T, V] logits/probs tensor."""
    T, H, V = 64, 8, 1000
    h, w, _, labels = _inputs(torch.float32, T=T, H=H, V=V)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    hw = [h.requires_grad_(), w.requires_grad_()]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = chunked_logprobs_entropy(*hw, labels, chunk_size=16)
        (lp.sum() + ent.sum()).backward()
    assert (T, V) not in saved and all(math.prod(s) <= V * H for s in saved), saved
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        saved.clear()
        dense_logprobs_entropy(*hw, labels)
    assert (T, V) in saved  # the check above can see a dense tensor


def test_bad_arguments_raise():
    h, w, _, labels = _inputs(torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs_entropy(h, w, labels, chunk_size=0)
    with pytest.raises(ValueError, match="labels"):
        chunked_logprobs_entropy(h, w, labels[:-1])
    with pytest.raises(ValueError, match="hidden"):
        chunked_logprobs_entropy(h, w.t(), labels)
