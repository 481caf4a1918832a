"""verl/trainer/main_generation.py: prompt templates, overlong prompts, and the CLI on the tiny model."""

from __future__ import annotations

import pytest

from verl.utils.data_format import read_records, run_cli, write_records
from verl.trainer.main_generation import (
    Completion,
    SamplingArgs,
    generate_completions,
    hydra_style_to_flags,
    main,
    prepare_messages,
    render_prompt,
    vllm_engine_kwargs,
)

CHAT = [{"role": "system", "content": "be careful"}, {"role": "user", "content": "What is 2 + 3?"}]


def test_prepare_messages_removes_or_replaces_the_system_turn():
    assert prepare_messages(CHAT, remove_system=True) == [CHAT[1]]
    assert prepare_messages(CHAT, remove_system=False) == CHAT
    assert prepare_messages(CHAT, remove_system=True, system_prompt="new") == [
        {"role": "system", "content": "new"},
        CHAT[1],
    ]
    with pytest.raises(ValueError):
        prepare_messages(CHAT[:1], remove_system=True)


def test_templates_render_luffy_prompts(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert render_prompt([CHAT[1]], "own", tok) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert render_prompt(CHAT, "qwen") == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompt(CHAT, "no") == "What is 2 + 3?"
    with pytest.raises(ValueError, match="unknown template"):
        render_prompt(CHAT, "prime_code")


class _FakeTokenizer:
    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[1] * len(t) for t in texts]}  # one token per character


class _FakeGenerator:
    """Records what reaches the engine; answers with one token per prompt."""

    tokenizer = _FakeTokenizer()
    max_model_len = 5

    def __init__(self):
        self.seen = []

    def generate(self, prompt_ids, sampling):
        self.seen.append(prompt_ids)
        return [[Completion("ok", [7], "stop")] * sampling.n for _ in prompt_ids]


def test_overlong_prompts_error_or_are_skipped_and_marked():
    gen = _FakeGenerator()
    with pytest.raises(ValueError, match=r"1 prompt\(s\) do not fit .* 5 tokens \(first: prompt 1, 5 tokens\)"):
        generate_completions(gen, ["abc", "abcde"], SamplingArgs(n=2))
    out = generate_completions(gen, ["abc", "abcde", "ab"], SamplingArgs(n=2), overlong_prompts="skip")
    assert gen.seen == [[[1, 1, 1], [1, 1]]]  # the overlong prompt never reaches the engine
    assert [[c.finish_reason for c in comps] for comps in out] == [["stop"] * 2, ["prompt_too_long"] * 2, ["stop"] * 2]
    assert out[1][0].num_tokens == 0 and out[0][0].num_tokens == 1


def test_hydra_style_overrides_become_flags():
    assert hydra_style_to_flags(["data.path=a.parquet", "--n_samples", "2", "model.path=m", "x=1"]) == [
        "--data.path=a.parquet",
        "--n_samples",
        "2",
        "--model.path=m",
        "x=1",
    ]


def test_cli_writes_rows_with_n_responses(tmp_path, tiny_model_dir):
    src = write_records(
        [{"prompt": CHAT, "data_source": "d", "extra_info": {"index": i}} for i in range(3)],
        str(tmp_path / "in.parquet"),
    )
    out = str(tmp_path / "gen.parquet")
    main(
        [
            f"model.path={tiny_model_dir}",
            f"data.path={src}",
            f"data.output_path={out}",
            "data.n_samples=2",
            "--backend",
            "hf",
            "--max_tokens",
            "6",
            "--remove_system",
            "True",
        ]
    )
    rows = read_records(out)
    assert len(rows) == 3 and all(len(r["responses"]) == 2 for r in rows)
    assert rows[0]["prompt"] == CHAT and rows[2]["extra_info"] == {"index": 2}
    assert all(isinstance(t, str) for r in rows for t in r["responses"])


def test_cli_names_the_row_with_a_bad_prompt(tmp_path, capsys):
    src = write_records([{"prompt": CHAT}, {"prompt": [{"role": "user"}]}], str(tmp_path / "in.parquet"))
    code = run_cli(main, ["--model_path", "unused", "--data_path", src, "--output_path", str(tmp_path / "o.jsonl")])
    assert code == 2
    assert capsys.readouterr().err.startswith(f"error: {src}: row 1, column 'prompt': message 0 is not")


def test_vllm_engine_arguments_for_cpu_and_gpu():
    cpu = vllm_engine_kwargs("m", seed=3)
    assert cpu == {
        "model": "m",
        "seed": 3,
        "dtype": "float32",
        "enforce_eager": True,
        "kv_cache_memory_bytes": 256 * 2**20,
    }
    assert vllm_engine_kwargs("m", dtype="bfloat16", kv_cache_gb=1, max_model_len=4096) == {
        "model": "m",
        "seed": 0,
        "dtype": "bfloat16",
        "enforce_eager": True,
        "kv_cache_memory_bytes": 2**30,
        "max_model_len": 4096,
    }
    # GPU: all visible GPUs in one tensor-parallel engine unless told otherwise (LUFFY), 0.85 of memory.
    assert vllm_engine_kwargs("m", gpu_count=8) == {
        "model": "m",
        "seed": 0,
        "dtype": "auto",
        "tensor_parallel_size": 8,
        "gpu_memory_utilization": 0.85,
    }
    gpu = vllm_engine_kwargs("m", gpu_count=8, tensor_parallel_size=2, kv_cache_gb=20, gpu_memory_utilization=0.5)
    assert (gpu["tensor_parallel_size"], gpu["kv_cache_memory_bytes"], gpu["gpu_memory_utilization"]) == (
        2,
        20 * 2**30,
        0.5,
    )


def test_hf_generator_runs_the_rollout_engine_with_n_samples_seeded_and_greedy_equal_to_transformers(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.trainer.main_generation import HFGenerator

    gen = HFGenerator(tiny_model_dir, dtype="float32", seed=5, batch_size=2)
    assert gen.engine.kv_decoder is not None  # the tiny Qwen2 model takes the lean decode loop
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [
        tok(f"<|im_start|>user\nWhat is {a} + 3?<|im_end|>\n<|im_start|>assistant\n")["input_ids"] for a in (2, 41, 7)
    ]
    sampled = SamplingArgs(n=3, temperature=0.6, max_tokens=12, logprobs=True)
    out = gen.generate(prompts, sampled)
    assert [len(c) for c in out] == [3, 3, 3]
    for comps in out:
        for c in comps:
            assert 1 <= c.num_tokens <= 12 and len(c.logprobs) == c.num_tokens and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason == ("stop" if c.token_ids[-1] in gen.eos_ids else "length")
    again = gen.generate(prompts, sampled)  # one seeded generator per call: the same samples
    assert [[c.token_ids for c in comps] for comps in again] == [[c.token_ids for c in comps] for comps in out]
    # Greedy: the same ids as transformers' own generate on the same weights.
    greedy = gen.generate(prompts, SamplingArgs(n=1, temperature=0.0, max_tokens=10))
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for ids, comps in zip(prompts, greedy):
        with torch.no_grad():
            seq = ref.generate(
                torch.tensor([ids]),
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )[0, len(ids) :].tolist()
        if tok.eos_token_id in seq:
            seq = seq[: seq.index(tok.eos_token_id) + 1]
        assert list(comps[0].token_ids) == seq
