"""``algorithm.method=uft`` (arXiv 2505.16984, liumy2010/UFT): a hint (the first ``s_j`` segments of the prompt's
solution) continued by every rollout of the group, ``j ∼ Binomial(m, p(t))`` with ``p(t)`` cosine annealed
0.95 -> 0.05 over ``T_hint`` steps and 0 after, and ``β·`` the hint tokens' NLL added to the GRPO loss. Its pure
blocks first, then the method's wiring.

Blocks: mirror liumy2010/UFT (commit ad3c8ec7): ``verl/utils/dataset/rl_dataset.py`` ``RLHFDataset.__getitem__``
(hint sampling) -> :func:`hint_probability`, :func:`cut_points`, :func:`stage_index`, :func:`sample_hint`;
``verl/utils/torch_functional.py`` ``tokenize_and_postprocess_data`` -> :func:`tokenize_with_hint`; the hint
cross-entropy lines of ``verl/workers/actor/dp_actor.py`` ``update_policy`` (with their ``masked_mean``,
denominator clamped to ≥ 1e-6) -> :func:`hint_nll_loss`. Quirks kept: at most 5 segments whatever the solution
length, cut points ``round(j/m·n)`` with Python's round-half-to-even; the hint length is a sum of ``m``
Bernoulli(p) draws made with ``rng.choice([0, 1], p=[1−p, p], size=m)`` (same numpy stream as theirs); ``t``
starts at 1 and ``p(T_hint) = p_low``, 0 after; the hint is tokenised separately and concatenated after the
prompt (not tokenised jointly); the hint mask marks the positions whose *next* token is a hint token
(``[−h−1:−1]``), padded and truncated with the ids. The hint NLL clamps the (temperature-divided) prompt logits to
[−100, 100] and is 0 without hint tokens. Fixed: a row whose hint list is empty gets no hint (theirs divides by
zero). :func:`split_solution` is ours: a lossless pre-processor cutting a full solution into line segments.

Wiring onto the slot plan: UFT appends the hint to the prompt; here the hint is the first part of every slot's
response, a prefix the engine continues (``prefix_mask`` marks it): the tokens the policy is conditioned on, and
the hint tokens' log-probs, are the same (the hint is tokenised on its own, as UFT's). The ``uft`` loss keeps the
hint tokens out of the policy gradient and puts them in the NLL term. The entropy bonus and the KL loss to the
reference also leave the hint tokens out (``regularise_prefix_tokens=False``: the actor averages both over the
continuation tokens only), as UFT's ``dp_actor.py`` ``update_policy`` (liumy2010/UFT @ ad3c8ec7, lines 281 and
289-292) averages them over its ``response_mask``, the continuation, the hint being prompt there. Differences this
leaves: the hint takes part of ``data.max_response_length`` (UFT: of the prompt length); the reward scores hint +
continuation (UFT's verl reward decodes prompt + response, so the same text); no ±100 logit clamp on the NLL (only
logits beyond it differ).

The draw (:class:`UftHintSampler`): per prompt one hint for all its ``n`` slots, from the ``algorithm.uft.hint_key``
column (a list of segments, written by data/prepare_uft_hints.py from a full solution), with the step ``t`` = the
trainer's ``global_steps`` (1 on the first step, as UFT's ``timestep``). Fixed: UFT keeps its timestep in the
dataset and resets it to 1 on resume (the first resumed batch draws with p ≈ 0.95); here ``t`` is the restored
global step and the draw's RNG is saved in the checkpoint. KL and entropy as the authors' script
(``use_kl_loss``, ``kl_loss_coef=0.001``, ``low_var_kl``, ``entropy_coeff=0.001``) are exp_scripts/train_uft.sh's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from verl.utils.config_section import AT_LEAST_ONE, NON_NEGATIVE, UNIT, key
from luffy_pool.methods.loss_helpers import aggregate, clipped_on_losses, masked_mean_plain
from verl.utils.data_format import DataFormatError

SCHEDULES = ("cosine", "stage", "uniform")


@dataclass(frozen=True)
class UftConfig:
    """UFT's hint knobs (``run.py`` defaults: T_hint 300, p 0.95 -> 0.05, β = 0.001)."""

    schedule: str = "cosine"
    total_training_steps_hint: int = 300
    lower_prob: float = 0.05
    upper_prob: float = 0.95
    max_segments: int = 5
    hint_sft_coef: float = 0.001


def hint_probability(step: int, cfg) -> float:
    """``p(t) = p_low + ½(p_high − p_low)(1 + cos(π t / T_hint))`` for ``t ≤ T_hint``, else 0."""
    if step > cfg.total_training_steps_hint:
        return 0.0
    return cfg.lower_prob + 0.5 * (cfg.upper_prob - cfg.lower_prob) * (
        1 + np.cos(np.pi * step / cfg.total_training_steps_hint)
    )


def cut_points(n_segments: int, max_segments: int = 5) -> list[int]:
    """``[round(j/m · n) for j = 0..m]`` with ``m = min(max_segments, n)``, the last forced to ``n``."""
    m = min(max_segments, n_segments)
    points = [round(j / m * n_segments) for j in range(m + 1)]
    points[-1] = n_segments
    return points


def stage_index(step: int, m: int, cfg) -> int:
    """Stage ablation: ``clip(m − ⌊t / ⌊T_hint/(m+1)⌋⌋, 0, m)`` for ``t ≤ T_hint``, else 0."""
    if step > cfg.total_training_steps_hint:
        return 0
    return int(np.clip(m - step // (cfg.total_training_steps_hint // (m + 1)), 0, m))


def sample_hint(hint: Sequence[str] | None, step: int, cfg, rng: np.random.RandomState) -> tuple[str, float]:
    """``(hint text, share of segments used)`` for one dataset item at ``step``: the first ``s_j`` segments,
    ``j`` from the schedule (``cosine``: Binomial(m, p(t)); ``stage``: :func:`stage_index`; ``uniform``: a
    uniformly drawn cut point)."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"unknown uft schedule {cfg.schedule!r}; valid: {list(SCHEDULES)}")
    if hint is None or len(hint) == 0:
        return "", 0.0
    m = min(cfg.max_segments, len(hint))
    points = cut_points(len(hint), cfg.max_segments)
    if cfg.schedule == "uniform":
        length = rng.choice(points)
    elif cfg.schedule == "stage":
        length = points[stage_index(step, m, cfg)] if step <= cfg.total_training_steps_hint else 0
    elif step > cfg.total_training_steps_hint:
        length = 0
    else:
        p = hint_probability(step, cfg)
        length = points[rng.choice([0, 1], p=[1.0 - p, p], size=len(points) - 1).sum()]
    return "".join(hint[:length]), length / len(hint)


def _pad(t: torch.Tensor, length: int, value: int, left: bool) -> torch.Tensor:
    if t.shape[-1] >= length:
        return t
    gap = length - t.shape[-1]
    return F.pad(t, (gap, 0) if left else (0, gap), "constant", value)


def tokenize_with_hint(
    prompt: str,
    hint_text: str,
    tokenizer,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
):
    """``(input_ids, attention_mask, hint_ids, hint_mask)``, each ``[1, ·]``: prompt and hint tokenised
    separately (no special tokens) and concatenated; ``hint_mask`` is 1 on the ``h`` positions before the last
    (next token is a hint token); padded to ``max_length`` or truncated (``left``/``right``; ``error`` raises)."""
    if truncation not in ("left", "right", "error"):
        raise ValueError(f"truncation must be left, right or error, got {truncation!r}")
    data = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    input_ids, attention_mask = data["input_ids"], data["attention_mask"]
    hint_ids = torch.tensor([[]], dtype=torch.long)
    hint_length = 0
    if hint_text != "":
        hint = tokenizer(hint_text, return_tensors="pt", add_special_tokens=False)
        hint_ids = hint["input_ids"]
        input_ids = torch.cat([input_ids, hint_ids], dim=-1)
        attention_mask = torch.cat([attention_mask, hint["attention_mask"]], dim=-1)
        hint_length = hint_ids.shape[-1]
    hint_mask = torch.zeros_like(attention_mask)
    hint_mask[:, -hint_length - 1 : -1] = 1
    length = input_ids.shape[-1]
    if length < max_length:
        input_ids = _pad(input_ids, max_length, pad_token_id, left_pad)
        attention_mask = _pad(attention_mask, max_length, 0, left_pad)
        hint_mask = _pad(hint_mask, max_length, 0, left_pad)
    elif length > max_length:
        if truncation == "error":
            raise ValueError(f"prompt + hint is {length} tokens, max_prompt_length is {max_length}")
        window = slice(-max_length, None) if truncation == "left" else slice(None, max_length)
        input_ids, attention_mask, hint_mask = input_ids[:, window], attention_mask[:, window], hint_mask[:, window]
    return input_ids, attention_mask, hint_ids, hint_mask


def split_solution(solution: str) -> list[str]:
    """A full solution cut into line segments (each keeps its newline), ``"".join`` gives it back; blank lines
    stay attached to the preceding segment. Feeds :func:`sample_hint` for data without a ``hint`` column."""
    segments: list[str] = []
    for line in solution.splitlines(keepends=True):
        if segments and line.strip() == "":
            segments[-1] += line
        else:
            segments.append(line)
    return segments


def hint_nll_loss(prompt_logits: torch.Tensor, prompt_ids: torch.Tensor, hint_mask: torch.Tensor) -> torch.Tensor:
    """UFT's hint term (β = ``hint_sft_coef`` multiplies it outside): the mean over hint positions of the
    cross-entropy of the next prompt token under ``clamp(prompt_logits, ±100)``. ``prompt_logits`` [B, P, V]
    (already divided by the temperature), ``prompt_ids`` and ``hint_mask`` [B, P] as :func:`tokenize_with_hint`
    returns them; 0 when no position is a hint position."""
    vocab = prompt_logits.shape[-1]
    logits = torch.clamp(prompt_logits[:, :-1, :].reshape(-1, vocab), min=-100, max=100)
    labels = prompt_ids[:, 1:].reshape(-1).to(logits.device)
    losses = F.cross_entropy(logits, labels, reduction="none")
    mask = hint_mask[:, :-1].reshape(-1)
    return (losses * mask).sum() / torch.clamp(mask.sum(), min=1e-6)


@dataclass(frozen=True)
class UftLossConfig:
    """The UFT loss's knobs: β (``hint_sft_coef``) and the actor's PPO clip and aggregation."""

    hint_sft_coef: float = 0.001
    clip_ratio: float = 0.2
    clip_upper_bound: float = 1.0
    loss_remove_token_mean: bool = False  # UFT's verl: token mean
    loss_remove_clip: bool = False


def uft_loss(inputs, cfg) -> tuple[torch.Tensor, dict]:
    """UFT's actor loss with the hint as the response's prefix tokens (``prefix_mask``): PPO-clip GRPO on the
    continuation tokens (the hint tokens take no policy gradient, as UFT's hint is prompt) plus
    ``β·mean_{hint tokens}(−ℓ_t)``, the mean over the micro-batch's hint tokens with the denominator clamped to
    ≥ 1e-6 as :func:`hint_nll_loss` (0 without hint tokens). ``ℓ_t`` is the actor's temperature-divided
    log-prob of the hint token, the same value UFT's shifted prompt logits give, without their ±100 clamp."""
    if inputs.prefix_mask is None:
        raise ValueError("the uft loss needs inputs.prefix_mask (the hint tokens)")
    valid = inputs.response_mask.to(inputs.log_prob.dtype)
    hint = inputs.prefix_mask.to(valid.dtype) * valid
    cont = valid - hint
    log_ratio = inputs.log_prob - inputs.old_log_prob
    ratio = torch.exp(log_ratio)
    losses, clipfrac = clipped_on_losses(inputs.advantages, ratio, ratio, cont, cfg)
    zero = torch.zeros((), dtype=valid.dtype, device=valid.device)
    pg_loss = aggregate(losses, cont, cfg.loss_remove_token_mean) if cont.sum() > 0 else zero
    hint_nll = (-inputs.log_prob * hint).sum() / torch.clamp(hint.sum(), min=1e-6)
    return pg_loss + cfg.hint_sft_coef * hint_nll, {
        "uft/pg_loss": pg_loss,
        "uft/hint_nll": hint_nll,
        "pg_clipfrac": clipfrac if cont.sum() > 0 else zero,
        "ppo_kl": masked_mean_plain(-log_ratio, cont) if cont.sum() > 0 else zero,
    }


PREPARE = "python data/prepare_uft_hints.py"
THINK_OPEN = "<think>\n"  # a solution's opening, which the LUFFY model's template already ends with


@dataclass(frozen=True)
class UftKnobs:
    """``algorithm.uft``: UFT's hint schedule and hint NLL."""

    hint_key: str = key(
        default='hint',
        doc="Train-file column of hint segments (list of strings); data/prepare_uft_hints.py writes it from the solution.",
    )
    schedule: str = key(
        choices=SCHEDULES,
        default='cosine',
        doc="Hint length: cosine (Binomial(m, p(t))), stage (staircase ablation), uniform (any cut point). UFT: cosine.",
    )
    total_training_steps_hint: int = key(
        bounds=AT_LEAST_ONE, default=300, doc="T_hint: steps over which p(t) anneals; no hint after. UFT: 300."
    )
    lower_prob: float = key(bounds=UNIT, default=0.05, doc="p(T_hint), the last annealed hint probability. UFT: 0.05.")
    upper_prob: float = key(bounds=UNIT, default=0.95, doc="p(0), the first hint probability. UFT: 0.95.")
    max_segments: int = key(
        bounds=AT_LEAST_ONE,
        default=5,
        doc="At most this many cut points per solution (m = min(max_segments, segments)). UFT: 5.",
    )
    hint_sft_coef: float = key(
        bounds=NON_NEGATIVE,
        default=0.001,
        doc="beta: weight of the hint tokens' mean NLL added to the loss. UFT: 0.001.",
    )


def uft_method_loss(inputs, knobs: UftKnobs, step: int):
    """:func:`uft_loss` with the actor's clip and aggregation keys."""
    loss = inputs.settings
    cfg = UftLossConfig(
        hint_sft_coef=knobs.hint_sft_coef,
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )
    return uft_loss(inputs, cfg)


class UftHintSampler(StepHooks):
    """Draws each prompt's hint, writes its tokens as the prompt's trace ``tgt_input_ids`` and gives every slot
    the ratio that makes the slot plan's prefix exactly the hint (``(h + ½)/(h + 1)`` of hint ++ EOS)."""

    KIND = name = "uft"

    def __init__(self, n: int, cfg, hint_key: str, tokenizer, seed: int):
        self.n, self.cfg, self.hint_key, self.tokenizer = n, cfg, hint_key, tokenizer
        self.rng = np.random.RandomState(seed)

    @classmethod
    def from_sections(cls, sections, *, seed: int, total_steps: int = 0, tokenizer=None) -> "UftHintSampler":
        k = sections.knobs
        cfg = UftConfig(
            schedule=k.schedule,
            total_training_steps_hint=k.total_training_steps_hint,
            lower_prob=k.lower_prob,
            upper_prob=k.upper_prob,
            max_segments=k.max_segments,
            hint_sft_coef=k.hint_sft_coef,
        )
        return cls(sections.workers.rollout.n, cfg, k.hint_key, tokenizer, seed)

    def hint_ids(self, segments, global_step: int, prompt_opens_think: bool = False) -> tuple[list[int], float]:
        """The token ids of one prompt's hint at ``global_step`` and the share of its segments used. A hint
        opening ``<think>\n`` after a prompt that already ends with it loses it, as the dataset's demonstration."""
        segments = None if segments is None else [str(s) for s in segments]
        text, share = sample_hint(segments, global_step, self.cfg, self.rng)
        if prompt_opens_think and text.startswith(THINK_OPEN):
            text = text[len(THINK_OPEN) :]
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        return ids, share

    def _opens_think(self, batch) -> list[bool]:
        """Per row: the prompt ends with ``<think>\n`` (the LUFFY model's template; rl_dataset_with_target.py)."""
        ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
        return [self.tokenizer.decode(ids[b][mask[b]][-8:].tolist()).endswith(THINK_OPEN) for b in range(len(ids))]

    @classmethod
    def from_context(cls, context) -> "UftHintSampler":
        s = context.sections
        return cls.from_sections(
            s, seed=int(s.trainer.seed), total_steps=context.total_steps, tokenizer=context.tokenizer
        )

    def plan_slots(self, batch, gen_batch, ratios, step: int):
        return self.draw_batch(batch, step, prompts=gen_batch)

    def draw_batch(self, batch, global_step: int, prompts=None) -> tuple[np.ndarray, dict]:
        """``prompts``: where the prompts' ``input_ids`` are, when not in ``batch`` (the rollout's input)."""
        if global_step < 1:
            raise ValueError(f"global_step counts training steps from 1, got {global_step}")
        if self.hint_key not in batch.non_tensor_batch:
            raise ValueError(
                f"algorithm.method=uft: the batch has no column {self.hint_key!r} (algorithm.uft.hint_key)"
            )
        targets = batch.batch["tgt_input_ids"]
        width, pad = targets.shape[1], self.tokenizer.pad_token_id
        hints = torch.full_like(targets, pad)
        ratios = np.zeros((len(batch), self.n), dtype=np.float64)
        shares, lengths, cut = [], [], 0
        opens_think = self._opens_think(batch if prompts is None else prompts)
        for b, segments in enumerate(batch.non_tensor_batch[self.hint_key]):
            ids, share = self.hint_ids(segments, global_step, opens_think[b])
            cut += len(ids) > width
            ids = ids[:width]
            if ids:
                hints[b, : len(ids)] = torch.tensor(ids, dtype=hints.dtype)
                ratios[b, :] = (len(ids) + 0.5) / (len(ids) + 1)
            shares.append(share)
            lengths.append(len(ids))
        batch.batch["tgt_input_ids"] = hints
        if "behaviour_log_probs" in batch.batch.keys():  # the demonstration's probabilities: not the hint's
            batch.pop(batch_keys=["behaviour_log_probs"])
        metrics = {
            "uft/hint_share": float(np.mean(shares)) if shares else 0.0,
            "uft/hint_tokens": float(np.mean(lengths)) if lengths else 0.0,
            "uft/hints_cut": cut,
        }
        if self.cfg.schedule == "cosine":
            metrics["uft/hint_probability"] = float(hint_probability(global_step, self.cfg))
        return ratios, metrics

    def state_dict(self) -> dict:
        state = self.rng.get_state(legacy=False)
        return {
            "kind": self.KIND,
            "key": state["state"]["key"].tolist(),
            "pos": int(state["state"]["pos"]),
            "has_gauss": int(state["has_gauss"]),
            "gauss": float(state["gauss"]),
        }

    def load_state_dict(self, state) -> None:
        if state.get("kind") != self.KIND:
            kind = state.get("kind", "LUFFY PrefixRatioSampler")
            raise ValueError(
                f"the checkpoint's prefix-ratio sampler is {kind!r}, "
                f"not algorithm.method=uft's; resume it with the method it was trained with"
            )
        self.rng.set_state(
            {
                "bit_generator": "MT19937",
                "has_gauss": state["has_gauss"],
                "gauss": state["gauss"],
                "state": {"key": np.asarray(state["key"], dtype=np.uint32), "pos": state["pos"]},
            }
        )


def solution_text(target, path: str, row: int, target_key: str) -> str:
    """The solution of one row: a string, or the ``content`` of the first message of a list; '' when null."""
    if target is None:
        return ""
    if isinstance(target, str):
        return target
    if isinstance(target, (list, tuple)) and target and isinstance(target[0], dict) and "content" in target[0]:
        return str(target[0]["content"])
    raise DataFormatError(path, f"expected a string or a list of messages, got {target!r:.60}", row, target_key)


def add_hints(records: Sequence[dict], path: str, target_key: str = "target", hint_key: str = "hint") -> list[dict]:
    """``records`` with ``hint_key`` = the segments of each row's solution (``target_key``); data/prepare_uft_hints.py
    and the CPU rehearsal write UFT's train files with it. A first segment that is only ``<think>\n`` joins the
    next one (it is not a step of the solution; the sampler drops it after a prompt that opens the think block)."""
    out = []
    for row, rec in enumerate(records):
        if target_key not in rec:
            raise DataFormatError(path, f"no column {target_key!r} to cut into hint segments", row, target_key)
        segments = split_solution(solution_text(rec[target_key], path, row, target_key))
        if len(segments) > 1 and segments[0] == THINK_OPEN:
            segments = [segments[0] + segments[1]] + segments[2:]
        out.append({**rec, hint_key: segments})
    return out


def check_hint_column(path: str, sections) -> Optional[str]:
    """A train file must carry ``algorithm.uft.hint_key`` as a list of strings (or null / empty: no hint) per row;
    the first problem as one line naming file, row and column, with the pre-processor to run."""
    import pyarrow.parquet as pq

    key = sections.knobs.hint_key
    if not os.path.isfile(path):
        return None  # check_parquet names a missing file
    names = pq.ParquetFile(path).schema_arrow.names
    if key not in names:
        return (
            f"data.train_files: {path}: no column {key!r} (algorithm.uft.hint_key), which algorithm.method=uft "
            f"draws its hints from; cut the solutions into segments with "
            f"`{PREPARE} --input {path} --output OUT.parquet`"
        )
    for row, value in enumerate(pq.ParquetFile(path).read(columns=[key]).column(key).to_pylist()):
        if value is not None and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
            return (
                f"data.train_files: {path}: row {row}: column {key!r} must be a list of strings (hint segments), "
                f"got {value!r:.60}; rebuild it with `{PREPARE}`"
            )
    if sections.data.off_policy_files:
        return "algorithm.method=uft draws each slot's hint from the prompt's own solution; unset data.off_policy_files"
    return None


UFT = register_method(
    Method(
        name="uft",
        mechanism="solution prefix (hint) continued by every rollout, its length cosine-annealed; "
        "GRPO + beta * hint NLL",
        knobs=UftKnobs,
        loss=uft_method_loss,
        hooks=UftHintSampler.from_context,
        check_train_file=check_hint_column,
        rehearsal_data=add_hints,
        # the hint is prompt in UFT: its entropy bonus and KL loss cover the continuation only (module docstring)
        regularise_prefix_tokens=False,
    )
)
