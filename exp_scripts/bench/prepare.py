"""Build the benchmark's shared inputs once: two tiny model folders, the task parquets, the prompt width.

Fixed-length case: the random tiny model (docs/CPU_STACK.md §2's ``rnd``). It almost never samples EOS, so
with ``ignore_eos`` / ``min_new_tokens`` every contender generates AND trains on the full 64 tokens
per row (a model that does sample EOS would still be cut at its first EOS by our response mask, and
our update would then do less work than TRL's). Natural-stop case: the same model SFT-warmed for a
few hundred steps on the task's teacher traces (about 35 tokens + EOS), so it stops by itself well
before the cap. Within a case every contender loads the same folder.
"""

from __future__ import annotations

import json
import os
import time

THINK_OPEN = "<think>\n"


def sft_texts(tokenizer, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, completion_ids)`` per task row: templated prompt, then the target trace + EOS.

    The generation prompt already opens ``<think>\\n``; the trace's own copy is dropped so the model
    learns to continue the prompt, not to repeat it.
    """
    out = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        target = row["target"]
        if prompt.endswith(THINK_OPEN) and target.startswith(THINK_OPEN):
            target = target[len(THINK_OPEN) :]
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append((prompt_ids, completion_ids))
    return out


def _sft_batch(pairs, pad_id: int):
    import torch

    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for r, (p, c) in enumerate(pairs):  # right padding: positions start at 0 for every row
        seq = p + c
        ids[r, : len(seq)] = torch.tensor(seq)
        labels[r, len(p) : len(seq)] = torch.tensor(c)
        mask[r, : len(seq)] = 1
    return ids, mask, labels


def sft_warm(
    model_dir: str, rows: list[dict], steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0
) -> dict:
    """Teacher-forced training on the completions only; saves the model back into ``model_dir``."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    pairs = sft_texts(tok, rows)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask, labels = _sft_batch(rng.sample(pairs, min(batch_size, len(pairs))), tok.pad_token_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.save_pretrained(model_dir)
    return {
        "sft_steps": steps,
        "sft_loss_first": losses[0] if losses else None,
        "sft_loss_last": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
    }


def natural_lengths(model_dir: str, rows: list[dict], prompts: int, samples: int, max_new_tokens: int) -> dict:
    """Mean completion length and stop rate of one sampled batch (EOS counted, as the trainers count it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    enc = tok.apply_chat_template(
        [r["prompt"] for r in rows[:prompts]],
        add_generation_prompt=True,
        tokenize=True,
        padding=True,
        return_tensors="pt",
        return_dict=True,
    )
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=samples,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    completions = out[:, enc["input_ids"].shape[1] :]
    is_eos = completions == tok.eos_token_id
    stopped = is_eos.any(-1)
    lengths = torch.where(
        stopped, is_eos.int().argmax(-1) + 1, torch.full_like(stopped, completions.shape[1], dtype=torch.long)
    )
    return {
        "natural_mean_len": float(lengths.float().mean()),
        "natural_stop_rate": float(stopped.float().mean()),
        "natural_max_len": int(lengths.max()),
    }


def prompt_width(model_dir: str, rows: list[dict]) -> int:
    """Longest templated prompt in tokens (the trainer's ``data.max_prompt_length``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return max(
        len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False))
        for r in rows
    )


def prepare(work_dir: str, sft_steps: int, prompts: int, samples: int, max_new_tokens: int, result_path: str) -> dict:
    """Write ``model_fixed`` (random), ``model_natural`` (SFT-warmed) and ``task`` under ``work_dir``."""
    import shutil

    import pandas as pd

    from luffy_pool.tiny import build_tiny_model, write_task_parquets

    start = time.perf_counter()
    fixed_dir, natural_dir, task_dir = (os.path.join(work_dir, d) for d in ("model_fixed", "model_natural", "task"))
    build_tiny_model(fixed_dir)
    shutil.copytree(fixed_dir, natural_dir)
    write_task_parquets(task_dir, n_train=256, n_test=16, level=2, seed=0)
    frame = pd.read_parquet(f"{task_dir}/train.parquet")
    rows = [{"prompt": list(r["prompt"]), "target": r["target"][0]["content"]} for r in frame.to_dict("records")]
    info = {"model_dirs": {"fixed": fixed_dir, "natural": natural_dir}, "task_dir": task_dir}
    info.update(sft_warm(natural_dir, rows, sft_steps))
    info["natural_lengths"] = {
        case: natural_lengths(path, rows, prompts, samples, max_new_tokens) for case, path in info["model_dirs"].items()
    }
    info["max_prompt_tokens"] = prompt_width(fixed_dir, rows)
    info["seconds"] = time.perf_counter() - start
    with open(result_path, "w") as f:
        json.dump(info, f, indent=1)
    return info
