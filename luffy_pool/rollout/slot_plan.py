"""The slot plan: which of the B·n rollout slots are on-policy, partial-prefix or full-trace.

``build_slot_plan`` turns a batch of prompts, their off-policy traces and the driver's prefix ratios
into per-slot engine requests (docs/METHOD.md §1.2 items 1-5); ``assemble_responses`` merges what the
engine generated back into LUFFY's padded tensors with ``prefix_mask`` (items 6-9). Full-trace slots
(trace ++ EOS) are built without the engine, which is bit-identical to LUFFY after masking (docs/METHOD.md §5.9).
``MixRolloutPlanner`` runs a plan on any ``BaseRollout`` engine; nothing here depends on vLLM.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch

from luffy_pool.rollout.off_policy_pool import strip_right_padding
from verl.utils.torch_functional import compute_position_id_with_mask, get_eos_mask
from verl.workers.rollout.base import BaseRollout, GenerationOutput, SamplingSpec, sampling_from_config

SLOT_ON = "on"  # plain generation from the prompt
SLOT_PARTIAL = "partial"  # engine continues prompt ++ prefix; the prefix is part of the response
SLOT_FULL = "full"  # the whole trace ++ EOS is the response; no engine call


@dataclasses.dataclass
class SlotPlan:
    """Everything decided before generation, for ``B·n`` slots in interleaved order (slot k = prompt k//n)."""

    n: int
    response_length: int
    pad_token_id: int
    eos_token_id: int
    prompts: torch.Tensor  # [B·n, P] left-padded prompt ids, repeated
    prompt_attention_mask: torch.Tensor  # [B·n, P]
    prompt_position_ids: torch.Tensor  # [B·n, P]
    prompt_token_ids: list[list[int]]  # per slot, padding stripped
    traces: list[list[int]]  # per slot: trace ++ [EOS], or [] when the slot has no trace
    prefixes: list[list[int]]  # per slot: traces[k][: int(len(traces[k]) · r_k)]
    kinds: list[str]  # SLOT_ON / SLOT_PARTIAL / SLOT_FULL
    prefix_ratios: list[float]
    engine_slots: list[int]  # slots the engine must continue, in request order
    engine_max_tokens: list[int]  # L − len(prefix) for each engine slot
    tgt_input_ids: Optional[
        torch.Tensor
    ]  # [B·n, T] trace of each slot (right-padded; input [B, n, T]), None in validation
    behaviour_log_probs: Optional[list[list[float]]]  # behaviour log-prob per prefix token (NaN = unknown)
    # every id the engine stops on besides EOS (the model's generation_config eos ids: verl/utils/tokenizer.py)
    stop_token_ids: tuple = ()

    @property
    def num_slots(self) -> int:
        return len(self.kinds)

    def engine_prompts(self) -> list[list[int]]:
        """Engine inputs: prompt ++ prefix for every engine slot."""
        return [self.prompt_token_ids[k] + self.prefixes[k] for k in self.engine_slots]


@dataclasses.dataclass
class RolloutBatch:
    """Assembled rollout: ``tensors`` are LUFFY's batch keys (docs/METHOD.md §1.2 item 9), ``meta_info`` the rest."""

    tensors: dict[str, torch.Tensor]
    meta_info: dict[str, Any]


def _as_float_array(ratios) -> np.ndarray:
    if isinstance(ratios, torch.Tensor):
        return ratios.detach().cpu().to(torch.float64).numpy()
    return np.asarray(ratios, dtype=np.float64)


def _per_slot_traces(
    tgt_input_ids: Optional[torch.Tensor], batch_size: int, n: int, pad_token_id: int
) -> list[list[int]]:
    if tgt_input_ids is None:
        return [[] for _ in range(batch_size * n)]
    if tgt_input_ids.dim() != 3 or tuple(tgt_input_ids.shape[:2]) != (batch_size, n):
        raise ValueError(
            f"tgt_input_ids must be per-slot traces [B={batch_size}, n={n}, T] (OffPolicyPool.slot_traces), "
            f"got {tuple(tgt_input_ids.shape)}"
        )
    return [strip_right_padding(row, pad_token_id) for row in tgt_input_ids.reshape(batch_size * n, -1).tolist()]


def _per_slot_logprobs(behaviour_log_probs: torch.Tensor, batch_size: int, n: int, width: Optional[int]) -> np.ndarray:
    """``[B, n, T + 1]`` behaviour log-probs → one row per slot ``[B·n, T + 1]``."""
    if (
        not isinstance(behaviour_log_probs, torch.Tensor)
        or behaviour_log_probs.dim() != 3
        or tuple(behaviour_log_probs.shape[:2]) != (batch_size, n)
        or (width is not None and behaviour_log_probs.shape[2] != width + 1)
    ):
        shape = (
            tuple(behaviour_log_probs.shape)
            if isinstance(behaviour_log_probs, torch.Tensor)
            else type(behaviour_log_probs).__name__
        )
        raise ValueError(
            f"behaviour_log_probs must be a tensor [B={batch_size}, n={n}, "
            f"T+1{'' if width is None else '=' + str(width + 1)}] "
            f"(OffPolicyPool.slot_traces), got {shape}"
        )
    return behaviour_log_probs.detach().cpu().double().numpy().reshape(batch_size * n, -1)


def build_slot_plan(
    prompt_ids: torch.Tensor,
    prompt_attention_mask: torch.Tensor,
    tgt_input_ids: Optional[torch.Tensor],
    ratios,
    pad_token_id: int,
    eos_token_id: int,
    response_length: int,
    behaviour_log_probs=None,
    *,
    n: Optional[int] = None,
    prompt_position_ids: Optional[torch.Tensor] = None,
    stop_token_ids: Sequence[int] = (),
) -> SlotPlan:
    """Plan the ``B·n`` slots of one rollout (docs/METHOD.md §1.2 items 1-4).

    ``prompt_ids``/``prompt_attention_mask`` ``[B, P]`` are left-padded (padding is located by the
    mask, so a prompt may contain the pad id). ``tgt_input_ids`` is exactly ``[B, n, T]``, the trace
    of every slot as ``OffPolicyPool.slot_traces`` returns it (slot ``b·n + j`` is ``[b, j]``),
    right-padded with ``pad_token_id`` (trailing pads are stripped, see ``strip_right_padding``), or
    None for no traces (validation); any other shape is an error. ``ratios`` ``[B, n]`` come from
    ``PrefixRatioSampler`` (None: all 0, then ``n`` is required). ``behaviour_log_probs`` optionally gives
    behaviour log-probs of trace ++ EOS per slot, ``[B, n, T + 1]`` (NaN = unknown).

    Per slot: trace = target ++ [EOS] when the target is non-empty, prefix = trace[: floor(len·r)].
    Kind ``full`` when the prefix is the whole trace, ``partial`` when it is a proper non-empty part,
    ``on`` otherwise. Only on/partial slots whose prefix is shorter than L reach the engine, capped at
    ``L − len(prefix)`` new tokens: anything beyond would be cut by the truncation to L.
    """
    if prompt_ids.dim() != 2 or prompt_attention_mask.shape != prompt_ids.shape:
        raise ValueError(
            f"prompt_ids and prompt_attention_mask must both be [B, P]; got {tuple(prompt_ids.shape)} and {tuple(prompt_attention_mask.shape)}"
        )
    if response_length <= 0:
        raise ValueError(f"response_length must be > 0, got {response_length}")
    batch_size = prompt_ids.shape[0]
    if ratios is None:
        if n is None:
            raise ValueError("build_slot_plan: pass ratios [B, n] or n")
        ratio_array = np.zeros((batch_size, n))
    else:
        ratio_array = _as_float_array(ratios)
        if ratio_array.ndim != 2 or ratio_array.shape[0] != batch_size:
            raise ValueError(f"ratios must be [B={batch_size}, n], got shape {ratio_array.shape}")
        if n is not None and ratio_array.shape[1] != n:
            raise ValueError(f"ratios has {ratio_array.shape[1]} slots per prompt but n={n}")
        n = ratio_array.shape[1]
        if ratio_array.size and (np.isnan(ratio_array).any() or ratio_array.min() < 0.0 or ratio_array.max() > 1.0):
            raise ValueError("prefix ratios must lie in [0, 1]")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")

    mask = prompt_attention_mask.bool()
    prompt_lists = [prompt_ids[b][mask[b]].tolist() for b in range(batch_size)]
    targets = _per_slot_traces(tgt_input_ids, batch_size, n, pad_token_id)
    width = None if tgt_input_ids is None else tgt_input_ids.shape[2]
    lp_rows = _per_slot_logprobs(behaviour_log_probs, batch_size, n, width) if behaviour_log_probs is not None else None

    flat_ratios = [float(r) for r in ratio_array.reshape(-1)]
    traces, prefixes, kinds, prefix_lps = [], [], [], []
    engine_slots, engine_max_tokens = [], []
    for k in range(batch_size * n):
        trace = targets[k] + [eos_token_id] if targets[k] else []
        prefix = trace[: int(len(trace) * flat_ratios[k])]
        kind = SLOT_ON if not prefix else (SLOT_FULL if len(prefix) == len(trace) else SLOT_PARTIAL)
        traces.append(trace)
        prefixes.append(prefix)
        kinds.append(kind)
        if kind != SLOT_FULL and response_length - len(prefix) > 0:
            engine_slots.append(k)
            engine_max_tokens.append(response_length - len(prefix))
        if lp_rows is not None:
            row = lp_rows[k]
            prefix_lps.append([float(row[t]) if t < len(row) else math.nan for t in range(len(prefix))])

    if prompt_position_ids is None:
        prompt_position_ids = compute_position_id_with_mask(prompt_attention_mask.long())
    tgt_out = None if tgt_input_ids is None else tgt_input_ids.reshape(batch_size * n, -1)
    return SlotPlan(
        n=n,
        response_length=response_length,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        prompts=prompt_ids.repeat_interleave(n, dim=0),
        prompt_attention_mask=prompt_attention_mask.repeat_interleave(n, dim=0),
        prompt_position_ids=prompt_position_ids.repeat_interleave(n, dim=0),
        prompt_token_ids=[list(prompt_lists[k // n]) for k in range(batch_size * n)],
        traces=traces,
        prefixes=prefixes,
        kinds=kinds,
        prefix_ratios=flat_ratios,
        engine_slots=engine_slots,
        engine_max_tokens=engine_max_tokens,
        tgt_input_ids=tgt_out,
        behaviour_log_probs=prefix_lps if lp_rows is not None else None,
        stop_token_ids=tuple(int(i) for i in stop_token_ids),
    )


def assemble_responses(
    plan: SlotPlan,
    generated_token_ids: Sequence[Sequence[int]],
    engine_logprobs: Optional[Sequence[torch.Tensor]] = None,
) -> RolloutBatch:
    """Merge engine output into LUFFY's rollout tensors (docs/METHOD.md §1.2 items 6-9).

    ``generated_token_ids[i]`` continues ``plan.engine_slots[i]`` (generated ids only). Per slot the
    response is ``prefix ++ generated`` right-padded with pad and truncated to L; ``prefix_mask`` is
    True on the first ``min(len(prefix), L)`` positions; the response part of ``attention_mask`` is 1
    up to and including the first EOS. ``behaviour_log_probs`` (behaviour log-prob on prefix tokens, NaN
    elsewhere and where unknown) is added when the plan carries behaviour log-probs;
    ``rollout_log_probs`` (engine log-probs of generated tokens, 0 elsewhere) when ``engine_logprobs`` (one 1-D
    tensor per engine row, as ``GenerationOutput.logprobs``) is given.
    """
    if len(generated_token_ids) != len(plan.engine_slots):
        raise ValueError(f"engine returned {len(generated_token_ids)} sequences for {len(plan.engine_slots)} requests")
    if engine_logprobs is not None and len(engine_logprobs) != len(generated_token_ids):
        raise ValueError(f"engine_logprobs has {len(engine_logprobs)} rows for {len(generated_token_ids)} sequences")
    num_slots, length = plan.num_slots, plan.response_length
    generated: list[list[int]] = [[] for _ in range(num_slots)]
    gen_logprobs: dict[int, torch.Tensor] = {}
    for i, slot in enumerate(plan.engine_slots):
        generated[slot] = list(generated_token_ids[i])
        if engine_logprobs is not None:  # one tensor per row: no Python float per token
            gen_logprobs[slot] = torch.as_tensor(engine_logprobs[i], dtype=torch.float32).reshape(-1)

    responses = torch.full((num_slots, length), plan.pad_token_id, dtype=plan.prompts.dtype)
    prefix_mask = torch.zeros((num_slots, length), dtype=torch.bool)
    lengths = torch.zeros(num_slots, dtype=torch.long)
    for k in range(num_slots):
        tokens = (plan.prefixes[k] + generated[k])[:length]
        lengths[k] = len(tokens)
        if tokens:
            responses[k, : len(tokens)] = torch.tensor(tokens, dtype=responses.dtype)
        prefix_mask[k, : min(len(plan.prefixes[k]), length)] = True

    # A response ends where the engine stopped: at its output's length (it stops on any of the model's stop ids,
    # and an id it does not know is never a stop) and, within that, at the first stop id. An EOS-only mask would
    # run a response that ended on another stop id (Qwen3's <|endoftext|>, Llama-3.1's <|eom_id|>) through the
    # padding to full length.
    stops = [plan.eos_token_id] + [i for i in plan.stop_token_ids if i != plan.eos_token_id]
    within = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    response_mask = (get_eos_mask(responses, stops, dtype=torch.bool) & within).to(plan.prompt_attention_mask.dtype)
    delta = torch.arange(1, length + 1, dtype=plan.prompt_position_ids.dtype).unsqueeze(0)
    response_position_ids = plan.prompt_position_ids[:, -1:] + delta
    tensors = {
        "prompts": plan.prompts,
        "responses": responses,
        "input_ids": torch.cat([plan.prompts, responses], dim=-1),
        "attention_mask": torch.cat([plan.prompt_attention_mask, response_mask], dim=-1),
        "position_ids": torch.cat([plan.prompt_position_ids, response_position_ids], dim=-1),
        "response_mask": response_mask,
        "prefix_mask": prefix_mask,
    }
    if plan.tgt_input_ids is not None:
        tensors["tgt_input_ids"] = plan.tgt_input_ids
    if plan.behaviour_log_probs is not None:
        behaviour = torch.full((num_slots, length), float("nan"), dtype=torch.float32)
        for k, lps in enumerate(plan.behaviour_log_probs):
            values = torch.tensor(lps[:length], dtype=torch.float32)
            if len(values):
                behaviour[k, : len(values)] = values
        tensors["behaviour_log_probs"] = behaviour
    if engine_logprobs is not None:
        rollout_log_probs = torch.zeros((num_slots, length), dtype=torch.float32)
        for k in plan.engine_slots:
            start = min(len(plan.prefixes[k]), length)
            values = gen_logprobs[k][: length - start]
            rollout_log_probs[k, start : start + len(values)] = values
        tensors["rollout_log_probs"] = rollout_log_probs
    meta_info = {
        "prefix_ratios": list(plan.prefix_ratios),
        "num_engine_requests": len(plan.engine_slots),
        "num_engine_tokens": int(sum(len(generated_token_ids[i]) for i in range(len(plan.engine_slots)))),
        "num_full_slots": plan.kinds.count(SLOT_FULL),
        "num_partial_slots": plan.kinds.count(SLOT_PARTIAL),
        "num_on_policy_slots": plan.kinds.count(SLOT_ON),
    }
    return RolloutBatch(tensors=tensors, meta_info=meta_info)


class MixRolloutPlanner:
    """Runs slot plans on a ``BaseRollout`` engine: one engine call per rollout, only for needed slots.

    Training: ``n`` slots per prompt, ratios from the driver, sampled as the rollout section says (LUFFY:
    temperature 1.0, top_p 1, top_k −1; ``do_sample=False``: greedy). Validation: ``n_val`` on-policy slots
    per prompt sampled at ``val_temperature`` (LUFFY's "greedy" validation really samples at 0.6,
    docs/METHOD.md §1.2). Every value comes from ``rollout``, the typed ``actor_rollout_ref.rollout`` section
    (``RolloutSection``; the config checker has checked it); the planner has no defaults of its own.
    """

    def __init__(
        self, engine: BaseRollout, rollout, *, pad_token_id: int, eos_token_id: int, stop_token_ids: Sequence[int] = ()
    ):
        self.engine = engine
        self.n = rollout.n
        self.n_val = rollout.n_val
        self.response_length = rollout.response_length
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.stop_token_ids = tuple(stop_token_ids)
        # ``sampling.seed`` is set per step by the worker (a resumed run samples what an uninterrupted one would).
        self.sampling, self.val_temperature = sampling_from_config(rollout)

    def run(self, plan: SlotPlan, sampling: SamplingSpec) -> RolloutBatch:
        """Send the plan's engine requests (if any) in one call and assemble all slots."""
        if plan.engine_slots:
            out: GenerationOutput = self.engine.generate_token_ids(
                plan.engine_prompts(), list(plan.engine_max_tokens), sampling
            )
            generated, logprobs = out.token_ids, out.logprobs if sampling.return_logprobs else None
        else:
            generated, logprobs = [], None
        return assemble_responses(plan, generated, logprobs)

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_attention_mask: torch.Tensor,
        tgt_input_ids: Optional[torch.Tensor],
        prefix_ratios,
        *,
        prompt_position_ids: Optional[torch.Tensor] = None,
        behaviour_log_probs=None,
    ) -> RolloutBatch:
        """Training rollout of ``B·n`` slots; ``prefix_ratios [B, n]`` come from the driver, ``tgt_input_ids
        [B, n, T]`` and ``behaviour_log_probs [B, n, T + 1]`` from ``OffPolicyPool.slot_traces``."""
        if prefix_ratios is None:
            raise ValueError("training rollout needs prefix_ratios [B, n] drawn on the driver (PrefixRatioSampler)")
        plan = build_slot_plan(
            prompt_ids,
            prompt_attention_mask,
            tgt_input_ids,
            prefix_ratios,
            self.pad_token_id,
            self.eos_token_id,
            self.response_length,
            behaviour_log_probs,
            n=self.n,
            prompt_position_ids=prompt_position_ids,
            stop_token_ids=self.stop_token_ids,
        )
        return self.run(plan, self.sampling)

    def generate_validation(
        self,
        prompt_ids: torch.Tensor,
        prompt_attention_mask: torch.Tensor,
        *,
        prompt_position_ids: Optional[torch.Tensor] = None,
    ) -> RolloutBatch:
        """Validation rollout: ``n_val`` plain samples per prompt at ``val_temperature`` (top_p 1, top_k −1)."""
        plan = build_slot_plan(
            prompt_ids,
            prompt_attention_mask,
            None,
            None,
            self.pad_token_id,
            self.eos_token_id,
            self.response_length,
            n=self.n_val,
            prompt_position_ids=prompt_position_ids,
            stop_token_ids=self.stop_token_ids,
        )
        sampling = dataclasses.replace(
            self.sampling, temperature=self.val_temperature, top_p=1.0, top_k=-1, return_logprobs=False
        )  # no correction on validation samples
        return self.run(plan, sampling)
