"""Prompt dataset for RL: chat-templated, left-padded prompt ids plus the row's reward metadata.

Reads one or more parquet files in verl/LUFFY format (docs/METHOD.md §3.1: ``prompt`` chat list,
``data_source``, ``reward_model.ground_truth``, ``extra_info.index``), checks every row at load time
(errors name file, row and column), drops prompts longer than ``max_prompt_length`` (counted and
logged) and yields tensors ``input_ids``/``attention_mask``/``position_ids`` ``[max_prompt_length]``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.utils.dataset.value_checks import ground_truth_problem, prompt_is_blank
from verl.utils.torch_functional import compute_position_id_with_mask

logger = logging.getLogger(__name__)

TRUNCATIONS = ("error", "left", "right")


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def read_parquet_named(path: str):
    """``pandas.read_parquet`` whose errors (not parquet, invalid UTF-8, unreadable) name the file."""
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types; one line with the file is what helps
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: cannot read as parquet ({type(exc).__name__}: {first})") from None


class RLHFDataset(Dataset):
    """Prompts of one or more parquet files; other columns are carried through unchanged.

    ``truncation`` applies only when ``filter_overlong_prompts=False``: ``error`` raises naming the
    row, ``left`` keeps the last ``max_prompt_length`` tokens, ``right`` the first ones.
    ``index`` = ``extra_info['index']``; a row without one gets its position in the dataset (LUFFY
    uses 0 there, which would merge such prompts in the off-policy pool).
    """

    # Columns the dataset consumes instead of carrying them through.
    consumed_columns: tuple[str, ...] = ()

    def __init__(
        self,
        parquet_files: str | Sequence[str],
        tokenizer,
        prompt_key: str = "prompt",
        max_prompt_length: int = 1024,
        truncation: str = "error",
        filter_overlong_prompts: bool = True,
    ):
        import pandas as pd

        if truncation not in TRUNCATIONS:
            raise ValueError(f"unknown data.truncation {truncation!r}; valid: {', '.join(TRUNCATIONS)}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be > 0, got {max_prompt_length}")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad_token_id; set one before building the dataset")
        self.files = [parquet_files] if isinstance(parquet_files, (str, os.PathLike)) else list(parquet_files)
        if not self.files:
            raise ValueError("RLHFDataset: no parquet files given")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.filter_overlong_prompts = filter_overlong_prompts

        frames, sources = [], []
        for path in self.files:
            path = os.fspath(path)
            if not os.path.exists(path):
                raise FileNotFoundError(f"parquet file not found: {path}")
            frame = read_parquet_named(path)
            if len(frame) == 0:
                raise ValueError(f"{path}: the file has 0 rows (columns: {list(frame.columns)})")
            self._check_columns(path, frame)
            columns = [c for c in self.checked_columns() if c in frame.columns]
            for row, values in enumerate(zip(*(frame[c] for c in columns))):
                self._check_row(path, row, dict(zip(columns, values)))
            frames.append(frame)
            sources.extend((path, row) for row in range(len(frame)))
        dataframe = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)

        templated = [self._template(prompt) for prompt in dataframe[prompt_key]]
        token_ids = tokenizer(templated, add_special_tokens=False)["input_ids"] if templated else []
        lengths = [len(ids) for ids in token_ids]
        keep = [True] * len(templated)
        if filter_overlong_prompts:
            keep = [length <= max_prompt_length for length in lengths]
        elif truncation == "error":
            # Without filtering, an over-long prompt would stop the run only when the sampler draws it.
            over = [i for i, length in enumerate(lengths) if length > max_prompt_length]
            if over:
                path, row = sources[over[0]]
                raise ValueError(
                    f"{path}: row {row}: column {prompt_key!r}: prompt has {lengths[over[0]]} tokens > "
                    f"data.max_prompt_length={max_prompt_length} ({len(over)} such prompt(s) in {len(lengths)}; "
                    f"data.filter_overlong_prompts=True drops them)"
                )
        self.num_dropped_prompts = keep.count(False)
        if self.num_dropped_prompts:
            logger.warning(
                "RLHFDataset: dropped %d of %d prompts longer than max_prompt_length=%d tokens (%s)",
                self.num_dropped_prompts,
                len(keep),
                max_prompt_length,
                ", ".join(self.files),
            )
        kept = [i for i, k in enumerate(keep) if k]
        if not kept:
            raise ValueError(
                f"no prompt of {', '.join(map(str, self.files))} fits data.max_prompt_length={max_prompt_length} "
                f"(shortest templated prompt: {min(lengths, default=0)} tokens)"
            )
        self.dataframe = dataframe.iloc[kept].reset_index(drop=True)
        self._templated = [templated[i] for i in kept]
        self._sources = [sources[i] for i in kept]
        # Items are served from these (the batch tokenization above and plain dicts): re-tokenizing and
        # pandas row access per item were most of the driver's time between training steps.
        self._prompt_token_ids = [np.asarray(token_ids[i], dtype=np.int64) for i in kept]
        self._records = self.dataframe.to_dict("records")
        self.num_rows_loaded = len(keep)

    # -- load-time checks (subclasses extend) ---------------------------------------------------
    def checked_columns(self) -> list[str]:
        """Columns whose values ``_check_row`` reads."""
        return [self.prompt_key, "data_source", "reward_model"]

    def _check_columns(self, path: str, frame) -> None:
        for column in (self.prompt_key, "data_source", "reward_model"):
            if column not in frame.columns:
                raise ValueError(f"{path}: missing column {column!r} (columns: {list(frame.columns)})")

    def _check_row(self, path: str, row: int, record) -> None:
        prompt = record[self.prompt_key]
        if not _is_list(prompt) or len(prompt) == 0:
            raise ValueError(
                f"{path}: row {row}: column {self.prompt_key!r}: expected a non-empty list of {{role, content}} messages, got {type(prompt).__name__}"
            )
        for i, message in enumerate(prompt):
            if (
                not isinstance(message, Mapping)
                or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)
            ):
                raise ValueError(
                    f"{path}: row {row}: column {self.prompt_key!r}: message {i} must be a {{role: str, content: str}} dict, got {message!r:.80}"
                )
        if prompt_is_blank(prompt):
            raise ValueError(
                f"{path}: row {row}: column {self.prompt_key!r}: the prompt is empty (every message's content is blank)"
            )
        reward_model = record["reward_model"]
        if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
            raise ValueError(
                f"{path}: row {row}: column 'reward_model': missing 'ground_truth' (got {reward_model!r:.80})"
            )
        problem = ground_truth_problem(reward_model["ground_truth"])
        if problem is not None:  # the graders cannot use it: every reward of the row would be 0 (or wrong)
            raise ValueError(f"{path}: row {row}: column 'reward_model': ground_truth {problem}")
        if not isinstance(record["data_source"], str):
            raise ValueError(
                f"{path}: row {row}: column 'data_source' must be a string, got {type(record['data_source']).__name__}"
            )

    def _template(self, prompt) -> str:
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.dataframe)

    def source_of(self, item: int) -> str:
        """``"<file>: row <r>"`` of a dataset item, for error messages."""
        path, row = self._sources[item]
        return f"{path}: row {row}"

    @property
    def prompt_ids(self) -> list[Any]:
        """``index`` of every kept row (what the off-policy pool matches extra traces on)."""
        if "extra_info" not in self.dataframe.columns:
            return list(range(len(self)))
        return [self._index_of(item, {"extra_info": info}) for item, info in enumerate(self.dataframe["extra_info"])]

    @property
    def generation_prompt_opens_think(self) -> bool:
        """True when every templated prompt ends with ``<think>\\n`` (the LUFFY base model's template)."""
        return bool(self._templated) and all(t.endswith("<think>\n") for t in self._templated)

    def _index_of(self, item: int, record: Mapping[str, Any]) -> Any:
        extra_info = record.get("extra_info")
        if isinstance(extra_info, Mapping) and extra_info.get("index") is not None:
            return extra_info["index"]
        return item

    def _encode_prompt(self, item: int) -> dict[str, torch.Tensor]:
        ids = self._prompt_token_ids[item]
        limit = self.max_prompt_length
        if len(ids) > limit:
            if self.truncation == "error":
                raise ValueError(
                    f"{self.source_of(item)}: column {self.prompt_key!r}: prompt has {len(ids)} tokens > data.max_prompt_length={limit}"
                )
            ids = ids[-limit:] if self.truncation == "left" else ids[:limit]
        pad = limit - len(ids)
        input_ids = torch.full((limit,), self.tokenizer.pad_token_id, dtype=torch.long)
        input_ids[pad:] = torch.from_numpy(ids)
        attention_mask = torch.zeros(limit, dtype=torch.long)
        attention_mask[pad:] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
        }

    def __getitem__(self, item: int) -> dict[str, Any]:
        record = self._records[item]
        row: dict[str, Any] = self._encode_prompt(item)
        for key, value in record.items():
            if key != self.prompt_key and key not in self.consumed_columns:
                row[key] = value
        row["index"] = self._index_of(item, record)
        return row
