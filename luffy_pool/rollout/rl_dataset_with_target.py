"""LUFFY's training dataset: prompts plus the off-policy trace of each row (docs/METHOD.md §1.1).

On top of ``verl.utils.dataset.RLHFDataset`` (left-padded prompts, over-long prompts dropped) it
tokenizes ``target[0]['content']`` without special tokens — minus a leading ``<think>\\n`` when the
templated prompt already opens one — truncates it to ``max_target_length`` (``rollout.max_prefix_len``)
and right-pads it with pad into ``tgt_input_ids`` (``[B, T]`` collated: one per prompt; the trainer turns
them into the per-slot traces ``[B, n, T]`` the rollout takes with ``OffPolicyPool.slot_traces``). The
slot plan appends the EOS later.
Traces longer than ``max_target_length`` are counted at load (one warning): ``truncate_off_policy=cut``
keeps their first tokens (LUFFY; the answer at the end may be lost), ``drop`` gives that prompt no
trace; each item says whether its trace was cut (``tgt_truncated``, summed into a per-step metric).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import logging
import math

import numpy as np
import torch

from luffy_pool.rollout.off_policy_pool import logprobs_from_target_probs
from verl.utils.dataset.collate import collate_fn
from verl.utils.dataset.rl_dataset import RLHFDataset, _is_list

__all__ = ["RLHFDatasetWithTarget", "collate_fn"]

logger = logging.getLogger(__name__)

THINK_OPEN = "<think>\n"
TRUNCATE_OFF_POLICY = ("cut", "drop")
SAMPLE_TARGET_MODES = ("redraw", "fixed")


def target_probability_problem(probs: Sequence[Any]) -> str | None:
    """Why a row's teacher-probability list is unusable (None when it is fine); see ``_check_target_probs``."""
    for k, value in enumerate(probs):
        if value is None:
            return f"value {k} is null (a missing probability inside the list; use -1 for unknown)"
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            return f"value {k} is {value!r:.40}, not a number"
        v = float(value)
        if math.isnan(v):
            return f"value {k} is NaN (use -1 for unknown; LUFFY pads with -1)"
        if not (0.0 < v <= 1.0 or v in (0.0, -1.0)):
            return f"value {k} is {v!r}, outside (0, 1]: expected probabilities (-1 or 0 = unknown)" + (
                "; log-probabilities belong in an off-policy file's 'logprobs'" if v < 0 else ""
            )
    return None


class RLHFDatasetWithTarget(RLHFDataset):
    """Rows with ``tgt_input_ids [max_target_length]`` (and ``behaviour_log_probs`` when the column exists).

    With probability ``1 − sample_target_ratio`` a row's target is replaced by an empty one (all pad).
    ``sample_target_mode=redraw`` (LUFFY: ``np.random.rand()`` on every ``__getitem__``) draws again on each
    read of an item, from a generator seeded with ``(seed, item, k)``: k is the epoch of the training sampler
    (``use_epoch_of``; checkpointed, so a resumed run draws the same) or else the item's read count in this
    process; a prompt keeps its trace in some epochs and not in others. ``fixed`` draws once per item from
    ``(seed, item)``, the same subset every epoch. A null target is also empty. ``behaviour_log_probs``
    (behaviour log-probs from ``target_ds_qwen_7b_probs``, LUFFY's teacher probability of each target token
    plus one for the EOS) has width ``max_target_length + 1`` so
    the EOS entry fits; NaN marks unknown (padding, a dropped target, the EOS after a truncated target).
    Log-probs with NaN = unknown is the one representation from here to the loss. LUFFY's
    ``target_lst`` column is dropped (it never reaches the loss).
    """

    def __init__(
        self,
        parquet_files: str | Sequence[str],
        tokenizer,
        prompt_key: str = "prompt",
        target_key: str = "target",
        max_prompt_length: int = 1024,
        max_target_length: int = 8192,
        sample_target_ratio: float = 1.0,
        truncation: str = "error",
        filter_overlong_prompts: bool = True,
        target_probs_key: str = "target_ds_qwen_7b_probs",
        target_list_key: str = "target_lst",
        seed: int = 0,
        truncate_off_policy: str = "cut",
        sample_target_mode: str = "redraw",
    ):
        if sample_target_mode not in SAMPLE_TARGET_MODES:
            raise ValueError(
                f"data.sample_target_mode must be one of {SAMPLE_TARGET_MODES}, got {sample_target_mode!r}"
            )
        self.sample_target_mode = sample_target_mode
        self._reads: dict[int, int] = {}  # item -> reads so far (redraw mode's draw index without a sampler)
        self._epoch_source = None  # the training sampler, whose epoch is the draw index (use_epoch_of)
        if truncate_off_policy not in TRUNCATE_OFF_POLICY:
            raise ValueError(
                f"data.truncate_off_policy must be one of {TRUNCATE_OFF_POLICY}, got {truncate_off_policy!r}"
            )
        self.truncate_off_policy = truncate_off_policy
        if max_target_length <= 0:
            raise ValueError(f"rollout.max_prefix_len (max_target_length) must be > 0, got {max_target_length}")
        if not 0.0 <= sample_target_ratio <= 1.0:
            raise ValueError(f"data.sample_target_ratio must be in [0, 1], got {sample_target_ratio}")
        self.target_key = target_key
        self.max_target_length = max_target_length
        self.sample_target_ratio = sample_target_ratio
        self.target_probs_key = target_probs_key
        self.target_list_key = target_list_key
        self.seed = seed
        self.consumed_columns = (target_key, target_probs_key, target_list_key)
        super().__init__(
            parquet_files,
            tokenizer,
            prompt_key=prompt_key,
            max_prompt_length=max_prompt_length,
            truncation=truncation,
            filter_overlong_prompts=filter_overlong_prompts,
        )
        self.has_target_probs = target_probs_key in self.dataframe.columns
        self.long_target_items = self._find_long_targets()
        if self.has_target_probs:
            self._check_target_probs()

    # -- load-time checks ----------------------------------------------------------------------
    def checked_columns(self) -> list[str]:
        return super().checked_columns() + [self.target_key]

    def _check_columns(self, path: str, frame) -> None:
        super()._check_columns(path, frame)
        if self.target_key not in frame.columns:
            raise ValueError(f"{path}: missing column {self.target_key!r} (columns: {list(frame.columns)})")

    def _check_row(self, path: str, row: int, record: Mapping[str, Any]) -> None:
        super()._check_row(path, row, record)
        target = record[self.target_key]
        if target is None:
            return  # a null target is allowed: that prompt gets no off-policy sample
        if not _is_list(target) or len(target) == 0:
            raise ValueError(
                f"{path}: row {row}: column {self.target_key!r}: expected a non-empty list of messages or null, got {target!r:.80}"
            )
        first = target[0]
        if not isinstance(first, Mapping) or not isinstance(first.get("content"), str):
            raise ValueError(
                f"{path}: row {row}: column {self.target_key!r}: target[0] must be a dict with a 'content' string, got {first!r:.80}"
            )

    def _check_target_probs(self) -> None:
        """Every row's probability column, at load: values and length (one line naming file, row, column).

        The rule (``target_probability_problem``): each value is a probability in (0, 1], or exactly -1 or 0,
        LUFFY's markers for "unknown" (its -1 padding), which become NaN log-probs like a null cell. A null
        or NaN *inside* the list, inf, other negatives and values above 1 are broken data and are refused.
        The count must be the target's tokens (+ 1 for the EOS), checked on the full target text, so a row
        fails here and not when the sampler first draws it.
        """
        items = [
            (i, r[self.target_probs_key])
            for i, r in enumerate(self._records)
            if r[self.target_key] is not None and _is_list(r[self.target_probs_key])
        ]
        for item, probs in items:
            problem = target_probability_problem(probs)
            if problem:
                raise ValueError(f"{self.source_of(item)}: column {self.target_probs_key!r}: {problem}")
        for start in range(0, len(items), 256):
            chunk = items[start : start + 256]
            texts = [self._full_target_text(i, self._records[i][self.target_key]) for i, _ in chunk]
            for (item, probs), ids in zip(chunk, self.tokenizer(texts, add_special_tokens=False)["input_ids"]):
                if len(probs) not in (len(ids), len(ids) + 1):
                    raise ValueError(
                        f"{self.source_of(item)}: column {self.target_probs_key!r} has {len(probs)} values for a "
                        f"target of {len(ids)} tokens (expected {len(ids) + 1}: one per token plus the EOS)"
                    )

    def _full_target_text(self, item: int, target: Any) -> str:
        content = target[0]["content"]
        if self._templated[item].endswith(THINK_OPEN) and content.startswith(THINK_OPEN):
            content = content[len(THINK_OPEN) :]
        return content

    # -- items ---------------------------------------------------------------------------------
    def keeps_target(self, item: int, read: int | None = None) -> bool:
        """The reproducible ``sample_target_ratio`` draw of one item (``read``: its read index, redraw mode)."""
        if self.sample_target_ratio >= 1.0:
            return True
        if self.sample_target_mode == "fixed":
            return bool(np.random.default_rng([self.seed, item]).random() < self.sample_target_ratio)
        return bool(np.random.default_rng([self.seed, item, int(read or 0)]).random() < self.sample_target_ratio)

    def use_epoch_of(self, sampler) -> None:
        """Key redraw mode's draws on ``sampler.epoch`` (the resumable sampler's, saved with checkpoints)."""
        self._epoch_source = sampler

    def _draw_keeps_target(self, item: int) -> bool:
        """The draw of this read of ``item`` (redraw mode: index = sampler epoch, else the item's read count)."""
        if self._epoch_source is not None:
            return self.keeps_target(item, int(self._epoch_source.epoch))
        read = self._reads.get(item, 0)
        if self.sample_target_mode == "redraw":
            self._reads[item] = read + 1
        return self.keeps_target(item, read)

    def _target_text(self, item: int, target: Any, keep: bool = True) -> str | None:
        if target is None or not keep:
            return None
        content = target[0]["content"]
        if self._templated[item].endswith(THINK_OPEN) and content.startswith(THINK_OPEN):
            content = content[len(THINK_OPEN) :]
        return content

    def _find_long_targets(self) -> frozenset:
        """Items whose trace exceeds ``max_target_length`` tokens; logs one warning with the count.

        Only texts of at least ``max_target_length`` UTF-8 bytes are tokenized (a token spans >= 1 byte).
        """
        limit = self.max_target_length
        # Any read may keep a trace (redraw mode), so every non-null trace is checked, without drawing.
        texts = [(i, self._target_text(i, r[self.target_key])) for i, r in enumerate(self._records)]
        candidates = [(i, t) for i, t in texts if t is not None and len(t.encode("utf-8")) >= limit]
        long_items, longest = [], 0
        for start in range(0, len(candidates), 256):
            chunk = candidates[start : start + 256]
            ids = self.tokenizer([t for _, t in chunk], add_special_tokens=False)["input_ids"]
            for (item, _), toks in zip(chunk, ids):
                if len(toks) > limit:
                    long_items.append(item)
                    longest = max(longest, len(toks))
        if long_items:
            with_trace = sum(t is not None for _, t in texts)
            action = (
                "keeps their first tokens (their final answer may be cut off)"
                if self.truncate_off_policy == "cut"
                else "drops them (those prompts train on-policy only)"
            )
            logger.warning(
                "%d of %d off-policy traces (column %r) are longer than rollout.max_prefix_len=%d tokens "
                "(longest %d); data.truncate_off_policy=%s %s",
                len(long_items),
                with_trace,
                self.target_key,
                limit,
                longest,
                self.truncate_off_policy,
                action,
            )
        return frozenset(long_items)

    def target_token_ids(self, item: int, target: Any, keep: bool = True) -> list[int]:
        """Untruncated token ids of an item's target (``[]`` for a null, not kept (``keep=False``: the
        sample_target_ratio draw) or (``drop``) over-long target)."""
        content = self._target_text(item, target, keep)
        if content is None or (self.truncate_off_policy == "drop" and item in self.long_target_items):
            return []
        return list(self.tokenizer(content, add_special_tokens=False)["input_ids"])

    def _behaviour_log_probs(self, item: int, probs: Any, num_tokens: int, num_kept: int) -> torch.Tensor:
        out = torch.full((self.max_target_length + 1,), float("nan"), dtype=torch.float32)
        if probs is None or isinstance(probs, float) or num_tokens == 0:
            return out  # null, or NaN where another file of the dataset lacks the column
        values = [float(p) for p in probs]
        if len(values) not in (num_tokens, num_tokens + 1):
            raise ValueError(
                f"{self.source_of(item)}: column {self.target_probs_key!r} has {len(values)} values for a target of "
                f"{num_tokens} tokens (expected {num_tokens + 1}: one per token plus the EOS)"
            )
        kept = values[:num_kept] + (
            [values[num_tokens]] if num_kept == num_tokens and len(values) == num_tokens + 1 else []
        )  # the EOS follows the full target only
        if kept:
            out[: len(kept)] = logprobs_from_target_probs(torch.tensor(kept, dtype=torch.float64)).float()
        return out

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        record = self._records[item]
        ids = self.target_token_ids(item, record[self.target_key], keep=self._draw_keeps_target(item))
        kept = ids[: self.max_target_length]
        tgt = torch.full((self.max_target_length,), self.tokenizer.pad_token_id, dtype=torch.long)
        if kept:
            tgt[: len(kept)] = torch.tensor(kept, dtype=torch.long)
        row["tgt_input_ids"] = tgt
        row["tgt_truncated"] = torch.tensor(len(ids) > len(kept))
        if self.has_target_probs:
            row["behaviour_log_probs"] = self._behaviour_log_probs(
                item, record[self.target_probs_key], len(ids), len(kept)
            )
        return row
