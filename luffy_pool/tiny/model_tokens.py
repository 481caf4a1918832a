"""A real model's special tokens, stop ids and chat template, for a tiny model that must behave like it.

A rehearsal on the tiny tokenizer's own three specials never meets what fails on the real model: Llama-3.x has no
pad token, Qwen3 stops on two ids (``<|im_end|>`` and ``<|endoftext|>``), R1-Distill's template opens
``<think>\\n`` after ``<｜Assistant｜>``. ``read_real_tokens`` reads the published ``tokenizer_config.json``
(special tokens with their ids, bos/eos/pad, the chat template) and ``generation_config.json`` (the stop ids and
sampling defaults) that sit beside a model's ``config.json``: in a model folder, or, for a stored config
``NAME.json``, as ``NAME.tokenizer_config.json`` and ``NAME.generation_config.json`` (tests/data/model_configs).
The tiny tokenizer then carries exactly those special strings (``luffy_pool.tiny.model.build_tokenizer``), and
every real id of the config and the generation config maps to the tiny id of the same string.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional


class TokenFilesError(ValueError):
    """A tokenizer or generation config the tiny model cannot take (one line naming the file and the field)."""


@dataclasses.dataclass(frozen=True)
class RealTokens:
    specials: dict  # real id -> special string, every added special token the model defines
    bos: Optional[str]
    eos: str
    pad: Optional[str]  # None: the model defines no pad token (Llama-3.x)
    chat_template: Optional[str]
    generation: dict  # generation_config.json without its bookkeeping fields
    source: str

    def strings(self) -> list[str]:
        """The special strings in real-id order (the tiny tokenizer's first ids, in that order)."""
        return [self.specials[i] for i in sorted(self.specials)]


def token_file_paths(config_path: str) -> tuple[str, str]:
    """(tokenizer_config.json, generation_config.json) beside ``config_path`` (a folder or a file)."""
    if os.path.isdir(config_path):
        return (os.path.join(config_path, "tokenizer_config.json"), os.path.join(config_path, "generation_config.json"))
    folder, name = os.path.split(config_path)
    if name == "config.json":
        return os.path.join(folder, "tokenizer_config.json"), os.path.join(folder, "generation_config.json")
    stem = name[: -len(".json")] if name.endswith(".json") else name
    return (
        os.path.join(folder, stem + ".tokenizer_config.json"),
        os.path.join(folder, stem + ".generation_config.json"),
    )


def _token_string(value: Any, file: str, field: str) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):  # AddedToken serialised
        return value["content"]
    raise TokenFilesError(f"{file}: {field} is {value!r}, not a token string")


def read_real_tokens(config_path: str) -> Optional[RealTokens]:
    """The real model's tokens, or None when no tokenizer_config.json lies beside its config."""
    tok_file, gen_file = token_file_paths(config_path)
    if not os.path.isfile(tok_file):
        return None
    try:
        with open(tok_file, encoding="utf-8") as f:
            tok = json.load(f)
        gen = {}
        if os.path.isfile(gen_file):
            with open(gen_file) as f:
                gen = json.load(f)
    except json.JSONDecodeError as exc:
        raise TokenFilesError(f"{tok_file} or {gen_file}: not JSON ({exc})") from None
    decoder = tok.get("added_tokens_decoder") or {}
    specials = {
        int(i): _token_string(v, tok_file, f"added_tokens_decoder[{i}]")
        for i, v in decoder.items()
        if not isinstance(v, dict) or v.get("special", True)
    }
    bos, eos, pad = (_token_string(tok.get(k), tok_file, k) for k in ("bos_token", "eos_token", "pad_token"))
    if eos is None:
        raise TokenFilesError(f"{tok_file}: no eos_token")
    for field, value in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad)):
        if value is not None and value not in specials.values():
            raise TokenFilesError(f"{tok_file}: {field} {value!r} is not in added_tokens_decoder")
    generation = {k: v for k, v in gen.items() if not k.startswith("_") and k != "transformers_version"}
    return RealTokens(
        specials=specials,
        bos=bos,
        eos=eos,
        pad=pad,
        chat_template=tok.get("chat_template"),
        generation=generation,
        source=tok_file,
    )


def id_map(real: RealTokens, tokenizer) -> dict[int, int]:
    """Real special id -> the tiny tokenizer's id of the same string."""
    out = {}
    for real_id, text in real.specials.items():
        tiny_id = tokenizer.convert_tokens_to_ids(text)
        if tiny_id is None or tokenizer.convert_ids_to_tokens(tiny_id) != text:
            raise TokenFilesError(f"{real.source}: special token {text!r} is missing from the tiny tokenizer")
        out[real_id] = tiny_id
    return out


def map_ids(value: Any, mapping: dict[int, int], where: str) -> Any:
    """An id or a list of ids through ``mapping`` (an id the real tokenizer does not define is refused)."""
    if value is None:
        return None
    ids = value if isinstance(value, list) else [value]
    missing = [i for i in ids if i not in mapping]
    if missing:
        raise TokenFilesError(
            f"{where}: token id(s) {missing} are not special tokens of the model's "
            "tokenizer_config.json (added_tokens_decoder)"
        )
    mapped = [mapping[i] for i in ids]
    return mapped if isinstance(value, list) else mapped[0]


def tiny_generation_config(real: RealTokens, mapping: dict[int, int]) -> dict:
    """The real generation config with every token id mapped to the tiny tokenizer's."""
    out = dict(real.generation)
    for field in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if out.get(field) is not None:
            out[field] = map_ids(out[field], mapping, f"{real.source} generation_config {field}")
    return out
