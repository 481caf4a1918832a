"""Build the tiny Qwen2 model and its byte-level BPE tokenizer, fully offline and seeded.

Head dimension is 32: vLLM's CPU attention rejects head_dim 16 (docs/CPU_STACK.md §2). Digits are
split into single tokens so arithmetic stays learnable by a model this small. The chat template is
Qwen's ChatML; with ``think=True`` the generation prompt also opens ``<think>\\n`` like LUFFY's base
model, which exercises the trainer's ``<think>\\n`` de-duplication of targets.
"""

from __future__ import annotations

import dataclasses
import json
import os

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{THINK}{% endif %}"
)


@dataclasses.dataclass
class TinyModelSpec:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    think: bool = True
    seed: int = 0
    # HF model_type of the architecture family (qwen2, qwen3, llama, ...): the recipe rehearsal builds the
    # family of the model a launch script names.
    model_type: str = "qwen2"


def build_tokenizer(out_dir: str | None = None, vocab_size: int = 512, think: bool = True, real_tokens=None):
    """Train a byte-level BPE tokenizer on the synthetic task text; optionally save it.

    With ``real_tokens`` (``luffy_pool.tiny.model_tokens.RealTokens``) its special tokens, bos/eos/pad and chat
    template are the real model's (no pad token when the real model has none), in place of the tiny ChatML set.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from luffy_pool.tiny.arith_task import tokenizer_corpus

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    specials = real_tokens.strings() if real_tokens is not None else SPECIAL_TOKENS
    trainer = trainers.BpeTrainer(
        vocab_size=max(vocab_size, len(specials) + 300),
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer)
    if real_tokens is not None:
        hf_tok = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token=real_tokens.bos,
            eos_token=real_tokens.eos,
            pad_token=real_tokens.pad,
            padding_side="left",
            additional_special_tokens=[
                s for s in specials if s not in (real_tokens.bos, real_tokens.eos, real_tokens.pad)
            ],
        )
        hf_tok.chat_template = real_tokens.chat_template
        if out_dir is not None:
            hf_tok.save_pretrained(out_dir)
        return hf_tok
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    hf_tok.chat_template = _CHAT_TEMPLATE.replace("{THINK}", "<think>\n" if think else "")
    if out_dir is not None:
        hf_tok.save_pretrained(out_dir)
    return hf_tok


def build_tiny_model(
    out_dir: str, spec: TinyModelSpec | None = None, model_config: dict | None = None, real_tokens=None
) -> str:
    """Write tokenizer + a randomly initialised causal LM of ``spec.model_type`` (Qwen2 by default) to ``out_dir`` and return it.

    With ``model_config`` (a real model's config.json as a dict) the model is that config shrunk
    (``luffy_pool.tiny.model_config``: sizes only, kv heads ``spec.num_key_value_heads``, every other field
    kept), saved in bfloat16 like the published checkpoints; ``tiny_config_record.json`` lists the fields
    kept and shrunk. With ``real_tokens`` as well (``luffy_pool.tiny.model_tokens.read_real_tokens``) the
    tokenizer carries the real special tokens and chat template, and the generation config is the real one with
    its ids mapped (the real stop ids among them).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    spec = spec or TinyModelSpec()
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(
        out_dir,
        vocab_size=spec.vocab_size,
        think=spec.think,
        real_tokens=real_tokens if model_config is not None else None,
    )
    if model_config is not None:
        return _build_from_real_config(out_dir, spec, model_config, tok, real_tokens)
    cfg = AutoConfig.for_model(
        spec.model_type,
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tiny_spec.json"), "w") as f:
        json.dump(dataclasses.asdict(spec), f, indent=1)
    return out_dir


def _build_from_real_config(out_dir: str, spec: TinyModelSpec, real: dict, tok, real_tokens=None) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from luffy_pool.tiny.model_config import shrink_config
    from luffy_pool.tiny.model_tokens import id_map, tiny_generation_config

    token_map = id_map(real_tokens, tok) if real_tokens is not None else None
    specials = [] if token_map else [tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<|im_start|>")]
    tiny, record = shrink_config(
        real, spec.num_key_value_heads, len(tok), specials, layers=spec.num_hidden_layers, token_map=token_map
    )
    fields = {k: v for k, v in tiny.items() if k not in ("model_type", "architectures", "transformers_version")}
    cfg = AutoConfig.for_model(tiny["model_type"], **fields)
    if "architectures" in tiny:
        cfg.architectures = tiny["architectures"]
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if real_tokens is not None and real_tokens.generation:
        model.generation_config = GenerationConfig(**tiny_generation_config(real_tokens, token_map))
    else:
        eos = tiny.get("eos_token_id", tok.eos_token_id)
        model.generation_config = GenerationConfig(
            eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=tiny.get("bos_token_id")
        )
    model.to(torch.bfloat16).save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tiny_spec.json"), "w") as f:
        json.dump(dataclasses.asdict(spec), f, indent=1)
    with open(os.path.join(out_dir, "tiny_config_record.json"), "w") as f:
        json.dump(record, f, indent=1)
    return out_dir


def build_tiny_model_like(out_dir: str, config_path: str, spec: TinyModelSpec | None = None) -> str:
    """``build_tiny_model`` shrunk from the published ``config.json`` at ``config_path`` (a file or a model folder),
    with the real model's tokens where its tokenizer_config.json lies beside it (luffy_pool/tiny/model_tokens.py)."""
    from luffy_pool.tiny.model_config import read_model_config
    from luffy_pool.tiny.model_tokens import read_real_tokens

    return build_tiny_model(
        out_dir, spec, model_config=read_model_config(config_path), real_tokens=read_real_tokens(config_path)
    )
