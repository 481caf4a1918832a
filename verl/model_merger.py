"""Convert a sharded actor checkpoint into a Hugging Face folder: ``python -m verl.model_merger``.

Reads the DCP ``model/`` shards of a checkpoint written by any number of ranks (no process group, one
CPU process), takes config, generation config and tokenizer from the checkpoint's ``huggingface/``
folder, and writes safetensors weights that ``transformers.AutoModelForCausalLM.from_pretrained`` and
vLLM load directly.

    python -m verl.model_merger --ckpt checkpoints/proj/exp/global_step_50 --out hf/step50 [--dtype bfloat16]

``--ckpt`` may be a run root (its ``latest_checkpointed_iteration.txt`` is followed), a
``global_step_<N>`` directory or its ``actor/`` directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import torch

from verl.utils.checkpoint import layout
from verl.utils.checkpoint.hf_export import load_dcp_model_state, write_hf_folder

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def merge_checkpoint(ckpt: str, out: str, dtype: Optional[str] = None, hf_config_dir: Optional[str] = None) -> str:
    """Write the HF folder for ``ckpt`` into ``out``; returns ``out``.

    ``dtype`` None keeps the stored precision (fp32 master weights); ``hf_config_dir`` overrides where
    config and tokenizer come from (default: the checkpoint's ``huggingface/``).
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    actor_dir = layout.resolve_actor_dir(ckpt)
    model_dir = os.path.join(actor_dir, layout.MODEL_DIR)
    if not layout.has_sharded_model(actor_dir):
        raise FileNotFoundError(
            f"{actor_dir} has no sharded weights ({layout.MODEL_DIR}/.metadata); pruned by "
            f"trainer.max_optim_to_keep? Its {layout.HF_DIR}/ may hold weights if saved with save_hf"
        )
    hf_dir = hf_config_dir or os.path.join(actor_dir, layout.HF_DIR)
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(f"{hf_dir}/config.json not found; pass --hf-config DIR (the base model folder)")
    hf_config = AutoConfig.from_pretrained(hf_dir)
    generation_config = None
    if os.path.exists(os.path.join(hf_dir, "generation_config.json")):
        generation_config = GenerationConfig.from_pretrained(hf_dir)
    tokenizer = None
    if any(os.path.exists(os.path.join(hf_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    state = load_dcp_model_state(model_dir)
    if os.path.abspath(out) == os.path.abspath(actor_dir):
        raise ValueError("--out must differ from the checkpoint directory")
    write_hf_folder(
        out,
        state,
        hf_config,
        tokenizer=tokenizer,
        generation_config=generation_config,
        dtype=DTYPES[dtype] if dtype else None,
    )
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ckpt", "--local_dir", dest="ckpt", required=True, help="run root, global_step_<N> dir, or its actor/ dir"
    )
    parser.add_argument("--out", "--target_dir", dest="out", required=True, help="output HF folder")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="cast weights (default: as stored)")
    parser.add_argument(
        "--hf-config",
        dest="hf_config",
        default=None,
        help="folder with config.json/tokenizer (default: the checkpoint's huggingface/)",
    )
    args = parser.parse_args(argv)
    out = merge_checkpoint(args.ckpt, args.out, dtype=args.dtype, hf_config_dir=args.hf_config)
    print(f"wrote {out} ({layout.dir_size_bytes(out) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
