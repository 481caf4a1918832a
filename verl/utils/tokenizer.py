"""One tokenizer loader for the driver, the workers, SFT and eval, and the model's stop ids.

``hf_tokenizer`` loads a tokenizer and gives it a pad token when the model defines none, the same way everywhere
(verl's ``hf_tokenizer`` sets pad = EOS): Llama-3.x ships no pad token, and a driver that pads with one id while a
worker pads with another builds different batches. The pad is the model's own pad token, else Llama-3.1's reserved
``<|finetune_right_pad_id|>`` when the vocabulary has it (meta-llama/llama-models: the token reserved for padding),
else EOS. Pads are masked out of every loss, so any id is correct; a dedicated one keeps EOS-based masks exact.

``stop_token_ids`` is every id an engine stops on: vLLM stops at the tokenizer's EOS and at every id of the
model's ``generation_config.json`` ``eos_token_id`` (vllm/sampling_params.py ``update_from_generation_config``),
and so does HF ``generate``. Qwen3 (``[<|im_end|>, <|endoftext|>]``) and Llama-3.1-Instruct (``[128001, 128008,
128009]``) list several; a response that ends on one the trainer does not know would be masked to full length.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

logger = logging.getLogger(__name__)

LLAMA_PAD_TOKEN = "<|finetune_right_pad_id|>"
_logged_pad: set = set()


def set_pad_token(tokenizer, source: str = "") -> str:
    """Give ``tokenizer`` a pad token when it has none (see the module docstring); returns which was used:
    ``own``, the reserved pad token's string, or ``eos``. Logged once per tokenizer source."""
    if tokenizer.pad_token_id is not None:
        return "own"
    vocab = tokenizer.get_vocab()
    if LLAMA_PAD_TOKEN in vocab:
        tokenizer.pad_token = LLAMA_PAD_TOKEN
        chosen = LLAMA_PAD_TOKEN
    elif tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        chosen = "eos"
    else:
        raise ValueError(f"tokenizer {source or tokenizer.name_or_path!r} has neither a pad token nor an EOS token")
    key = source or getattr(tokenizer, "name_or_path", "")
    if key not in _logged_pad:
        _logged_pad.add(key)
        logger.warning(
            "tokenizer %s defines no pad token: padding with %s (id %d)",
            key,
            tokenizer.pad_token,
            tokenizer.pad_token_id,
        )
    return chosen


def hf_tokenizer(path: str, trust_remote_code: bool = False, **kwargs: Any):
    """``AutoTokenizer.from_pretrained(path)`` with a pad token (``set_pad_token``)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
    set_pad_token(tokenizer, str(path))
    return tokenizer


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def generation_stop_ids(model_dir: Optional[str]) -> list[int]:
    """``eos_token_id`` of ``model_dir/generation_config.json`` (else of its ``config.json``) as a list; a hub id
    is read from its cached snapshot (never from the network), and one not cached gives []."""
    if model_dir and not os.path.isdir(model_dir):
        from verl.utils.model_source import cached_snapshot, is_local_path

        model_dir = None if is_local_path(model_dir) else cached_snapshot(model_dir)
    if not model_dir:
        return []
    for name in ("generation_config.json", "config.json"):
        file = os.path.join(model_dir, name)
        if os.path.isfile(file):
            with open(file) as f:
                ids = _as_ids(json.load(f).get("eos_token_id"))
            if ids:
                return ids
    return []


def stop_token_ids(tokenizer, model_dir: Optional[str] = None) -> list[int]:
    """Every id an engine stops on: the tokenizer's EOS first, then the generation config's, without repeats
    (``model_dir``: the model's folder or hub id; default the tokenizer's own)."""
    model_dir = model_dir or getattr(tokenizer, "name_or_path", None)
    out: list[int] = []
    for i in _as_ids(tokenizer.eos_token_id) + generation_stop_ids(model_dir):
        if i not in out:
            out.append(i)
    if not out:
        raise ValueError(
            f"no stop token: tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no EOS and "
            f"{model_dir!r} has no generation_config.json eos_token_id"
        )
    return out
