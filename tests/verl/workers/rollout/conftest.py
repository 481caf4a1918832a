"""Fixtures of the rollout tests that check an engine against the HF model it serves."""

import pytest
import torch

from verl.workers.rollout.base import SamplingSpec


def _hf_greedy(model, prompt, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(model, prompt, completion, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The tiny model in HF transformers, fp32, eval mode: what every engine's output is compared with."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    """Six seeded prompts of different lengths (3 to 12 tokens)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (5, 9, 3, 7, 12, 4)]


@pytest.fixture(scope="session")
def hf_greedy():
    """``hf_greedy(model, prompt, n)``: HF ``generate``'s greedy ``n`` tokens after ``prompt`` (EOS ignored)."""
    return _hf_greedy


@pytest.fixture(scope="session")
def hf_logprobs():
    """``hf_logprobs(model, prompt, completion, temperature=1.0)``: the model's log-probs of the ``completion``
    tokens after ``prompt``, logits divided by ``temperature``."""
    return _hf_logprobs


@pytest.fixture
def check_capped_greedy(reference, prompts):
    """``check_capped_greedy(rollout)``: greedy generation of ``prompts`` with per-row caps (a 0 cap skips the
    row) gives each row exactly its cap of tokens, the reference's greedy tokens and their log-probs."""

    def check(rollout):
        caps = [6, 0, 10, 3, 8, 1]
        out = rollout.generate_token_ids(
            prompts, caps, SamplingSpec(temperature=0.0, return_logprobs=True, ignore_eos=True)
        )
        for prompt, cap, ids, lps in zip(prompts, caps, out.token_ids, out.logprobs):
            assert len(ids) == len(lps) == cap
            if cap:
                assert ids == _hf_greedy(reference, prompt, cap)
                assert torch.allclose(torch.as_tensor(lps), _hf_logprobs(reference, prompt, ids), atol=1e-5)

    return check
