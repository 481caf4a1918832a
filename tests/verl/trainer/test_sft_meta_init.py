"""H5: the SFT trainer builds its model on the meta device and each rank reads only its shards.

Two gloo ranks build the trainer twice, once with today's ``build_fsdp_model`` (meta init) and once with the
former path (``from_pretrained`` of the full fp32 model on every rank, then ``fully_shard``, written out here
as the reference): the gathered weights must be identical, and so must the first step's loss and gradient
norm on the same global batch.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.distributed_testing import run_gloo_ranks


def _from_pretrained_model(model_cfg, device, mesh):
    """The former SFT model build: the whole fp32 model on every rank, then sharding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.trainer.sft.fsdp_model import _param_dtype, resolve_attn_implementation
    from verl.utils.fsdp_utils import apply_fsdp2, mixed_precision_policy

    hf_config = AutoConfig.from_pretrained(model_cfg.path)
    hf_config.use_cache = False
    module = AutoModelForCausalLM.from_pretrained(
        model_cfg.path,
        config=hf_config,
        dtype=torch.float32,
        attn_implementation=resolve_attn_implementation(model_cfg.attn_implementation, device),
    )
    fsdp_cfg = model_cfg.fsdp_config
    return apply_fsdp2(
        module,
        mesh,
        mp_policy=mixed_precision_policy(_param_dtype(fsdp_cfg.param_dtype, device), fsdp_cfg.reduce_dtype, device),
        reshard_after_forward=bool(fsdp_cfg.reshard_after_forward),
    )


def _no_full_load(*args, **kwargs):
    raise AssertionError("the SFT model build loaded the whole model with from_pretrained")


def _rank(rank, world, port, overrides):
    from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer, _prepare, sft_process_group
    from verl.trainer.sft import fsdp_model
    from verl.trainer.sft.config import compose_sft_config
    from verl.trainer.sft.dataset import epoch_batches
    from verl.utils.checkpoint.hf_export import gather_full_state_dict
    from transformers import AutoModelForCausalLM

    from_pretrained = AutoModelForCausalLM.from_pretrained
    cfg = _prepare(compose_sft_config(overrides))
    out = {}
    with sft_process_group("cpu"):
        for name, build in (("meta", fsdp_model.build_fsdp_model), ("full", _from_pretrained_model)):
            original = fsdp_model.build_fsdp_model
            fsdp_model.build_fsdp_model = build  # the trainer imports it from the module at build time
            if name == "meta":  # no rank may load the whole model
                AutoModelForCausalLM.from_pretrained = _no_full_load
            try:
                trainer = FSDPSFTTrainer(cfg, "cpu")
            finally:
                fsdp_model.build_fsdp_model = original
                AutoModelForCausalLM.from_pretrained = from_pretrained
            meta_params = sum(p.device.type == "meta" for p in trainer.model.parameters())
            state = gather_full_state_dict(trainer.model)
            rows = epoch_batches(
                len(trainer.train_dataset), cfg.data.train_batch_size, 0, cfg.trainer.seed, cfg.data.shuffle
            )[0]
            metrics = trainer.train_step(rows)
            out[name] = {
                "state": state,
                "loss": metrics["train/loss"],
                "grad_norm": metrics["train/grad_norm"],
                "meta_params": meta_params,
            }
    return out


def test_meta_init_gives_the_from_pretrained_weights_and_first_step_on_two_ranks(
    tiny_model_dir, tiny_task_dir, tmp_path
):
    overrides = [
        f"model.path={tiny_model_dir}",
        f"data.train_files={tiny_task_dir}/train.parquet",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=1",
        "trainer.device=cpu",
        f"trainer.default_local_dir={tmp_path}/out",
        "trainer.logger=[jsonl]",
        "trainer.progress_bar=False",
    ]
    ranks = run_gloo_ranks(_rank, 2, overrides, timeout_s=600)
    rank0 = ranks[0]
    meta, full = rank0["meta"]["state"], rank0["full"]["state"]
    assert meta and sorted(meta) == sorted(full)
    # every tensor, the embedding and a decoder layer's projections included, is the checkpoint's
    for key in meta:
        assert meta[key].dtype == torch.float32 and torch.equal(meta[key], full[key]), key
    for r in ranks:
        assert r["meta"]["meta_params"] == 0  # every shard was materialised
        assert r["meta"]["loss"] == pytest.approx(r["full"]["loss"], abs=1e-7)
        assert r["meta"]["grad_norm"] == pytest.approx(r["full"]["grad_norm"], rel=1e-6)
    assert ranks[0]["meta"]["loss"] == ranks[1]["meta"]["loss"]  # agreed over the ranks


# ---------------------------------------------------------------------------------------------- memory
def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _build_and_measure(rank, world, port, model_dir):
    from omegaconf import OmegaConf

    from verl.trainer.fsdp_sft_trainer import sft_process_group
    from verl.trainer.sft.config import compose_sft_config
    from verl.trainer.sft.fsdp_model import build_fsdp_model
    from verl.utils.fsdp_utils import create_device_mesh

    model_cfg = OmegaConf.create(
        OmegaConf.to_container(
            compose_sft_config([f"model.path={model_dir}", "model.attn_implementation=sdpa"]).model, resolve=True
        )
    )
    with sft_process_group("cpu"):
        mesh = create_device_mesh("cpu")
        # import the model's code outside the measurement (an empty model: no parameter storage)
        from transformers import AutoConfig

        from verl.utils.meta_init import empty_model

        empty_model(AutoConfig.from_pretrained(model_dir), attn_implementation="sdpa")
        base = _rss_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        model = build_fsdp_model(model_cfg, "cpu", mesh)
        peak_kb = _rss_kb("VmHWM") - base
        local = sum(p.to_local().numel() for p in model.parameters())
    return peak_kb, local


@pytest.mark.slow
def test_sft_model_build_peak_rss_per_rank_is_its_shard_not_a_full_fp32_copy(tmp_path):
    """A random Qwen2 of ~0.13B parameters (0.5 GB fp32) on disk, built by the SFT trainer on 2 gloo ranks:
    each rank's peak RSS while building stays near its half (the former from_pretrained build cost a full
    fp32 copy per rank; tests/verl/utils/test_meta_init.py measures that side)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(tmp_path))
    del model
    full_kb = n_params * 4 / 1024
    # spawn: a forked rank would start with the parent's resident pages
    for rank, (peak_kb, local) in enumerate(
        run_gloo_ranks(_build_and_measure, 2, str(tmp_path), timeout_s=600, start_method="spawn")
    ):
        print(f"rank {rank}: SFT build peak +{peak_kb / 1024:.0f} MiB; full fp32 copy {full_kb / 1024:.0f} MiB")
        assert abs(local - n_params / 2) < 0.01 * n_params
        assert peak_kb < 0.65 * full_kb, (peak_kb, full_kb)
