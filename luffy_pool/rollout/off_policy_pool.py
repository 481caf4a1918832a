"""The off-policy side of the dual pool: how much of a trace each slot gets, and which trace.

``PrefixRatioSampler`` draws, on the driver and from one seeded numpy generator, the prefix ratio of
every slot of a step (docs/METHOD.md §1.2 table), so all ranks and a resumed run see the same plan.
``OffPolicyPool`` decides which trace fills each prefix slot: the dataset's ``target`` (LUFFY) and,
optionally, extra trajectory parquets keyed by prompt id, with per-token behaviour log-probs when known.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)

PREFIX_STRATEGIES = ("random", "fixed", "linear", "linear_max", "reverse_linear")
NUM_PREFIX_WINDOWS = 10  # LUFFY splits prefix_steps into 10 equal windows


# ----------------------------------------------------------------------------------------------------
# Prefix ratios
# ----------------------------------------------------------------------------------------------------
class PrefixRatioSampler:
    """Prefix ratio ``r ∈ [0, 1]`` of every slot, per LUFFY's rollout keys (docs/METHOD.md §1.2).

    ``draw(B, global_step)`` returns ``[B, n]``: row b holds the ratios of prompt b's n slots, in the
    interleaved slot order of the rollout (slot ``b·n + j``). ``step = global_step − 1``.

    Every key comes from ``rollout``, the typed ``actor_rollout_ref.rollout`` section (``LuffyRolloutSection``:
    n, n_prefix, min/max_prefix_ratio, prefix_strategy, prefix_share_across_samples, prefix_steps,
    prefix_linear_max_ratio); the sampler has no defaults of its own, and the config checker has checked the
    values and their combinations before the run (the declarations' bounds and ``LuffyRolloutSection.validate``:
    n_prefix in [-1, n], min <= max ratio, linear needs shared ratios, fixed refuses shared ratios). Deviations from LUFFY, all where LUFFY crashes or is undefined: ``fixed`` with one prefix
    slot gives ``[min_prefix_ratio]`` (LUFFY divides by zero); ``global_step < 1`` is rejected (LUFFY's windows
    would silently pick the last one).
    """

    def __init__(self, rollout: Any, seed: int):
        self.n = rollout.n
        self.n_prefix = rollout.n_prefix
        self.min_prefix_ratio = rollout.min_prefix_ratio
        self.max_prefix_ratio = rollout.max_prefix_ratio
        self.prefix_strategy = rollout.prefix_strategy
        self.prefix_share_across_samples = rollout.prefix_share_across_samples
        self.prefix_steps = rollout.prefix_steps
        self.prefix_linear_max_ratio = rollout.prefix_linear_max_ratio
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_rollout_config(cls, rollout: Any, seed: int) -> "PrefixRatioSampler":
        """The trainer's spelling of the constructor: ``rollout`` is the run's rollout section."""
        return cls(rollout, seed)

    # -- schedule pieces -------------------------------------------------------------------------
    def window_index(self, step: int) -> int:
        """Window of ``step`` (= global_step − 1): the first i with ``i·S/10 <= step <= (i+1)·S/10``.

        Boundaries belong to the earlier window (LUFFY's inclusive comparison); after ``prefix_steps``
        the last window is reused.
        """
        for i in range(NUM_PREFIX_WINDOWS):
            lo = i * self.prefix_steps / NUM_PREFIX_WINDOWS
            hi = (i + 1) * self.prefix_steps / NUM_PREFIX_WINDOWS
            if lo <= step <= hi:
                return i
        return NUM_PREFIX_WINDOWS - 1

    def window_upper_bound(self, step: int) -> float:
        """``hi_w`` of the current window: decreasing for linear_max, increasing for reverse_linear."""
        w = self.window_index(step)
        tenths = NUM_PREFIX_WINDOWS - w if self.prefix_strategy == "linear_max" else w + 1
        return self.prefix_linear_max_ratio * tenths / NUM_PREFIX_WINDOWS

    def linear_ratio(self, step: int) -> float:
        """Shared ``linear`` schedule: ``prefix_linear_max_ratio · (1 − min(step/prefix_steps, 1))``."""
        return self.prefix_linear_max_ratio * (1.0 - min(step / self.prefix_steps, 1.0))

    def fixed_ratios(self) -> list[float]:
        """``fixed``: ``min + j·(max − min)/(k − 1)`` for the k prefix slots (k = n when n_prefix = −1)."""
        k = self.n if self.n_prefix == -1 else self.n_prefix
        step = (self.max_prefix_ratio - self.min_prefix_ratio) / (k - 1) if k > 1 else 0.0
        return [self.min_prefix_ratio + j * step for j in range(k)]

    # -- drawing -------------------------------------------------------------------------------
    def draw(self, batch_size: int, global_step: int) -> np.ndarray:
        """Ratios ``[batch_size, n]`` (float64) for the prompts of training step ``global_step`` (>= 1)."""
        if global_step < 1:
            raise ValueError(f"global_step counts training steps from 1, got {global_step}")
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        step = global_step - 1
        ratios = np.zeros((batch_size, self.n), dtype=np.float64)
        if self.prefix_share_across_samples:
            if self.prefix_strategy == "linear":
                shared = np.full(batch_size, self.linear_ratio(step))
            else:
                shared = self._rng.uniform(self.min_prefix_ratio, self.max_prefix_ratio, size=batch_size)
            k = self.n if self.n_prefix <= 0 else self.n_prefix
            ratios[:, :k] = shared[:, None]
            return ratios
        k = self.n if self.n_prefix == -1 else self.n_prefix
        if k == 0:
            return ratios
        if self.prefix_strategy == "random":
            ratios[:, :k] = self._rng.uniform(self.min_prefix_ratio, self.max_prefix_ratio, size=(batch_size, k))
        elif self.prefix_strategy in ("linear_max", "reverse_linear"):
            ratios[:, :k] = self._rng.uniform(0.0, self.window_upper_bound(step), size=(batch_size, k))
        else:  # fixed
            ratios[:, :k] = np.asarray(self.fixed_ratios())[None, :]
        return ratios

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"seed": self.seed, "bit_generator_state": self._rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "bit_generator_state" not in state:
            raise ValueError("PrefixRatioSampler state has no 'bit_generator_state' key")
        self.seed = state.get("seed", self.seed)
        self._rng.bit_generator.state = state["bit_generator_state"]


# ----------------------------------------------------------------------------------------------------
# Traces
# ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class TraceRecord:
    """One off-policy trace: token ids (no EOS) and, when known, behaviour log-probs.

    ``logprobs`` has ``len(token_ids)`` entries, or one more for the EOS the rollout appends.
    """

    token_ids: list[int]
    logprobs: Optional[list[float]]
    source: str  # "<file>:<row>" for extra traces, "target" for the dataset column


@dataclasses.dataclass
class SlotTraces:
    """Which trace each slot carries, in the one tensor form the slot plan accepts.

    The dataset gives one target per prompt (``tgt_input_ids [B, T]``); from here to the rollout the
    traces are always per slot: ``tgt_input_ids [B, n, T]`` (slot ``b·n + j`` is ``[b, j]``),
    right-padded with pad, and ``behaviour_log_probs [B, n, T + 1]`` float64 behaviour log-probs of
    trace ++ EOS (NaN = unknown) or None when nothing is known. Dim 0 stays the prompt, so a ``DataProto`` of them
    chunks across ranks like the prompts. Without extra traces both are broadcast views of the dataset
    tensors (no copy): read-only.
    """

    tgt_input_ids: torch.Tensor
    behaviour_log_probs: Optional[torch.Tensor]
    sources: np.ndarray  # object [B, n]: trace source of every prefix slot, "" otherwise
    num_extra_slots: int  # prefix slots filled from extra trace files


def logprobs_from_target_probs(target_probs: torch.Tensor) -> torch.Tensor:
    """LUFFY's probability column → behaviour log-probs, the one representation from here to the loss (NaN =
    unknown). The only converter: a probability <= 0 (LUFFY's -1 padding, or no usable value) is unknown."""
    probs = target_probs.to(torch.float64)
    return torch.where(probs > 0, torch.log(probs.clamp_min(1e-300)), torch.full_like(probs, float("nan")))


def unknown_behaviour_metrics(batch, use_off_policy_probs: bool) -> dict[str, int]:
    """Off-policy tokens (``prefix_mask``) of a step's tensors whose behaviour probability is unknown (NaN in
    ``behaviour_log_probs``: missing, 0 or LUFFY's -1 padding; all of them when the batch has no such tensor), and
    the rows holding any. With ``use_off_policy_probs`` those tokens get the configured shaping f(p) instead of
    the importance weight p / pi_b; LUFFY's loss gives a -1 entry the weight -p and a 0 entry p / 1e-6.
    Empty (nothing logged) when there are no behaviour log-probs and ``use_off_policy_probs`` is off."""
    prefix_mask = batch["prefix_mask"].bool()
    if "behaviour_log_probs" in batch.keys():
        unknown = torch.isnan(batch["behaviour_log_probs"]) & prefix_mask
    elif use_off_policy_probs:
        unknown = prefix_mask
    else:
        return {}
    return {
        "batch/behaviour_prob_unknown_rows": int(unknown.any(-1).sum()),
        "batch/behaviour_prob_unknown_tokens": int(unknown.sum()),
    }


def strip_right_padding(token_ids: Sequence[int], pad_token_id: int) -> list[int]:
    """Drop trailing pad tokens only (pads inside the trace are kept).

    With pad == EOS (Qwen-Math) this also drops a trace's own trailing EOS; the rollout appends one
    anyway, so the result is the same. A trace whose last real token is the pad id cannot be told
    apart from padding (LUFFY has the same limit).
    """
    ids = list(token_ids)
    end = len(ids)
    while end > 0 and ids[end - 1] == pad_token_id:
        end -= 1
    return ids[:end]


def _prompt_key(value: Any) -> Any:
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return str(value)


class OffPolicyPool:
    """Traces per prompt id: the dataset target first, then traces from extra parquet files.

    Extra files need columns ``<prompt_id_key>`` (matched against the training rows'
    ``extra_info.index``) and ``<trace_key>`` (text); optional ``<token_ids_key>`` (list[int], used
    instead of tokenizing the text) and ``<logprobs_key>`` (behaviour log-prob per trace token, + an
    optional last one for EOS). Traces whose prompt id is not a training prompt are counted in
    ``unmatched_trace_count`` and logged. Every row is checked at load (one line naming file, row and column):
    token ids flat, integer, in ``[0, len(tokenizer))``; log-probs finite and <= 0 (a null cell = unknown, a null
    or NaN inside the list is refused).

    Prefix slots (ratio > 0) of a prompt take its candidates round-robin. ``selection='target_first'``
    orders them [dataset target, extras in a seeded shuffle]; ``'shuffle'`` shuffles all of them. The
    shuffle is seeded by (seed, global_step, prompt id), so it needs no state to resume.

    The run's keys (``prompt_id_key`` = data.off_policy_id_key, ``truncate`` = data.truncate_off_policy,
    ``max_trace_length`` = rollout.max_prefix_len, ``seed`` = trainer.seed) have no defaults here: a pool with
    extra files takes them from the run's sections (``from_sections``, the launcher) or from its caller; a
    targets-only pool (no files) reads none of them.
    """

    SELECTIONS = ("target_first", "shuffle")

    @classmethod
    def from_sections(cls, sections, extra_trace_files, **kwargs) -> "OffPolicyPool":
        """The run's pool: its keys from the typed sections (``ConfigSections``); ``kwargs`` the rest."""
        d = sections.data
        return cls(
            extra_trace_files,
            prompt_id_key=d.off_policy_id_key,
            truncate=d.truncate_off_policy,
            max_trace_length=sections.workers.rollout.max_prefix_len,
            seed=sections.trainer.seed,
            **kwargs,
        )

    def __init__(
        self,
        extra_trace_files: str | Sequence[str] | None = None,
        *,
        known_prompt_ids: Optional[Sequence[Any]] = None,
        tokenizer=None,
        prompt_id_key: Optional[str] = None,
        trace_key: str = "trace",
        token_ids_key: str = "token_ids",
        logprobs_key: str = "logprobs",
        max_trace_length: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        strip_think_prefix: bool = False,
        use_dataset_target: bool = True,
        selection: str = "target_first",
        seed: Optional[int] = None,
        truncate: Optional[str] = None,
    ):
        files = [extra_trace_files] if isinstance(extra_trace_files, str) else list(extra_trace_files or [])
        missing = [
            k
            for k, v in (
                ("prompt_id_key", prompt_id_key),
                ("max_trace_length", max_trace_length),
                ("seed", seed),
                ("truncate", truncate),
            )
            if v is None
        ]
        if files and missing:
            raise TypeError(
                f"OffPolicyPool with extra_trace_files needs {', '.join(missing)} (the run's keys; "
                "OffPolicyPool.from_sections takes them from the config)"
            )
        self.truncate = truncate
        self.long_trace_count = 0
        if selection not in self.SELECTIONS:
            raise ValueError(f"unknown pool selection {selection!r}; valid: {', '.join(self.SELECTIONS)}")
        if files and known_prompt_ids is None:
            raise ValueError(
                "OffPolicyPool: extra_trace_files need known_prompt_ids (the training rows' extra_info.index)"
            )
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id if pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
        self.prompt_id_key = prompt_id_key
        self.trace_key = trace_key
        self.token_ids_key = token_ids_key
        self.logprobs_key = logprobs_key
        self.max_trace_length = max_trace_length
        self.strip_think_prefix = strip_think_prefix
        self.use_dataset_target = use_dataset_target
        self.selection = selection
        self.seed = seed
        self._known = {_prompt_key(p) for p in known_prompt_ids} if known_prompt_ids is not None else set()
        self._extra: dict[Any, list[TraceRecord]] = defaultdict(list)
        self.unmatched_trace_count = 0
        self.unmatched_prompt_ids: list[Any] = []
        for path in files:
            self._load_file(path)
        if self.long_trace_count:
            logger.warning(
                "OffPolicyPool: %d extra trace(s) are longer than rollout.max_prefix_len=%s tokens; "
                "data.truncate_off_policy=%s %s",
                self.long_trace_count,
                self.max_trace_length,
                truncate,
                "keeps their first tokens" if truncate == "cut" else "leaves them out",
            )
        if self.unmatched_trace_count:
            logger.warning(
                "OffPolicyPool: %d extra trace(s) match no training prompt (ids e.g. %s); they are not used",
                self.unmatched_trace_count,
                self.unmatched_prompt_ids[:5],
            )

    # -- loading -------------------------------------------------------------------------------
    def _load_file(self, path: str) -> None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"extra trace file not found: {path}")
        from verl.utils.dataset.rl_dataset import read_parquet_named

        frame = read_parquet_named(path)
        for column in (self.prompt_id_key, self.trace_key):
            if column not in frame.columns:
                raise ValueError(f"{path}: missing column {column!r} (columns: {list(frame.columns)})")
        has_ids = self.token_ids_key in frame.columns
        has_lps = self.logprobs_key in frame.columns
        if not has_ids and self.tokenizer is None:
            raise ValueError(
                f"{path}: no {self.token_ids_key!r} column; pass tokenizer= to tokenize column {self.trace_key!r}"
            )
        name = os.path.basename(path)
        for row, record in enumerate(frame.to_dict("records")):
            key = _prompt_key(record[self.prompt_id_key])
            token_ids = self._row_token_ids(path, row, record, has_ids)
            logprobs = self._row_logprobs(path, row, record, len(token_ids)) if has_lps else None
            if self.max_trace_length is not None and len(token_ids) > self.max_trace_length:
                self.long_trace_count += 1
                if self.truncate == "drop":
                    continue
                token_ids = token_ids[: self.max_trace_length]
                # The EOS log-prob belongs after the full trace, not after the truncated one.
                logprobs = logprobs[: self.max_trace_length] if logprobs is not None else None
            if key not in self._known:
                self.unmatched_trace_count += 1
                self.unmatched_prompt_ids.append(key)
                continue
            self._extra[key].append(TraceRecord(token_ids, logprobs, f"{name}:{row}"))

    def _row_token_ids(self, path: str, row: int, record, has_ids: bool) -> list[int]:
        value = record[self.token_ids_key] if has_ids else None
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                raise ValueError(
                    f"{path}: row {row}: column {self.token_ids_key!r} must be a list of ints, got {type(value).__name__}"
                )
            ids = self._checked_ids(path, row, value)
        else:
            text = record[self.trace_key]
            if not isinstance(text, str):
                raise ValueError(
                    f"{path}: row {row}: column {self.trace_key!r} must be a string, got {type(text).__name__}"
                )
            if self.tokenizer is None:
                raise ValueError(f"{path}: row {row}: column {self.token_ids_key!r} is null and no tokenizer was given")
            if self.strip_think_prefix and text.startswith("<think>\n"):
                text = text[len("<think>\n") :]
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError(f"{path}: row {row}: empty trace (columns {self.trace_key!r}/{self.token_ids_key!r})")
        return ids

    def _checked_ids(self, path: str, row: int, value) -> list[int]:
        """Flat non-negative int ids below the tokenizer's vocabulary size (when a tokenizer is known)."""
        vocab = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else None
        ids = []
        for k, t in enumerate(value):
            if (
                isinstance(t, (bool, np.bool_))
                or not isinstance(t, (int, np.integer, float, np.floating))
                or (isinstance(t, (float, np.floating)) and not float(t).is_integer())
            ):
                kind = "a nested list" if hasattr(t, "__len__") and not isinstance(t, str) else repr(t)[:40]
                raise ValueError(
                    f"{path}: row {row}: column {self.token_ids_key!r}: value {k} is {kind}; expected a "
                    "flat list of integer token ids"
                )
            t = int(t)
            if t < 0 or (vocab is not None and t >= vocab):
                raise ValueError(
                    f"{path}: row {row}: column {self.token_ids_key!r}: token id {t} at position {k} is "
                    f"outside the tokenizer's vocabulary [0, {vocab if vocab is not None else 'inf'})"
                )
            ids.append(t)
        return ids

    def _row_logprobs(self, path: str, row: int, record, num_tokens: int) -> Optional[list[float]]:
        value = record[self.logprobs_key]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise ValueError(
                f"{path}: row {row}: column {self.logprobs_key!r} must be a list of floats, got {type(value).__name__}"
            )
        lps = []
        for k, v in enumerate(value):
            # A null/NaN inside the list (pandas writes NaN as null) is not "unknown": a whole null cell is.
            if v is None or isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(
                    f"{path}: row {row}: column {self.logprobs_key!r}: value {k} is {v!r:.40}; expected a "
                    "finite log-probability (leave the whole cell null when they are unknown)"
                )
            if not math.isfinite(float(v)):
                raise ValueError(
                    f"{path}: row {row}: column {self.logprobs_key!r}: value {k} is {float(v)}; expected a "
                    "finite log-probability (a -inf would make the importance weight explode)"
                )
            lps.append(float(v))
        if len(lps) not in (num_tokens, num_tokens + 1):
            raise ValueError(
                f"{path}: row {row}: column {self.logprobs_key!r} has {len(lps)} values for {num_tokens} trace tokens "
                f"(expected {num_tokens} or {num_tokens + 1} with the EOS)"
            )
        if any(v > 1e-6 for v in lps):
            raise ValueError(
                f"{path}: row {row}: column {self.logprobs_key!r} holds positive values; expected log-probabilities"
            )
        return lps

    # -- queries -------------------------------------------------------------------------------
    @property
    def has_extra_traces(self) -> bool:
        return bool(self._extra)

    @property
    def has_extra_logprobs(self) -> bool:
        """Whether any extra trace carries behaviour log-probs."""
        return any(r.logprobs is not None for records in self._extra.values() for r in records)

    @property
    def num_extra_traces(self) -> int:
        return sum(len(v) for v in self._extra.values())

    def extra_traces_for(self, prompt_id: Any) -> list[TraceRecord]:
        return list(self._extra.get(_prompt_key(prompt_id), []))

    def candidates(self, prompt_id: Any, target: Optional[TraceRecord], global_step: int) -> list[TraceRecord]:
        """Ordered traces that the prefix slots of one prompt take round-robin."""
        extras = self.extra_traces_for(prompt_id)
        target_list = [target] if (target is not None and target.token_ids and self.use_dataset_target) else []
        key = _prompt_key(prompt_id)
        rng = np.random.default_rng([self.seed, max(global_step, 0), zlib.crc32(repr(key).encode())])
        if self.selection == "target_first":
            order = rng.permutation(len(extras))
            return target_list + [extras[i] for i in order]
        pool = target_list + extras
        return [pool[i] for i in rng.permutation(len(pool))]

    def slot_traces(
        self,
        prompt_ids: Sequence[Any],
        tgt_input_ids: torch.Tensor,
        ratios: np.ndarray | torch.Tensor,
        global_step: int,
        *,
        pad_token_id: Optional[int] = None,
        behaviour_log_probs: Optional[torch.Tensor] = None,
    ) -> SlotTraces:
        """Fill the prefix slots (ratio > 0) of every prompt of a batch with traces; see ``SlotTraces``.

        ``tgt_input_ids [B, T]`` are the dataset targets (right-padded), ``behaviour_log_probs
        [B, T + 1]`` their behaviour log-probs (NaN = unknown; see ``logprobs_from_target_probs``).
        Non-prefix slots keep the dataset target, as LUFFY repeats it over the whole group. Returns
        ``[B, n, T]`` traces and ``[B, n, T + 1]`` log-probs (or None) whether or not the pool has
        extra traces. ``pad_token_id`` defaults to the pool's (constructor argument or tokenizer).
        """
        if pad_token_id is None:
            pad_token_id = self.pad_token_id
        if pad_token_id is None:
            raise ValueError(
                "OffPolicyPool.slot_traces needs pad_token_id (pass it here, or pad_token_id=/tokenizer= to the pool)"
            )
        ratios_np = ratios.detach().cpu().numpy() if isinstance(ratios, torch.Tensor) else np.asarray(ratios)
        if tgt_input_ids.dim() != 2:
            raise ValueError(f"tgt_input_ids must be the dataset targets [B, T], got {tuple(tgt_input_ids.shape)}")
        batch_size, width = tgt_input_ids.shape
        if ratios_np.ndim != 2 or ratios_np.shape[0] != batch_size:
            raise ValueError(f"ratios must be [B={batch_size}, n], got shape {ratios_np.shape}")
        if len(prompt_ids) != batch_size:
            raise ValueError(f"prompt_ids has {len(prompt_ids)} entries for a batch of {batch_size}")
        if behaviour_log_probs is not None and tuple(behaviour_log_probs.shape) != (batch_size, width + 1):
            raise ValueError(
                f"behaviour_log_probs must be [B, T+1] = [{batch_size}, {width + 1}], "
                f"got {tuple(behaviour_log_probs.shape)}"
            )
        n = ratios_np.shape[1]
        sources = np.full((batch_size, n), "", dtype=object)
        if not self.has_extra_traces:
            for b in range(batch_size):
                non_empty = bool(strip_right_padding(tgt_input_ids[b].tolist(), pad_token_id))
                if self.use_dataset_target and non_empty:
                    sources[b, ratios_np[b] > 0] = "target"
            if not self.use_dataset_target:
                tgt_input_ids = torch.full_like(tgt_input_ids, pad_token_id)
                behaviour_log_probs = None
            # Every slot of a prompt carries its target: broadcast views, not n copies.
            slot_ids = tgt_input_ids.unsqueeze(1).expand(batch_size, n, width)
            slot_lps = (
                None
                if behaviour_log_probs is None
                else behaviour_log_probs.to(torch.float64).unsqueeze(1).expand(batch_size, n, width + 1)
            )
            return SlotTraces(slot_ids, slot_lps, sources, 0)

        slot_ids = torch.full((batch_size, n, width), pad_token_id, dtype=tgt_input_ids.dtype)
        slot_lps = torch.full((batch_size, n, width + 1), float("nan"), dtype=torch.float64)
        any_logprobs = behaviour_log_probs is not None
        num_extra = 0
        for b in range(batch_size):
            target_ids = strip_right_padding(tgt_input_ids[b].tolist(), pad_token_id)
            target_lp = behaviour_log_probs[b].tolist() if behaviour_log_probs is not None else None
            target = TraceRecord(target_ids, target_lp, "target")
            cands = self.candidates(prompt_ids[b], target, global_step)
            prefix_slot = 0
            for j in range(n):
                chosen = target if self.use_dataset_target else None
                if ratios_np[b, j] > 0 and cands:
                    chosen = cands[prefix_slot % len(cands)]
                    prefix_slot += 1
                    sources[b, j] = chosen.source
                    num_extra += chosen.source != "target"
                if chosen is None:
                    continue
                ids = chosen.token_ids[:width]
                slot_ids[b, j, : len(ids)] = torch.tensor(ids, dtype=slot_ids.dtype)
                if chosen.logprobs is not None:
                    any_logprobs = True
                    lps = chosen.logprobs[: width + 1]
                    if len(chosen.token_ids) > width:
                        lps = lps[:width]  # truncated trace: the EOS entry no longer applies
                    slot_lps[b, j, : len(lps)] = torch.tensor(lps, dtype=torch.float64)
        return SlotTraces(slot_ids, slot_lps if any_logprobs else None, sources, num_extra)
