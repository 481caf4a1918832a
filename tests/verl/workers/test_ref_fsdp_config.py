"""``ref.fsdp_config.param_dtype`` / ``reduce_dtype`` / ``reshard_after_forward`` act on the reference module the
worker builds (they follow the actor's keys by default, and can be set apart)."""

import os

import pytest
import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

from tests.helpers.distributed_testing import run_gloo_ranks

REF = "actor_rollout_ref.ref.fsdp_config"


def _job(rank, world, port, cfg, out_path):
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    from verl.workers.config_sections import WorkerSections

    worker = ActorRolloutRefWorker(
        WorkerSections.from_config(OmegaConf.create(cfg).actor_rollout_ref), role="ref", device="cpu"
    )
    worker.init_model()
    ids = torch.randint(3, worker.ref_module.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = worker.ref_module(input_ids=ids).logits
    # a decoder layer's unit (the root never reshards after forward in FSDP2)
    group = worker.ref_module.model.layers[0]._get_fsdp_state()._fsdp_param_group
    torch.save(
        {
            "logits_dtype": str(logits.dtype),
            "reduce_dtype": str(group.mp_policy.reduce_dtype),
            "reshard": bool(group.post_forward_mesh_info is not None),
        },
        f"{out_path}_rank{rank}.pt",
    )
    dist.destroy_process_group()


def _ref_module_facts(compose_config, tiny_model_dir, tmp_path, name, *overrides):
    from omegaconf import OmegaConf

    cfg = compose_config(
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.attn_implementation=sdpa",
            "actor_rollout_ref.rollout.name=hf",
            *overrides,
        ]
    )
    out = str(tmp_path / name)
    run_gloo_ranks(_job, 1, OmegaConf.to_container(cfg, resolve=True), out, timeout_s=240)
    return torch.load(f"{out}_rank0.pt")


@pytest.mark.slow  # a forked gloo rank building the FSDP2 reference module, three times
def test_reference_dtype_and_resharding_follow_its_own_keys(compose_config, tiny_model_dir, tmp_path):
    default = _ref_module_facts(compose_config, tiny_model_dir, tmp_path, "default")
    assert default == {"logits_dtype": "torch.float32", "reduce_dtype": "torch.float32", "reshard": True}
    bf16 = _ref_module_facts(
        compose_config,
        tiny_model_dir,
        tmp_path,
        "bf16",
        f"{REF}.param_dtype=bf16",
        f"{REF}.reduce_dtype=bf16",
        f"{REF}.reshard_after_forward=False",
    )
    assert bf16 == {"logits_dtype": "torch.bfloat16", "reduce_dtype": "torch.bfloat16", "reshard": False}
    # the reference follows the actor's keys unless set apart (YAML interpolation)
    follows = _ref_module_facts(
        compose_config, tiny_model_dir, tmp_path, "follows", "actor_rollout_ref.actor.fsdp_config.param_dtype=bf16"
    )
    assert follows["logits_dtype"] == "torch.bfloat16"
