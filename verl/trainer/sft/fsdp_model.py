"""The SFT model side: an HF causal LM sharded with FSDP2, its AdamW + warm-up schedule, and HF export.

The model is built as the RL worker builds its actor (verl/workers/fsdp_workers.py): parameters on the meta
device, optional gradient checkpointing, each decoder layer and the root sharded with ``fully_shard``
(verl/utils/fsdp_utils.py), then each rank allocates and reads from the checkpoint only its own shards in
fp32 (master weights; verl/utils/meta_init.py), so no rank ever holds the whole model. Compute runs in
``param_dtype`` (bf16 on GPU). Export gathers the full state dict on rank 0 and writes a
``save_pretrained`` folder (weights in the base checkpoint's dtype, plus tokenizer and generation config)
that the RL trainer takes as ``actor_rollout_ref.model.path``.
"""

from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist

from verl.utils.fsdp_utils import apply_fsdp2, cpu_offload_policy, mixed_precision_policy, to_torch_dtype


def resolve_device(device: str) -> str:
    """``auto`` -> cuda when a GPU is visible, else cpu; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is visible")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"trainer.device must be auto, cpu or cuda, got {device!r}")
    return device


def resolve_attn_implementation(name: str, device: str) -> str:
    """``auto`` -> flash_attention_2 on cuda when flash-attn is importable, else sdpa."""
    from verl.utils.attn_impl import resolve_attn_implementation as resolve

    return resolve(name, device, key="model.attn_implementation")


def _param_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return to_torch_dtype(name)


def build_fsdp_model(model_cfg, device: str, mesh) -> torch.nn.Module:
    """Base weights from ``model_cfg.path`` as an FSDP2-sharded, trainable module on ``device``."""
    from transformers import AutoConfig

    from verl.utils.meta_init import empty_model, materialize

    remote = bool(model_cfg.trust_remote_code)
    hf_config = AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=remote)
    hf_config.use_cache = False
    module = empty_model(
        hf_config,
        torch.float32,
        resolve_attn_implementation(model_cfg.attn_implementation, device),
        trust_remote_code=remote,
    )
    if model_cfg.enable_gradient_checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fsdp_cfg = model_cfg.fsdp_config
    offload = cpu_offload_policy(bool(fsdp_cfg.param_offload), device)
    module = apply_fsdp2(
        module,
        mesh,
        mp_policy=mixed_precision_policy(_param_dtype(fsdp_cfg.param_dtype, device), fsdp_cfg.reduce_dtype, device),
        reshard_after_forward=bool(fsdp_cfg.reshard_after_forward),
        offload_policy=offload,
    )
    # with CPU offload the shards live in host memory; FSDP2 copies them to the GPU per layer
    return materialize(module, model_cfg.path, "cpu" if offload is not None else device)


def build_optimizer(module: torch.nn.Module, optim_cfg, total_steps: int):
    """AdamW and its LR schedule: linear warm-up over ``int(warmup_steps_ratio x total_steps)`` steps, then
    cosine down to ``min_lr_ratio`` or constant (schedules of verl/utils/torch_functional.py)."""
    from verl.utils.optim import build_adamw
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    optimizer = build_adamw(
        module.parameters(),
        lr=optim_cfg.lr,
        betas=optim_cfg.betas,
        weight_decay=optim_cfg.weight_decay,
        step_impl=optim_cfg.get("step_impl", "auto"),
    )
    warmup = int(optim_cfg.warmup_steps_ratio * total_steps)
    if optim_cfg.warmup_style == "cosine":
        scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, total_steps, min_lr_ratio=optim_cfg.min_lr_ratio)
    elif optim_cfg.warmup_style == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
    else:
        raise ValueError(f"optim.warmup_style must be cosine or constant, got {optim_cfg.warmup_style!r}")
    return optimizer, scheduler


def clip_grad_norm(module: torch.nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm over all shards; returns the norm before clipping (a plain float)."""
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm=max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _stored_dtype(hf_config) -> torch.dtype:
    """The dtype the base checkpoint was saved in (fp32 when the config does not say)."""
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    return to_torch_dtype(str(value)) if value else torch.float32


def save_hf_folder(
    module: torch.nn.Module, out_dirs: list[str], base_path: str, tokenizer, trust_remote_code: bool = False
) -> None:
    """Gather the full weights (every rank must call) and write them as HF folders on rank 0.

    The first folder is written to a temporary sibling and renamed into place, so a reader never sees a
    half-written folder; further folders are copies of it.
    """
    from transformers import AutoConfig, GenerationConfig

    from verl.utils.checkpoint.hf_export import gather_full_state_dict, write_hf_folder
    from verl.utils.checkpoint.layout import publish_dir

    state = gather_full_state_dict(module)
    if dist.get_rank() == 0:
        hf_config = AutoConfig.from_pretrained(base_path, trust_remote_code=trust_remote_code)
        try:
            generation_config = GenerationConfig.from_pretrained(base_path)
        except OSError:
            generation_config = None
        first = os.path.abspath(out_dirs[0])
        tmp = os.path.join(os.path.dirname(first), f".tmp_{os.path.basename(first)}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        write_hf_folder(
            tmp,
            state,
            hf_config,
            tokenizer=tokenizer,
            generation_config=generation_config,
            dtype=_stored_dtype(hf_config),
        )
        publish_dir(tmp, first)
        for other in out_dirs[1:]:
            other_tmp = os.path.join(
                os.path.dirname(os.path.abspath(other)), f".tmp_{os.path.basename(other)}.{os.getpid()}"
            )
            shutil.rmtree(other_tmp, ignore_errors=True)
            os.makedirs(os.path.dirname(other_tmp), exist_ok=True)
            shutil.copytree(first, other_tmp)
            publish_dir(other_tmp, other)
    del state
    dist.barrier()
