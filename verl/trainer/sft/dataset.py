"""Prompt/response rows for SFT: tokenized sequences with a loss mask on the response tokens, batching.

A row is the chat-templated prompt (generation prompt included) followed by the response and the EOS
token; ``loss_mask`` is 1 exactly on the response tokens and the EOS. Files are read at construction
(their columns and value types are checked there, errors name file, row and column); tokenization
happens per item, so a 45k-row file with 16k-token traces does not sit in memory as token lists.
Batches are planned by seeded permutation per epoch and split into equal rank slices, so a run gives
the same rows per optimizer step at any world size.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

THINK_OPEN = "<think>\n"
TRUNCATIONS = ("error", "left", "right")


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _read_table(path: str):
    import pandas as pd

    if not os.path.exists(path):
        raise FileNotFoundError(f"SFT data file not found: {path}")
    if path.endswith(".parquet"):
        return pd.read_parquet(path)
    if path.endswith(".jsonl"):
        return pd.read_json(path, lines=True)
    if path.endswith(".json"):
        return pd.read_json(path)
    raise ValueError(f"{path}: unsupported file type; expected .parquet, .jsonl or .json")


def prompt_messages(value: Any, where: str) -> list[dict]:
    """A prompt cell as chat messages: a list of {role, content} dicts, or a string -> one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if (
        _is_list(value)
        and len(value) > 0
        and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    ):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"{where}: expected a string or a non-empty list of {{role, content}} messages, got {value!r:.80}")


def response_text(value: Any, where: str) -> str:
    """A response cell as text: a string, or a list holding exactly one message dict with a 'content' string."""
    if isinstance(value, str):
        return value
    if (
        _is_list(value)
        and len(value) == 1
        and isinstance(value[0], Mapping)
        and isinstance(value[0].get("content"), str)
    ):
        return value[0]["content"]
    raise ValueError(f"{where}: expected a string or a list with one {{content}} message, got {value!r:.80}")


def truncate(prompt_ids: list[int], response_ids: list[int], max_length: int, mode: str) -> tuple[list[int], list[int]]:
    """Cut prompt + response to ``max_length`` tokens: ``left`` drops from the start (prompt first),
    ``right`` from the end (response first). ``error`` callers check the length before."""
    excess = len(prompt_ids) + len(response_ids) - max_length
    if excess <= 0:
        return prompt_ids, response_ids
    if mode == "left":
        cut_prompt = min(excess, len(prompt_ids))
        return prompt_ids[cut_prompt:], response_ids[excess - cut_prompt :]
    if mode == "right":
        cut_response = min(excess, len(response_ids))
        return prompt_ids[: len(prompt_ids) - (excess - cut_response)], response_ids[: len(response_ids) - cut_response]
    raise ValueError(f"data.truncation must be one of {TRUNCATIONS}, got {mode!r}")


class SFTDataset(Dataset):
    """Rows of one or more files; item ``i`` -> ``{input_ids, loss_mask}`` (1-D LongTensors, no padding)."""

    def __init__(
        self,
        files: Union[str, Sequence[str]],
        tokenizer,
        prompt_key: str = "prompt",
        response_key: str = "target",
        max_length: int = 1024,
        truncation: str = "error",
        strip_think_prefix: bool = True,
    ):
        if truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation must be one of {TRUNCATIONS}, got {truncation!r}")
        if max_length < 1:
            raise ValueError(f"data.max_length must be >= 1, got {max_length}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token_id; the response must end with EOS")
        self.files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
        if not self.files:
            raise ValueError("SFTDataset: no data files given")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.strip_think_prefix = strip_think_prefix
        self._warned_empty = False
        self.prompts: list[list[dict]] = []
        self.responses: list[str] = []
        self.sources: list[tuple[str, int]] = []
        for path in map(os.fspath, self.files):
            table = _read_table(path)
            for key, what in ((prompt_key, "data.prompt_key"), (response_key, "data.response_key")):
                if key not in table.columns:
                    raise ValueError(f"{path}: missing column {key!r} ({what}); columns: {list(table.columns)}")
            for row, (prompt, response) in enumerate(zip(table[prompt_key], table[response_key])):
                self.prompts.append(prompt_messages(prompt, f"{path}: row {row}: column {prompt_key!r}"))
                self.responses.append(response_text(response, f"{path}: row {row}: column {response_key!r}"))
                self.sources.append((path, row))
        if not self.prompts:
            raise ValueError(f"SFTDataset: no rows in {self.files}")

    def __len__(self) -> int:
        return len(self.prompts)

    def source_of(self, item: int) -> str:
        path, row = self.sources[item]
        return f"{path}: row {row}"

    def token_ids(self, item: int) -> tuple[list[int], list[int]]:
        """Untruncated (prompt ids, response ids + EOS) of one row."""
        prompt_text = self.tokenizer.apply_chat_template(self.prompts[item], add_generation_prompt=True, tokenize=False)
        response = self.responses[item]
        if self.strip_think_prefix and prompt_text.endswith(THINK_OPEN) and response.startswith(THINK_OPEN):
            response = response[len(THINK_OPEN) :]
        prompt_ids = list(self.tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        response_ids = list(self.tokenizer(response, add_special_tokens=False)["input_ids"]) + [
            self.tokenizer.eos_token_id
        ]
        return prompt_ids, response_ids

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        prompt_ids, response_ids = self.token_ids(item)
        total = len(prompt_ids) + len(response_ids)
        if total > self.max_length:
            if self.truncation == "error":
                raise ValueError(
                    f"{self.source_of(item)}: {total} tokens (prompt {len(prompt_ids)} + response "
                    f"{len(response_ids)}) > data.max_length={self.max_length}; raise data.max_length or "
                    "set data.truncation=left|right"
                )
            prompt_ids, response_ids = truncate(prompt_ids, response_ids, self.max_length, self.truncation)
            if not response_ids and not self._warned_empty:
                self._warned_empty = True
                logger.warning(
                    "%s: the prompt alone fills data.max_length=%d, the row keeps no response token "
                    "(warned once); raise data.max_length",
                    self.source_of(item),
                    self.max_length,
                )
        ids = torch.tensor(prompt_ids + response_ids, dtype=torch.long)
        mask = torch.zeros_like(ids)
        mask[len(prompt_ids) :] = 1
        return {"input_ids": ids, "loss_mask": mask}


def pad_micro_batch(
    items: Sequence[Mapping[str, torch.Tensor]], pad_token_id: int, keep: Optional[Sequence[bool]] = None
) -> dict[str, torch.Tensor]:
    """Right-pad items to the longest one: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``.

    ``keep[i] = False`` zeroes row i's loss mask (a filler row that only keeps ranks in step).
    """
    width = max(len(item["input_ids"]) for item in items)
    out = {
        "input_ids": torch.full((len(items), width), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(items), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(items), width), dtype=torch.long),
    }
    for i, item in enumerate(items):
        n = len(item["input_ids"])
        out["input_ids"][i, :n] = item["input_ids"]
        out["attention_mask"][i, :n] = 1
        if keep is None or keep[i]:
            out["loss_mask"][i, :n] = item["loss_mask"]
    # Right padding: positions are 0..n-1 on the real tokens; pads repeat n-1 and are masked anyway.
    out["position_ids"] = torch.clamp(torch.cumsum(out["attention_mask"], dim=-1) - 1, min=0)
    return out


def loss_token_count(loss_mask: torch.Tensor) -> int:
    """Tokens that carry loss: response tokens that have a previous token to be predicted from."""
    return int(loss_mask[..., 1:].sum())


def epoch_batches(num_rows: int, batch_size: int, epoch: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Global batches of one epoch: a permutation seeded by (seed, epoch), cut into full batches (last partial dropped)."""
    if num_rows < batch_size:
        raise ValueError(f"data.train_batch_size={batch_size} exceeds the {num_rows} training rows")
    order = np.random.default_rng([seed, epoch]).permutation(num_rows) if shuffle else np.arange(num_rows)
    return [order[i : i + batch_size].tolist() for i in range(0, num_rows - batch_size + 1, batch_size)]


def rank_slice(batch: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The contiguous share of a global batch that one rank trains on."""
    per_rank = len(batch) // world_size
    return list(batch[rank * per_rank : (rank + 1) * per_rank])


def strided_shard(num_rows: int, rank: int, world_size: int) -> tuple[list[int], list[bool]]:
    """Rows of a rank for evaluation (every world_size-th row) padded to an equal count on every rank.

    Returns (row indices, keep flags); padding repeats row 0 with keep=False so all ranks run the same
    number of FSDP forwards.
    """
    rows = list(range(rank, num_rows, world_size))
    per_rank = -(-num_rows // world_size)
    keep = [True] * len(rows) + [False] * (per_rank - len(rows))
    return rows + [0] * (per_rank - len(rows)), keep
