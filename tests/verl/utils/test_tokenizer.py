"""verl/utils/tokenizer.py: one pad rule for every process, and every stop id the engines use."""

from __future__ import annotations

import json
import logging

import pytest

from luffy_pool.tiny.model import build_tokenizer
from luffy_pool.tiny.model_tokens import RealTokens
from verl.utils import tokenizer as tokmod
from verl.utils.tokenizer import LLAMA_PAD_TOKEN, generation_stop_ids, hf_tokenizer, set_pad_token, stop_token_ids


def _real(specials, eos, pad=None, bos=None):
    return RealTokens(
        specials=dict(enumerate(specials)), bos=bos, eos=eos, pad=pad, chat_template=None, generation={}, source="test"
    )


def _saved(tmp_path, real, generation=None):
    build_tokenizer(str(tmp_path), vocab_size=320, real_tokens=real)
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return str(tmp_path)


def test_a_model_without_pad_gets_llamas_reserved_pad_token_logged_once(tmp_path, caplog):
    folder = _saved(tmp_path, _real(["<|begin_of_text|>", "<|end_of_text|>", LLAMA_PAD_TOKEN], "<|end_of_text|>"))
    tokmod._logged_pad.discard(folder)
    with caplog.at_level(logging.WARNING, logger="verl.utils.tokenizer"):
        a, b = hf_tokenizer(folder), hf_tokenizer(folder)
    assert a.pad_token == b.pad_token == LLAMA_PAD_TOKEN and a.pad_token_id == 2 != a.eos_token_id
    assert sum("defines no pad token" in r.message for r in caplog.records) == 1


def test_without_a_reserved_pad_token_eos_pads_and_an_own_pad_is_kept(tmp_path):
    no_pad = _saved(tmp_path / "a", _real(["<s>", "</s>"], "</s>"))
    tok = hf_tokenizer(no_pad)
    assert tok.pad_token == "</s>" and tok.pad_token_id == tok.eos_token_id
    own = _saved(tmp_path / "b", _real(["<eos>", "<pad>", LLAMA_PAD_TOKEN], "<eos>", pad="<pad>"))
    assert hf_tokenizer(own).pad_token == "<pad>"
    assert set_pad_token(hf_tokenizer(own)) == "own"


def test_a_tokenizer_with_neither_pad_nor_eos_is_refused_naming_it(tmp_path):
    tok = hf_tokenizer(_saved(tmp_path, _real(["<x>"], "<x>")))
    tok.pad_token, tok.eos_token = None, None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        set_pad_token(tok, "m")


def test_stop_ids_are_eos_then_the_generation_configs_without_repeats(tmp_path):
    folder = _saved(
        tmp_path,
        _real(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", pad="<|endoftext|>"),
        generation={"eos_token_id": [2, 0], "pad_token_id": 0},
    )
    tok = hf_tokenizer(folder)
    assert stop_token_ids(tok, folder) == [2, 0]
    assert stop_token_ids(tok) == [2, 0]  # the tokenizer's own folder by default
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert stop_token_ids(tok, folder) == [2, 1]


def test_generation_stop_ids_fall_back_to_config_json_and_never_reach_the_network(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    assert generation_stop_ids(str(tmp_path)) == [5, 6]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    assert generation_stop_ids("org/not-cached-model") == []
    assert generation_stop_ids(str(tmp_path / "missing")) == []
