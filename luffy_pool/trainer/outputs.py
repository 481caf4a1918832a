"""What a run writes besides metrics: rollouts per step (``trainer.rollout_data_dir``) and the validation
samples shown to the trackers (``trainer.val_generations_to_log``).

Both decode a rolled-out batch (``prompts`` [N, P] left-padded, ``responses`` [N, L], ``attention_mask``
over prompt ++ response) into one record per row; the trainer decides when they are called.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch


def _texts(batch, tokenizer, rows: Optional[int] = None) -> tuple[list[str], list[str]]:
    """(prompt text, response text) per row, padding removed by the attention mask."""
    prompts, responses = batch.batch["prompts"], batch.batch["responses"]
    mask = batch.batch["attention_mask"]
    width = prompts.shape[-1]
    rows = len(prompts) if rows is None else min(rows, len(prompts))
    prompt_texts, response_texts = [], []
    for i in range(rows):
        p_ids = prompts[i][mask[i, :width].bool()]
        r_ids = responses[i][mask[i, width:].bool()]
        prompt_texts.append(tokenizer.decode(p_ids.tolist(), skip_special_tokens=True))
        response_texts.append(tokenizer.decode(r_ids.tolist(), skip_special_tokens=True))
    return prompt_texts, response_texts


def _column(batch, key: str, rows: int) -> list:
    if key in batch.batch.keys():
        value = batch.batch[key][:rows]
        return value.sum(-1).tolist() if value.dim() > 1 else value.tolist()
    if key in batch.non_tensor_batch:
        return [v.item() if hasattr(v, "item") else v for v in batch.non_tensor_batch[key][:rows]]
    return [None] * rows


def rollout_records(batch, tokenizer, step: int) -> list[dict]:
    """One JSON-able record per row of a training step: prompt, response, score (sequence sum), advantage
    (first response token; constant over a GRPO row's tokens unless prefix weights differ), number of
    off-policy prefix tokens, group uid and data source."""
    prompts, responses = _texts(batch, tokenizer)
    rows = len(prompts)
    scores = _column(batch, "token_level_scores", rows)
    advantages = batch.batch["advantages"][:, 0].tolist() if "advantages" in batch.batch.keys() else [None] * rows
    prefix = _column(batch, "prefix_mask", rows)
    uids, sources = _column(batch, "uid", rows), _column(batch, "data_source", rows)
    return [
        {
            "step": int(step),
            "input": p,
            "output": r,
            "score": s,
            "advantage": a,
            "prefix_tokens": pre,
            "uid": u,
            "data_source": ds,
        }
        for p, r, s, a, pre, u, ds in zip(prompts, responses, scores, advantages, prefix, uids, sources)
    ]


def dump_rollouts(directory: str, step: int, records: list[dict]) -> str:
    """Write ``<directory>/<step>.jsonl`` (one line per row); returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{int(step)}.jsonl")
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")
    return path


def validation_samples(batch, scores: torch.Tensor, tokenizer, limit: int) -> list[dict]:
    """Up to ``limit`` (input, output, score) records from a scored validation batch, in row order."""
    if limit <= 0:
        return []
    prompts, responses = _texts(batch, tokenizer, rows=limit)
    values = scores.sum(-1).tolist() if scores.dim() > 1 else scores.tolist()
    return [{"input": p, "output": r, "score": float(s)} for p, r, s in zip(prompts, responses, values)]
