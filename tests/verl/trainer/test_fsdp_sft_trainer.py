"""SFT baseline trainer: loss mask, loss reduction, truncation, config errors, a short run and FSDP equivalence."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer, _prepare, run_sft, sft_process_group
from verl.trainer.sft.config import (
    ConfigError,
    batch_plan,
    check_override_keys,
    compose_sft_config,
    validate_sft_config,
)
from verl.trainer.sft.dataset import (
    SFTDataset,
    epoch_batches,
    loss_token_count,
    pad_micro_batch,
    rank_slice,
    strided_shard,
    truncate,
)
from verl.trainer.sft.loss import masked_token_nll_sum, next_token_targets

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROMPT = [{"role": "user", "content": "What is 1 + 2?"}]
TRACE = "<think>\n1+2+0=3\n</think>\n\\boxed{3}"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _write_rows(path, rows):
    pd.DataFrame(rows).to_parquet(path, index=False)
    return str(path)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------- data
def test_loss_mask_covers_exactly_the_response_tokens_and_eos(tmp_path, tokenizer):
    path = _write_rows(
        tmp_path / "one.parquet", [{"prompt": PROMPT, "target": [{"role": "assistant", "content": TRACE}]}]
    )
    item = SFTDataset(path, tokenizer)[0]
    prompt_ids = _ids(tokenizer, "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    # The template already opens <think>\n, so the response starts after it and ends with the EOS.
    response_ids = _ids(tokenizer, "1+2+0=3\n</think>\n\\boxed{3}") + [tokenizer.eos_token_id]
    assert item["input_ids"].tolist() == prompt_ids + response_ids
    assert item["loss_mask"].tolist() == [0] * len(prompt_ids) + [1] * len(response_ids)
    assert tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == "1+2+0=3\n</think>\n\\boxed{3}<|im_end|>"


def test_think_prefix_is_kept_when_disabled_or_when_the_template_does_not_open_it(tmp_path, tokenizer):
    path = _write_rows(tmp_path / "one.parquet", [{"prompt": PROMPT, "target": TRACE}])  # plain string target
    kept = SFTDataset(path, tokenizer, strip_think_prefix=False)[0]
    assert tokenizer.decode(kept["input_ids"][kept["loss_mask"].bool()]) == TRACE + "<|im_end|>"
    plain_template = tokenizer.chat_template
    try:
        tokenizer.chat_template = plain_template.replace("<think>\n", "")
        item = SFTDataset(path, tokenizer, strip_think_prefix=True)[0]
    finally:
        tokenizer.chat_template = plain_template
    assert tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == TRACE + "<|im_end|>"


def test_string_prompt_becomes_one_user_message(tmp_path, tokenizer):
    path = _write_rows(tmp_path / "s.parquet", [{"question": "What is 1 + 2?", "answer": "3"}])
    item = SFTDataset(path, tokenizer, prompt_key="question", response_key="answer")[0]
    prompt_len = len(_ids(tokenizer, "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n"))
    assert item["loss_mask"].tolist() == [0] * prompt_len + [1, 1]  # "3" and the EOS


def test_bad_rows_and_columns_are_named(tmp_path, tokenizer):
    path = str(tmp_path / "bad.jsonl")  # jsonl: a column may mix types there
    with open(path, "w") as f:
        for target in (TRACE, 5):
            f.write(json.dumps({"prompt": PROMPT, "target": target}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: row 1: column 'target'"):
        SFTDataset(path, tokenizer)
    with pytest.raises(ValueError, match=r"missing column 'response'"):
        SFTDataset(path, tokenizer, response_key="response")


def test_truncate_left_drops_prompt_first_and_right_drops_response_first():
    prompt, response = [1, 2, 3], [4, 5, 6]
    assert truncate(prompt, response, 6, "left") == ([1, 2, 3], [4, 5, 6])
    assert truncate(prompt, response, 4, "left") == ([3], [4, 5, 6])
    assert truncate(prompt, response, 2, "left") == ([], [5, 6])
    assert truncate(prompt, response, 4, "right") == ([1, 2, 3], [4])
    assert truncate(prompt, response, 2, "right") == ([1, 2], [])


def test_truncation_modes_on_the_dataset(tmp_path, tokenizer):
    path = _write_rows(tmp_path / "one.parquet", [{"prompt": PROMPT, "target": TRACE}])
    full = SFTDataset(path, tokenizer)[0]
    n = len(full["input_ids"])
    with pytest.raises(ValueError, match=rf"one.parquet: row 0: {n} tokens .* > data.max_length={n - 3}"):
        SFTDataset(path, tokenizer, max_length=n - 3, truncation="error")[0]
    left = SFTDataset(path, tokenizer, max_length=n - 3, truncation="left")[0]
    assert left["input_ids"].tolist() == full["input_ids"][3:].tolist()
    assert left["loss_mask"].tolist() == full["loss_mask"][3:].tolist()
    right = SFTDataset(path, tokenizer, max_length=n - 3, truncation="right")[0]
    assert right["input_ids"].tolist() == full["input_ids"][:-3].tolist()
    assert int(right["loss_mask"].sum()) == int(full["loss_mask"].sum()) - 3


def test_pad_micro_batch_right_pads_and_filler_rows_carry_no_loss():
    items = [
        {"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1])},
        {"input_ids": torch.tensor([8, 9]), "loss_mask": torch.tensor([0, 1])},
    ]
    batch = pad_micro_batch(items, pad_token_id=0, keep=[True, False])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 1, 1]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 0, 0]]
    assert loss_token_count(batch["loss_mask"]) == 2


def test_batches_are_seeded_full_and_split_evenly_over_ranks():
    batches = epoch_batches(10, 4, epoch=0, seed=1)
    assert len(batches) == 2 and all(len(b) == 4 for b in batches)  # the last 2 rows are dropped
    assert batches == epoch_batches(10, 4, epoch=0, seed=1) != epoch_batches(10, 4, epoch=1, seed=1)
    assert epoch_batches(5, 2, 0, 0, shuffle=False) == [[0, 1], [2, 3]]
    assert rank_slice([7, 3, 5, 1], rank=1, world_size=2) == [5, 1]
    assert strided_shard(5, rank=1, world_size=2) == ([1, 3, 0], [True, True, False])
    with pytest.raises(ValueError, match="train_batch_size=8 exceeds the 5"):
        epoch_batches(5, 8, 0, 0)


# ---------------------------------------------------------------------------------------------- loss
def test_masked_token_nll_sum_matches_hand_computed_values():
    # Row 0: uniform over 2 tokens -> −log(1/2); row 1: logits (0, ln 3) -> p(1) = 3/4; third position masked.
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [5.0, -5.0]]], requires_grad=True)
    labels = torch.tensor([[0, 1, 1]])
    mask = torch.tensor([[1, 1, 0]])
    expected = math.log(2.0) - math.log(0.75)
    total = masked_token_nll_sum(logits, labels, mask)
    assert total.item() == pytest.approx(expected, abs=1e-6)
    total.backward()
    # d/dlogits of −log softmax = softmax − onehot, zero where masked.
    assert torch.allclose(logits.grad, torch.tensor([[[-0.5, 0.5], [0.25, -0.25], [0.0, 0.0]]]), atol=1e-6)


def test_chunked_nll_equals_unchunked_in_value_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 11, (2, 7))
    mask = (torch.rand(2, 7) > 0.3).long()
    whole = masked_token_nll_sum(logits, labels, mask)
    (grad_whole,) = torch.autograd.grad(whole, logits)
    chunked = masked_token_nll_sum(logits, labels, mask, chunk_tokens=3)
    (grad_chunked,) = torch.autograd.grad(chunked, logits)
    assert whole.dtype == torch.float32
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6)
    # exact: each token's gradient (softmax − onehot of its own row) is the same arithmetic in any chunking
    assert torch.equal(grad_whole, grad_chunked)


def test_next_token_targets_read_logits_one_position_before_each_response_token():
    input_ids = torch.tensor([[11, 12, 13, 14, 0], [21, 22, 23, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    positions, labels, mask = next_token_targets(input_ids, loss_mask)
    assert positions.tolist() == [0, 1, 2]
    assert labels.tolist() == [[12, 13, 14], [22, 23, 0]]
    assert mask.tolist() == [[0, 1, 1], [1, 1, 0]]


# ---------------------------------------------------------------------------------------------- config
def test_unknown_override_key_names_the_closest_key():
    with pytest.raises(ConfigError, match=r"Unknown config key 'data.max_lenght'; did you mean 'data.max_length'\?"):
        check_override_keys(["data.max_lenght=5"])
    with pytest.raises(ConfigError, match=r"'trainer.lr'; did you mean 'optim.lr'\?"):
        check_override_keys(["trainer.lr=1e-5"])
    assert check_override_keys(["+optim.lr=1e-5", "hydra.run.dir=."]) == ["optim.lr=1e-5", "hydra.run.dir=."]


def test_composed_config_is_validated_key_by_key(tiny_model_dir):
    cfg = compose_sft_config([f"model.path={tiny_model_dir}", "data.train_files=x.parquet"])
    assert validate_sft_config(cfg) == []
    assert cfg.optim.lr == 5e-5 and cfg.optim.warmup_steps_ratio == 0.1 and cfg.trainer.total_epochs == 3
    bad = compose_sft_config(
        [
            "model.path=m",
            "data.train_files=x",
            "data.truncation=middle",
            "optim.betas=[0.9]",
            "data.micro_batch_size_per_gpu=0",
        ]
    )
    errors = validate_sft_config(bad)
    assert any("'data.truncation'='middle' is not one of: error, left, right" in e for e in errors)
    assert any("'optim.betas' must be two numbers" in e for e in errors)
    assert any("'data.micro_batch_size_per_gpu'=0 must be >= 1" in e for e in errors)
    assert validate_sft_config(compose_sft_config([])) == [
        "'data.train_files' is required (no default); pass data.train_files=...",
        "'model.path' is required (no default); pass model.path=...",
    ]


def test_batch_plan_needs_divisible_batches():
    assert batch_plan(8, 2, 2) == (4, 2)
    with pytest.raises(ConfigError, match="'data.train_batch_size'=9 must be divisible by the world size 2"):
        batch_plan(9, 1, 2)
    with pytest.raises(ConfigError, match="'data.micro_batch_size_per_gpu'=3 must divide the 4 rows per rank"):
        batch_plan(8, 3, 2)


def test_cli_rejects_unknown_key_with_exit_code_2():
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", "optim.learning_rat=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Config error: Unknown config key 'optim.learning_rat'" in proc.stderr


# ---------------------------------------------------------------------------------------------- runs
def _overrides(tiny_model_dir, tiny_task_dir, out_dir, steps, micro, extra=()):
    return [
        f"model.path={tiny_model_dir}",
        f"data.train_files={tiny_task_dir}/train.parquet",
        "data.train_batch_size=8",
        f"data.micro_batch_size_per_gpu={micro}",
        f"trainer.total_training_steps={steps}",
        "optim.lr=1e-3",
        "trainer.device=cpu",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=[jsonl]",
        "trainer.progress_bar=False",
        *extra,
    ]


def test_short_run_lowers_the_loss_and_saves_an_hf_folder_with_the_same_logits(tiny_model_dir, tiny_task_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = _prepare(
        compose_sft_config(
            _overrides(
                tiny_model_dir,
                tiny_task_dir,
                tmp_path / "run",
                steps=20,
                micro=4,
                extra=[f"data.val_files={tiny_task_dir}/test.parquet", "trainer.save_freq=10"],
            )
        )
    )
    with sft_process_group("cpu"):
        trainer = FSDPSFTTrainer(cfg, "cpu")
        result = trainer.fit()
        losses = [h["train/loss"] for h in result["history"]]
        assert len(losses) == 20 and all(h["train/tokens"] > 0 for h in result["history"])
        assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
        assert result["metrics"]["val/loss"] < losses[0]
        batch = pad_micro_batch([trainer.train_dataset[i] for i in range(3)], trainer.tokenizer.pad_token_id)
        trainer.model.eval()
        with torch.no_grad():
            trained = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert result["final_model_dir"] == str(tmp_path / "run" / "final")
    assert os.path.isdir(tmp_path / "run" / "global_step_10" / "huggingface")
    assert os.path.isdir(tmp_path / "run" / "global_step_20" / "huggingface")
    reloaded = AutoModelForCausalLM.from_pretrained(result["final_model_dir"], dtype=torch.float32)
    with torch.no_grad():
        logits = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert torch.allclose(logits[real], trained[real], atol=1e-5)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens"} <= set(rows[0])


def test_gradient_is_one_token_mean_however_the_batch_is_split_into_micro_batches(
    tiny_model_dir, tiny_task_dir, tmp_path
):
    runs = [
        run_sft(
            compose_sft_config(_overrides(tiny_model_dir, tiny_task_dir, tmp_path / f"m{micro}", steps=1, micro=micro))
        )["history"][0]
        for micro in (1, 8)
    ]
    # Rows differ in length, so a mean of per-micro-batch means would change the gradient (and its norm).
    assert runs[0]["train/tokens"] == runs[1]["train/tokens"]
    assert runs[0]["train/loss"] == pytest.approx(runs[1]["train/loss"], abs=1e-6)
    assert runs[0]["train/grad_norm"] == pytest.approx(runs[1]["train/grad_norm"], rel=1e-5)


def test_a_batch_without_response_tokens_skips_the_update(tiny_model_dir, tiny_task_dir, tmp_path):
    from safetensors.torch import load_file

    result = run_sft(
        compose_sft_config(
            _overrides(
                tiny_model_dir,
                tiny_task_dir,
                tmp_path / "cut",
                steps=1,
                micro=8,
                extra=["data.max_length=20", "data.truncation=right"],
            )
        )
    )
    step = result["history"][0]
    assert step["train/tokens"] == 0 and step["train/skipped_step"] == 1
    before = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    after = load_file(os.path.join(result["final_model_dir"], "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)  # exact: the skipped step saved the weights as read


@pytest.mark.e2e
def test_two_ranks_give_the_one_rank_losses_for_the_same_global_batch(tiny_model_dir, tiny_task_dir, tmp_path):
    single = run_sft(compose_sft_config(_overrides(tiny_model_dir, tiny_task_dir, tmp_path / "one", steps=2, micro=8)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "verl.trainer.fsdp_sft_trainer",
        *_overrides(tiny_model_dir, tiny_task_dir, tmp_path / "two", steps=2, micro=2),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = [json.loads(line) for line in open(tmp_path / "two" / "metrics.jsonl")]
    one = single["history"]
    # Step 1: the same loss before any update; step 2: the same update was applied (gradient reduction).
    assert two[0]["train/loss"] == pytest.approx(one[0]["train/loss"], abs=1e-5)
    assert two[0]["train/tokens"] == one[0]["train/tokens"]
    assert two[0]["train/grad_norm"] == pytest.approx(one[0]["train/grad_norm"], rel=1e-4)
    assert two[1]["train/loss"] == pytest.approx(one[1]["train/loss"], abs=1e-4)
    assert os.path.exists(tmp_path / "two" / "final" / "model.safetensors")
