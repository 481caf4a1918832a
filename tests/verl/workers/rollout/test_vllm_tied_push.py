"""A vLLM-CPU engine of a model with tied embeddings generates from the pushed LM head, not the one it loaded.

The CPU backend computes each linear layer from a copy of its weight packed when the layer was processed. A tied
head shares the embedding's parameter but receives no tensor in a push, so without a re-pack
(``worker_extension.repack_tied_cpu_weights``) it kept the random weights of ``load_format=dummy_dtensor``: the
engine's log-probs sat near log(1/vocab) while the actor's moved (found by exp_scripts/gpu_smoke.py's
engine-vs-actor check). Here: a tiny model shrunk from Qwen2.5-Math-1.5B (tied), pushed whole and in buckets; the
engine's log-probs equal HF's.
"""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.sections import engine_section
from verl.workers.sharding_manager import FSDPShardingManager

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

CONFIG = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "data", "model_configs", "Qwen--Qwen2.5-Math-1.5B.json"
)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory):
    from luffy_pool.tiny.model import TinyModelSpec, build_tiny_model

    with open(CONFIG) as f:
        real = json.load(f)
    assert real["tie_word_embeddings"] is True
    return build_tiny_model(str(tmp_path_factory.mktemp("tied")), TinyModelSpec(), model_config=real)


def _engine_logprobs(rollout, seq):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = rollout.llm.generate(
        [TokensPrompt(prompt_token_ids=seq)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
        use_tqdm=False,
    )[0]
    return torch.tensor([step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], seq[1:])])


def test_a_tied_head_follows_every_push(tied_model_dir, hf_logprobs):
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    reference = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32).eval()
    assert reference.lm_head.weight.data_ptr() == reference.model.embed_tokens.weight.data_ptr()
    seq = torch.randint(3, 300, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    rollout = VLLMRollout(
        tied_model_dir,
        engine_section(
            prompt_length=64,
            response_length=64,
            dtype="float32",
            seed=0,
            cpu_kv_cache_bytes=16 * 2**20,
            load_format="dummy_dtensor",
        ),
    )
    try:
        for bucket_bytes in (2**30, 4096):  # whole, then in buckets (one reload fed bucket by bucket)
            with torch.no_grad():  # a different model each time: the head must move with it
                for p in reference.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            FSDPShardingManager(reference, rollout, bucket_bytes=bucket_bytes).sync_weights()
            got = _engine_logprobs(rollout, seq)
            want = hf_logprobs(reference, seq[:1], seq[1:])
            assert torch.allclose(got, want, atol=1e-4), (bucket_bytes, (got - want).abs().max())
    finally:
        rollout.shutdown()
