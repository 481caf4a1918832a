"""Responses end where the engine stopped, on every stop id of every model of the matrix.

Per model of tests/data/model_configs with its published tokenizer_config.json and generation_config.json: a
tiny model carrying the real special tokens and stop ids (luffy_pool/tiny/model_tokens.py), the HF engine made to
emit two ordinary tokens and then one stop id (its sampler scripted; its own loop decides where to stop), and the slot plan's response
mask: 1 on the three tokens, 0 after, for each stop id of the model. The response is not counted as truncated.
Qwen3's second stop id is its pad token (<|endoftext|>): a mask that cut at the tokenizer's EOS (<|im_end|>) alone
ran such a response through the padding to the full length.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from luffy_pool.rollout.slot_plan import MixRolloutPlanner
from luffy_pool.tiny.model import TinyModelSpec, build_tiny_model_like
from tests.helpers.sections import engine_section
from verl.trainer.ppo.core_algos import truncated_rows
from verl.utils.tokenizer import hf_tokenizer, stop_token_ids
from verl.utils.torch_functional import get_eos_mask
from verl.workers.rollout.hf_rollout import HFRollout

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "data", "model_configs")
MODELS = sorted(
    n[: -len(".tokenizer_config.json")] for n in os.listdir(CONFIGS) if n.endswith(".tokenizer_config.json")
)
MOE = {"Qwen--Qwen3-30B-A3B-Base"}  # its tokens are those of Qwen3; the HF engine test runs on dense models
L = 8


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            out = str(tmp_path_factory.mktemp(name.replace(".", "_")))
            built[name] = build_tiny_model_like(
                out, os.path.join(CONFIGS, name + ".json"), TinyModelSpec(num_hidden_layers=1)
            )
        return built[name]

    return get


def test_every_matrix_model_ships_its_token_files():
    configs = sorted(
        n[:-5]
        for n in os.listdir(CONFIGS)
        if n.endswith(".json") and not n.endswith((".tokenizer_config.json", ".generation_config.json"))
    )
    assert configs and set(configs) == set(MODELS), (configs, MODELS)
    for name in MODELS:
        assert os.path.isfile(os.path.join(CONFIGS, name + ".generation_config.json")), name


def _scripted_sampler(monkeypatch, sequence):
    """The engine's sampler replaced: step t of every row draws ``sequence[t]`` (both of the HF engine's decoders,
    the KV decoder and the generic loop, sample through ``hf_rollout.sample_next_tokens``; their stopping is
    theirs)."""
    import verl.workers.rollout.hf_rollout as hf_rollout

    state = {"step": 0}

    def sample(logits, sampling, generator=None):
        token = sequence[min(state["step"], len(sequence) - 1)]
        state["step"] += 1
        rows = logits.shape[0]
        return torch.full((rows,), token, dtype=torch.long), torch.zeros(rows)

    monkeypatch.setattr(hf_rollout, "sample_next_tokens", sample)


@pytest.mark.parametrize("name", [m for m in MODELS if m not in MOE])
@pytest.mark.parametrize("decoder", ["kv", "generic"])
def test_a_response_ending_on_each_stop_id_is_masked_there(name, decoder, tiny_models, monkeypatch):
    folder = tiny_models(name)
    tok = hf_tokenizer(folder)
    stops = stop_token_ids(tok, folder)
    with open(os.path.join(folder, "generation_config.json")) as f:
        published = json.load(f)["eos_token_id"]
    assert set(published if isinstance(published, list) else [published]) <= set(stops)
    engine = HFRollout(folder, engine_section(do_sample=False, response_length=L, hf_decoder=decoder))
    planner = MixRolloutPlanner(
        engine,
        engine_section(do_sample=False, response_length=L, n=1, n_val=1),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        stop_token_ids=stops,
    )
    ordinary = [i for i in range(len(tok)) if i not in stops and i not in tok.all_special_ids][:2]
    prompt = torch.tensor([[tok.pad_token_id, 5, 6]]), torch.tensor([[0, 1, 1]])
    for stop in stops:
        _scripted_sampler(monkeypatch, ordinary + [stop] + ordinary)
        batch = planner.generate(*prompt, None, np.zeros((1, 1)))
        t = batch.tensors
        where = f"{name}: stop id {stop} ({tok.convert_ids_to_tokens(stop)})"
        assert t["responses"][0, :3].tolist() == ordinary + [stop], where
        assert t["response_mask"][0].tolist() == [1, 1, 1] + [0] * (L - 3), where
        assert t["attention_mask"][0, -L:].tolist() == [1, 1, 1] + [0] * (L - 3), where
        assert not truncated_rows(t["responses"], tok.pad_token_id, stops, L).any(), where


def test_qwen3_second_stop_id_was_masked_to_full_length_by_an_eos_only_mask(tiny_models):
    folder = tiny_models("Qwen--Qwen3-8B")
    tok = hf_tokenizer(folder)
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == endoftext
    assert stop_token_ids(tok, folder) == [tok.eos_token_id, endoftext]
    responses = torch.tensor([[7, 8, endoftext] + [tok.pad_token_id] * (L - 3)])
    # what the mask did before it followed the engine: no <|im_end|> in the row, so all of it
    assert get_eos_mask(responses, tok.eos_token_id).tolist() == [[1] * L]


def test_llama_has_no_pad_token_and_gets_its_reserved_one(tiny_models):
    folder = tiny_models("meta-llama--Llama-3.1-8B")
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        assert json.load(f).get("pad_token") is None  # as published
    tok = hf_tokenizer(folder)
    assert tok.pad_token == "<|finetune_right_pad_id|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|end_of_text|>"
    text = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n1+1?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
