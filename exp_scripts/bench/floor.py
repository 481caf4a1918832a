"""The floor: the least a GRPO step can cost in one process (HF ``generate`` + one update).

Per step: ``generate`` 8 prompts x 8 samples (static batching, as HF does), mask after the first EOS,
grade with the project's grader, group-normalised advantages ``(r - mean) / (std + 1e-4)``, one
forward over the completions, the clipped token loss averaged over completion tokens (TRL's default
``dapo`` aggregation; with one update per generation the ratio is 1 and old log-probs are the detached
new ones, so no extra forward pass), backward, ``clip_grad_norm_(1.0)``, AdamW.
"""

from __future__ import annotations

import random
import time

from bench.common import BenchSpec, load_task_rows, make_grader, set_torch_threads, write_result
from bench.cpu_load import StepRecorder


def group_advantages(rewards, group_size: int):
    """``(r - group mean) / (group std + 1e-4)`` per group of ``group_size`` consecutive rows."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(-1, keepdim=True)
    std = grouped.std(-1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


def completion_mask(completions, eos_id: int):
    """1 up to and including the first EOS of each row, 0 after it."""
    import torch

    is_eos = completions == eos_id
    first = torch.where(
        is_eos.any(-1), is_eos.int().argmax(-1), torch.full_like(is_eos[:, 0], completions.shape[1], dtype=torch.long)
    )
    return (torch.arange(completions.shape[1]).expand_as(completions) <= first[:, None]).long()


def clipped_token_loss(logp, advantages, mask, clip: float = 0.2):
    """``-min(ratio A, clip(ratio) A)`` averaged over completion tokens; ratio = exp(logp - logp.detach())."""
    import torch

    ratio = torch.exp(logp - logp.detach())
    adv = advantages[:, None]
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def run(spec: BenchSpec, result_path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = set_torch_threads(spec.threads)
    torch.manual_seed(spec.seed)
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(spec.model_dir)
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    grader = make_grader(tok)
    rows = load_task_rows(spec.task_dir)
    random.Random(spec.seed).shuffle(rows)
    gen_kwargs = dict(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=spec.max_new_tokens,
        num_return_sequences=spec.samples,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    if spec.fixed:
        gen_kwargs["min_new_tokens"] = spec.max_new_tokens  # EOS is masked until the cap
    startup_s = time.perf_counter() - start
    recorder = StepRecorder()
    for step in range(spec.warmup + spec.steps):
        batch = [rows[(step * spec.prompts + i) % len(rows)] for i in range(spec.prompts)]
        enc = tok.apply_chat_template(
            [r["prompt"] for r in batch],
            add_generation_prompt=True,
            tokenize=True,
            padding=True,
            return_tensors="pt",
            return_dict=True,
        )
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            out = model.generate(**enc, **gen_kwargs)
        gen_s = time.perf_counter() - t0
        prompt_width = enc["input_ids"].shape[1]
        completions = out[:, prompt_width:]
        mask = completion_mask(completions, tok.eos_token_id)
        texts = tok.batch_decode([c[m.bool()] for c, m in zip(completions, mask)], skip_special_tokens=False)
        truth = [r for r in batch for _ in range(spec.samples)]
        t1 = time.perf_counter()
        scores, _ = grader.score_texts([(r["data_source"], t, r["ground_truth"], None) for r, t in zip(truth, texts)])
        reward_s = time.perf_counter() - t1
        adv = group_advantages(torch.tensor(scores, dtype=torch.float32), spec.samples)
        model.train()
        full_mask = torch.cat([enc["attention_mask"].repeat_interleave(spec.samples, 0), mask], dim=1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(
            input_ids=out, attention_mask=full_mask, position_ids=positions, logits_to_keep=completions.shape[1] + 1
        ).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None]).squeeze(-1)
        loss = clipped_token_loss(logp, adv, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recorder.mark(gen_s=gen_s, reward_s=reward_s, gen_tokens=int(mask.sum()), reward_mean=sum(scores) / len(scores))
    grader.close()
    write_result(
        result_path,
        spec,
        recorder.steps,
        startup_s=startup_s,
        torch_threads=threads,
        notes="HF generate (static batch) + one clipped-loss update per step",
    )
