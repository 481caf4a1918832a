"""Self-replay: the policy's own earlier successes as a source of the off-policy pool.

``SelfReplayBuffer`` keeps, per prompt id, correct on-policy responses with their behaviour log-probs
(log-probs, NaN = unknown, as everywhere between the dataset and the loss) and the training step that
produced them. When a later group of that prompt has no on-policy success, the trainer asks the buffer
for a trace and puts it into the group's off-policy slot (``luffy_pool.replay.self_replay``). Capacity (total
and per prompt), eviction (oldest or seeded random) and a maximum age in steps bound what it keeps.

Every random choice draws from a generator seeded by (seed, step, prompt id, insert counter), so the
buffer needs no RNG state to resume; ``save``/``load`` write it without pickle: a JSON index plus one
safetensors file of token ids and log-probs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch

from luffy_pool.rollout.off_policy_pool import TraceRecord, _prompt_key

EVICTIONS = ("oldest", "random")
SELECTIONS = ("latest", "random")
INDEX_FILE = "replay_buffer.json"
TENSOR_FILE = "replay_buffer.safetensors"
STATE_VERSION = 1


@dataclasses.dataclass
class ReplayEntry:
    """One kept success: response tokens without the EOS, behaviour log-probs of tokens ++ EOS, its step."""

    token_ids: list[int]
    logprobs: list[float]  # len(token_ids) + 1; the last one is the EOS (NaN when the response had none)
    step: int

    def age(self, step: int) -> int:
        return int(step) - self.step

    def as_trace(self, prompt_id: Any) -> TraceRecord:
        return TraceRecord(list(self.token_ids), list(self.logprobs), f"replay:{prompt_id}@{self.step}")


class SelfReplayBuffer:
    """Correct on-policy responses per prompt id (``data.self_replay.*``).

    Args:
        capacity: traces kept over all prompts (the eviction rule picks the one to drop beyond it).
        max_per_prompt: traces kept per prompt (the eviction rule picks among that prompt's traces).
        eviction: ``oldest`` (smallest step, then insertion order) or ``random`` (seeded).
        max_age: a trace older than this many steps is dropped before use (-1 / None: never).
        selection: which kept trace a replay uses: ``latest`` or ``random`` (seeded).
        seed: seed of the random choices.

    Inserting a trace the prompt already holds (same tokens) refreshes its step and log-probs instead
    of keeping a duplicate.
    """

    def __init__(
        self,
        capacity: int = 4096,
        max_per_prompt: int = 2,
        eviction: str = "oldest",
        max_age: Optional[int] = -1,
        selection: str = "latest",
        seed: int = 0,
    ):
        if int(capacity) < 1:
            raise ValueError(f"data.self_replay.capacity must be >= 1, got {capacity}")
        if int(max_per_prompt) < 1:
            raise ValueError(f"data.self_replay.max_per_prompt must be >= 1, got {max_per_prompt}")
        if eviction not in EVICTIONS:
            raise ValueError(f"data.self_replay.eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
        if selection not in SELECTIONS:
            raise ValueError(f"data.self_replay.selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
        if max_age is not None and int(max_age) < -1:
            raise ValueError(f"data.self_replay.max_age must be -1 (no limit) or >= 0, got {max_age}")
        self.capacity = int(capacity)
        self.max_per_prompt = int(max_per_prompt)
        self.eviction = eviction
        self.max_age = None if max_age is None or int(max_age) < 0 else int(max_age)
        self.selection = selection
        self.seed = int(seed)
        # Prompt order = first insertion; entries per prompt in insertion order (eviction ties break on it).
        self._entries: "OrderedDict[Any, list[ReplayEntry]]" = OrderedDict()
        self._inserts = 0  # counter mixed into the random-eviction seed

    @classmethod
    def from_config(cls, cfg, seed: int = 0) -> "SelfReplayBuffer":
        """Build from ``data.self_replay`` (``luffy_pool.config.sections.SelfReplaySection``)."""
        return cls(
            capacity=int(cfg.capacity),
            max_per_prompt=int(cfg.max_per_prompt),
            eviction=str(cfg.eviction),
            max_age=cfg.max_age,
            selection=str(cfg.selection),
            seed=seed,
        )

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    @property
    def num_prompts(self) -> int:
        return len(self._entries)

    def entries(self, prompt_id: Any) -> list[ReplayEntry]:
        return list(self._entries.get(_prompt_key(prompt_id), []))

    def mean_age(self, step: int) -> float:
        ages = [e.age(step) for v in self._entries.values() for e in v]
        return float(np.mean(ages)) if ages else 0.0

    def _rng(self, *parts: Any) -> np.random.Generator:
        return np.random.default_rng([self.seed, *(zlib.crc32(repr(p).encode()) for p in parts)])

    # ------------------------------------------------------------------ updates
    def insert(self, prompt_id: Any, token_ids: Sequence[int], logprobs: Optional[Sequence[float]], step: int) -> int:
        """Keep one correct response of ``prompt_id`` produced at ``step``; returns how many traces were evicted.

        ``logprobs`` has one entry per token and optionally one more for the EOS (NaN = unknown); None = all
        unknown.
        """
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError(f"self-replay: empty response for prompt {prompt_id!r}")
        lps = [math.nan] * (len(ids) + 1) if logprobs is None else [float(v) for v in logprobs]
        if len(lps) == len(ids):
            lps.append(math.nan)
        if len(lps) != len(ids) + 1:
            raise ValueError(f"self-replay: {len(lps)} log-probs for {len(ids)} tokens of prompt {prompt_id!r}")
        key = _prompt_key(prompt_id)
        self._inserts += 1
        kept = self._entries.setdefault(key, [])
        for i, entry in enumerate(kept):
            if entry.token_ids == ids:  # the same success again: it is now as fresh as this step
                kept.pop(i)
                break
        kept.append(ReplayEntry(ids, lps, int(step)))
        evicted = 0
        while len(kept) > self.max_per_prompt:
            kept.pop(self._victim(kept, key, step))
            evicted += 1
        while len(self) > self.capacity:
            self._evict_global(step)
            evicted += 1
        if not kept:
            self._entries.pop(key, None)
        return evicted

    def _victim(self, entries: list[ReplayEntry], key: Any, step: int) -> int:
        if self.eviction == "oldest":
            return min(range(len(entries)), key=lambda i: (entries[i].step, i))
        return int(self._rng("evict", key, step, self._inserts).integers(len(entries)))

    def _evict_global(self, step: int) -> None:
        slots = [(key, i) for key, v in self._entries.items() for i in range(len(v))]
        if self.eviction == "oldest":  # ties: the prompt inserted first, then that prompt's first trace
            key, i = slots[min(range(len(slots)), key=lambda j: (self._entries[slots[j][0]][slots[j][1]].step, j))]
        else:
            key, i = slots[int(self._rng("evict-global", step, self._inserts).integers(len(slots)))]
        self._entries[key].pop(i)
        if not self._entries[key]:
            del self._entries[key]

    def expire(self, step: int) -> int:
        """Drop traces older than ``max_age`` steps at ``step``; returns how many were dropped."""
        if self.max_age is None:
            return 0
        dropped = 0
        for key in list(self._entries):
            keep = [e for e in self._entries[key] if e.age(step) <= self.max_age]
            dropped += len(self._entries[key]) - len(keep)
            if keep:
                self._entries[key] = keep
            else:
                del self._entries[key]
        return dropped

    def sample(self, prompt_id: Any, step: int) -> Optional[ReplayEntry]:
        """A kept trace of ``prompt_id`` no older than ``max_age`` at ``step`` (``selection`` rule), or None."""
        key = _prompt_key(prompt_id)
        fresh = [e for e in self._entries.get(key, []) if self.max_age is None or e.age(step) <= self.max_age]
        if not fresh:
            return None
        if self.selection == "latest":
            return max(fresh, key=lambda e: e.step)  # max keeps the later-inserted one on a tie of steps
        return fresh[int(self._rng("sample", key, step).integers(len(fresh)))]

    # ------------------------------------------------------------------ checkpoint (no pickle)
    def state_dict(self) -> dict:
        """JSON-able settings and index plus two flat tensors (token ids, log-probs) for the traces."""
        index, ids, lps = [], [], []
        for key, entries in self._entries.items():
            for e in entries:
                index.append({"prompt_id": key, "step": e.step, "num_tokens": len(e.token_ids)})
                ids.extend(e.token_ids)
                lps.extend(e.logprobs)
        return {
            "version": STATE_VERSION,
            "inserts": self._inserts,
            "settings": self.settings(),
            "index": index,
            "token_ids": torch.tensor(ids, dtype=torch.int64),
            "logprobs": torch.tensor(lps, dtype=torch.float64),
        }

    def settings(self) -> dict:
        return {
            "capacity": self.capacity,
            "max_per_prompt": self.max_per_prompt,
            "eviction": self.eviction,
            "max_age": self.max_age,
            "selection": self.selection,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the kept traces (this buffer's own settings stay: a resumed run may change them)."""
        if int(state.get("version", -1)) != STATE_VERSION:
            raise ValueError(f"self-replay state version {state.get('version')!r}, expected {STATE_VERSION}")
        ids, lps = state["token_ids"].tolist(), state["logprobs"].tolist()
        entries: "OrderedDict[Any, list[ReplayEntry]]" = OrderedDict()
        pos_ids = pos_lps = 0
        for row, rec in enumerate(state["index"]):
            k = int(rec["num_tokens"])
            if k < 1 or pos_ids + k > len(ids) or pos_lps + k + 1 > len(lps):
                raise ValueError(f"self-replay state: index row {row} ({rec}) does not fit the stored tensors")
            entries.setdefault(rec["prompt_id"], []).append(
                ReplayEntry(ids[pos_ids : pos_ids + k], lps[pos_lps : pos_lps + k + 1], int(rec["step"]))
            )
            pos_ids, pos_lps = pos_ids + k, pos_lps + k + 1
        if pos_ids != len(ids) or pos_lps != len(lps):
            raise ValueError("self-replay state: the stored tensors hold more values than the index describes")
        self._entries = entries
        self._inserts = int(state.get("inserts", 0))

    def save(self, directory: str) -> list[str]:
        """Write ``replay_buffer.json`` and ``replay_buffer.safetensors`` into ``directory``; returns the paths."""
        from safetensors.torch import save_file

        state = self.state_dict()
        tensors = {"token_ids": state.pop("token_ids"), "logprobs": state.pop("logprobs")}
        os.makedirs(directory, exist_ok=True)
        index_path, tensor_path = os.path.join(directory, INDEX_FILE), os.path.join(directory, TENSOR_FILE)
        save_file(tensors, tensor_path)
        with open(index_path, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        return [index_path, tensor_path]

    def load(self, directory: str) -> None:
        """Read what ``save`` wrote in ``directory`` (missing files -> FileNotFoundError naming them)."""
        from safetensors.torch import load_file

        index_path, tensor_path = os.path.join(directory, INDEX_FILE), os.path.join(directory, TENSOR_FILE)
        for path in (index_path, tensor_path):
            if not os.path.exists(path):
                raise FileNotFoundError(f"self-replay checkpoint file missing: {path}")
        with open(index_path) as f:
            state = json.load(f)
        state.update(load_file(tensor_path))
        self.load_state_dict(state)
