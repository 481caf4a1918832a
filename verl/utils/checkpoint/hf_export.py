"""Turn actor weights into a Hugging Face folder that transformers and vLLM load directly.

Two sources: a live FSDP2 module (``gather_full_state_dict``: a collective; rank 0 receives the full,
CPU-offloaded state dict) and a DCP ``model/`` directory on disk (``load_dcp_model_state``: no process
group needed, used by ``python -m verl.model_merger``). Both end in ``write_hf_folder``, which builds
the HF model on the meta device, assigns the tensors and calls ``save_pretrained`` (safetensors).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU state dict on rank 0, ``{}`` on the other ranks. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not (dist.is_available() and dist.is_initialized()):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    # cpu_offload=True makes the result rank-0-only and keeps it off the accelerator (docs/CPU_STACK.md §3).
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_dcp_model_state(model_dir: str) -> dict[str, torch.Tensor]:
    """Read a whole DCP model directory into plain CPU tensors in this one process (any save world size)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from verl.utils.checkpoint.safe_io import dcp_load, safe_reader

    if not os.path.exists(os.path.join(model_dir, ".metadata")):
        raise FileNotFoundError(f"{model_dir} is not a DCP checkpoint directory (no .metadata file)")
    reader = safe_reader(model_dir)  # DCP metadata is a pickle: read it with the restricted unpickler
    metadata = reader.read_metadata()
    state: dict[str, Any] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            raise ValueError(f"{model_dir}: entry {key!r} is not a tensor; is this an optimizer directory?")
        state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with warnings.catch_warnings():
        # DCP warns that it "assumes" single-process loading even when no_dist=True says so.
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp_load(state, model_dir, no_dist=True)
    return state


def build_hf_model(hf_config, state_dict: dict[str, torch.Tensor], dtype: Optional[torch.dtype] = None):
    """An HF causal LM for ``hf_config`` whose parameters are exactly the given tensors."""
    from transformers import AutoModelForCausalLM

    if dtype is not None:
        state_dict = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state_dict.items()}
    target_dtype = dtype or next((v.dtype for v in state_dict.values() if v.is_floating_point()), torch.float32)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=target_dtype)
    expected = set(model.state_dict().keys())
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    tied_only = missing == ["lm_head.weight"] and getattr(hf_config, "tie_word_embeddings", False)
    if unexpected or (missing and not tied_only):
        raise ValueError(
            f"state dict does not match {type(model).__name__}: missing {missing[:5]} "
            f"unexpected {unexpected[:5]} ({len(missing)} / {len(unexpected)} in all)"
        )
    model.load_state_dict(state_dict, strict=False, assign=True)
    if getattr(hf_config, "tie_word_embeddings", False):
        model.tie_weights()
    model.config.dtype = target_dtype
    return model


def write_hf_folder(
    out_dir: str,
    state_dict: dict[str, torch.Tensor],
    hf_config,
    tokenizer=None,
    generation_config=None,
    dtype: Optional[torch.dtype] = None,
) -> str:
    """``save_pretrained`` of the weights (+ tokenizer, generation config) into ``out_dir``."""
    model = build_hf_model(hf_config, state_dict, dtype=dtype)
    if generation_config is not None:
        model.generation_config = generation_config
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
