"""``algorithm.method=questa`` (arXiv 2507.13266, QuestA): question augmentation. Each training prompt's problem gets
the first p of its demonstration's solution (characters after ``</think>``) appended as a hint, and plain PPO runs on
the hinted prompts; no demonstration token is trained on. p = 0.5, then 0.25 (two stages). Its pure blocks first,
then the method's wiring.

Blocks: mirror foreverlasting1202/QuestA at commit 3c7be001 (``AReaL/``): ``datasets/add_prefix.py:5-50``
(``split_prefix``, the prompt rule of ``main``) -> :func:`solution_of`, :func:`hint_prefix`, :func:`hinted_problem`,
:func:`answer_in_solution`; ``arealite/engine/ppo/actor.py:62-149`` ``compute_advantages`` with the scripts'
settings (γ = λ = 1, no values, ``kl_ctl=0``: every response token gets the row's reward) and
``arealite/utils/functional.py:81-119`` ``masked_normalization`` -> :func:`questa_rewards`,
:func:`global_token_advantages`; ``arealite/workflow/rlvr.py:109,138-142`` (the success-rate filter) ->
:func:`success_gate`; ``functional.py:122-179`` ``ppo_actor_loss_fn`` -> :func:`decoupled_ppo_token_losses`; the
token-count weighting of micro-batches (``actor.py:232``, ``engine/fsdp_engine.py:225-247``) -> :func:`questa_loss`.
Quirks kept: the hint is cut by characters (``int(len·p)``, it may split a word or a LaTeX command); a generation
that starts with ``"`` loses its first and last characters; a prefix shorter than 10 characters gives the problem +
``"\\n\\n"`` (no hint, the two newlines kept); ``"## Hint."`` has no space after it; a row whose final answer is not
a substring of its solution is dropped; the reward ``clip((r + 0)·5, ±20)`` with ``r ∈ {0, 1}`` (success = the
score of ``data.reward_impl_version``'s correct answer); the advantage normalisation is over every kept token of
the batch (long responses weigh more), population variance in float64, ``(A − μ)/(σ + 1e-5)``, not per group; the
loss is the token sum over the step divided by the step's token count, whatever the micro-batching (exact with one
mini-batch per step, as theirs; with several, each is taken to hold its share of the step's tokens).

Wiring: the demonstration column ``data.target_key`` is read at run time (no pre-processing): the hook
(:class:`QuestaHints`) builds each prompt's hinted text (the last user message + hint, the dataset's chat
template) for the stage of the step and rewrites the engine's prompt tensors in ``plan_slots``; validation
generates from ``data.val_files`` as they are (un-hinted questions). Rows dropped by the answer rule, and (with
``data.filter_overlong_prompts=True``, as the dataset drops over-long prompts) rows whose hinted prompt exceeds
``data.max_prompt_length``, keep their plain prompt and take no part in the advantage statistics or the loss.
Before the update the hook rejects the groups outside ``[success_lb, success_ub]`` (``loss_row_mask``) and writes
the advantage. Differences: the rejected groups are not replaced (AReaL's asynchronous rollout keeps sampling
until 128 groups pass; here the step trains on fewer); the two stages are one run, switching at
``stage_starts`` (their two runs, stage 2 from stage-1 weights with a fresh optimizer and a 2,048-token prompt
limit; the released code gives no step count); dropped rows are still generated (theirs are removed offline). The
decoupled loss's behaviour weight ``exp(ℓ^prox − ℓ^behav)``, capped at 5 (tokens above it masked), corrects
AReaL's asynchronous rollouts (up to 4 versions stale); this trainer is synchronous and recomputes the old
log-probs, so ``ℓ^behav = ℓ^prox`` and the weight is 1: the questa loss applies none (nor with
``trainer.rollout_pipeline=one_step_off``, whose rollouts are one version stale).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from verl.utils.config_section import NON_NEGATIVE, POSITIVE, UNIT, Bound, key

logger = logging.getLogger(__name__)

THINK_CLOSE = "</think>"
TRAINABLE = "questa_trainable"  # per prompt: its hinted prompt is in the batch (the answer rule and length passed)
TOKEN_SCALE = "questa_token_scale"  # update_state: data-parallel ranks x mini-batches / the step's kept tokens


# ---------------------------------------------------------------- the hint (add_prefix.py)
def solution_of(generation: str) -> str:
    """The solution of a demonstration: the text after its last ``</think>`` (all of it without one), after
    dropping the first and last characters of a generation that starts with ``"`` (add_prefix.py:28-32)."""
    if generation[:1] == '"':
        generation = generation[1:-1]
    return generation.split(THINK_CLOSE)[-1]


def hint_prefix(solution: str, ratio: float) -> str:
    """The first ``int(len(solution)·ratio)`` characters (``split_prefix``, add_prefix.py:5-10)."""
    return solution[: int(len(solution) * ratio)]


def hinted_problem(
    problem: str, solution: str, ratio: float, min_prefix_chars: int = 10, header: str = "## Hint."
) -> str:
    """``problem + "\\n\\n"`` when the prefix has fewer than ``min_prefix_chars`` characters, else
    ``problem + "\\n\\n" + header + prefix`` (add_prefix.py:33-37)."""
    prefix = hint_prefix(solution, ratio)
    return problem + "\n\n" if len(prefix) < min_prefix_chars else problem + "\n\n" + header + prefix


def answer_in_solution(answer: Any, solution: str) -> bool:
    """add_prefix.py:41: the row is kept iff its final answer is a substring of the solution (a list of ground
    truths, which the graders accept: any of them)."""
    if isinstance(answer, (list, tuple, np.ndarray)):
        return any(answer_in_solution(a, solution) for a in answer)
    return str(answer) in solution


# ---------------------------------------------------------------- reward, advantage, gate (actor.py, rlvr.py)
def questa_rewards(success: torch.Tensor, scale: float = 5.0, bias: float = 0.0, clip: float = 20.0) -> torch.Tensor:
    """``clip((r + bias)·scale, −clip, clip)`` per row (actor.py:70-74); ``success`` is r ∈ {0, 1}."""
    return torch.clamp((success + bias) * scale, min=-clip, max=clip)


def global_token_advantages(
    rewards: torch.Tensor, response_mask: torch.Tensor, keep: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    """``[rows, L]``: the row's reward on each of its response tokens (GAE with γ = λ = 1 and no value, actor.py:
    96-128), normalised over every token of the kept rows at once: ``(A − μ)/(σ + eps)``, population variance,
    float64 (``masked_normalization``); 0 on the other rows and on padding. Returned in ``rewards``'s dtype."""
    mask = response_mask.to(torch.float64) * keep.to(torch.float64).unsqueeze(-1)
    adv = rewards.to(torch.float64).unsqueeze(-1) * mask
    count = mask.sum()
    if count == 0:
        return torch.zeros_like(mask, dtype=rewards.dtype)
    mean = adv.sum() / count
    var = adv.square().sum() / count - mean**2
    return (((adv - mean) / (var.sqrt() + eps)) * mask).to(rewards.dtype)


def success_gate(successes: Sequence[int], sizes: Sequence[int], lb: float = 0.05, ub: float = 0.95) -> list[bool]:
    """Per group: kept iff ``lb ≤ c/n ≤ ub`` (rlvr.py:109,138: rejected when above ub or below lb)."""
    return [not (c / n > ub or c / n < lb) for c, n in zip(successes, sizes)]


# ---------------------------------------------------------------- the loss (functional.py:122-179)
def decoupled_ppo_token_losses(
    log_prob: torch.Tensor,
    prox_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float = 0.2,
    behav_log_prob: Optional[torch.Tensor] = None,
    behav_cap: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token losses, clipped tokens)``: ``max(−Aρ, −A·clip(ρ, 1 ± ε))`` with ``ρ = exp(ℓ − ℓ^prox)``, times the
    behaviour weight ``w = exp(ℓ^prox − ℓ^behav)``, 0 where ``w > behav_cap`` (AReaL's ``behav_imp_weight_cap``) or
    outside ``mask``. Without ``behav_log_prob`` the weight is 1 (a synchronous trainer: ``ℓ^behav = ℓ^prox``)."""
    valid = mask.bool()
    ratio = torch.where(valid, torch.exp(log_prob - prox_log_prob), torch.zeros_like(log_prob))
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    clipped = (loss1.detach() < loss2.detach()) & valid
    losses = torch.max(loss1, loss2)
    if behav_log_prob is not None:
        weight = torch.exp(prox_log_prob - behav_log_prob)
        kept = valid if behav_cap is None else valid & (weight <= behav_cap)
        losses = losses * torch.where(kept, weight, torch.zeros_like(weight))
    return torch.where(valid, losses, torch.zeros_like(losses)), clipped


def questa_loss(inputs, knobs, step: int):
    """The step's token mean of :func:`decoupled_ppo_token_losses` over every kept token of the mini-batch and of
    every rank (AReaL weights each micro-batch's token mean by its token count over the step): this micro-batch's
    token sum times ``update_state[TOKEN_SCALE]`` (ranks x mini-batches / kept tokens, from the hook) times the
    actor's gradient accumulation, which the actor divides by. ε is ``actor.clip_ratio``."""
    scale = (inputs.update_state or {}).get(TOKEN_SCALE)
    if scale is None:
        raise ValueError(f"the questa loss needs update_state[{TOKEN_SCALE!r}], which its hook sends with the update")
    mask = inputs.response_mask.to(inputs.log_prob.dtype)
    losses, clipped = decoupled_ppo_token_losses(
        inputs.log_prob, inputs.old_log_prob, inputs.advantages, mask, inputs.settings.clip_ratio
    )
    total, count = (losses * mask).sum(), mask.sum()
    loss = total * (float(scale) * inputs.batch_sizes.gradient_accumulation)
    denom = torch.clamp(count, min=1.0)
    return loss, {
        "questa/pg_loss": total.detach() / denom,
        "pg_clipfrac": clipped.to(mask.dtype).sum() / denom,
        "ppo_kl": ((inputs.old_log_prob - inputs.log_prob).detach() * mask).sum() / denom,
    }


# ---------------------------------------------------------------- knobs
def _ratios(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_number(x) and 0.0 <= x <= 1.0 for x in v)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


RATIO_LIST = Bound(_ratios, "must be a non-empty list of hint ratios in [0, 1]")
STARTS = Bound(
    lambda v: isinstance(v, (list, tuple)) and all(_number(x) and 0.0 < x < 1.0 for x in v),
    "must be a list of fractions of the run in (0, 1)",
)


@dataclass(frozen=True)
class QuestaKnobs:
    """``algorithm.questa`` (QuestA's AReaL/scripts/partial_50_grpo.yaml, partial_50_25_grpo.yaml, add_prefix.py)."""

    hint_ratios: list = key(
        bounds=RATIO_LIST,
        default=(0.5, 0.25),
        doc="p of each stage: the share of the solution's characters given as the hint. QuestA: 0.5, then 0.25 "
        "(add_prefix.py --ratio 50 / 25).",
    )
    stage_starts: list = key(
        bounds=STARTS,
        default=(0.5,),
        doc="Where each stage after the first starts, as a fraction of the run's steps (one per later stage, "
        "increasing). QuestA: two runs, stage 2 from stage-1 weights; no step count released: half.",
    )
    min_prefix_chars: int = key(
        bounds=NON_NEGATIVE, default=10, doc="A shorter prefix gives no hint (problem + two newlines). QuestA: 10."
    )
    hint_header: str = key(default="## Hint.", doc="Text before the hint, no space after it. QuestA: '## Hint.'.")
    require_answer_in_solution: bool = key(
        default=True,
        doc="Drop rows whose final answer (reward_model.ground_truth) is not a substring of the solution. QuestA: "
        "always (add_prefix.py).",
    )
    reward_scale: float = key(bounds=POSITIVE, default=5.0, doc="R = clip((r + bias)·scale, ±clip). QuestA: 5.0.")
    reward_bias: float = key(default=0.0, doc="Added to r ∈ {0, 1} before scaling. QuestA: 0.0.")
    reward_clip: float = key(bounds=POSITIVE, default=20.0, doc="|R| bound. QuestA: 20.0 (AReaL's default).")
    adv_eps: float = key(
        bounds=POSITIVE, default=1e-5, doc="eps of (A − mean)/(std + eps) over the batch's tokens. QuestA: 1e-5."
    )
    success_lb: float = key(
        bounds=UNIT, default=0.05, doc="Groups with a success rate below it are dropped. QuestA: 0.05."
    )
    success_ub: float = key(
        bounds=UNIT, default=0.95, doc="Groups with a success rate above it are dropped. QuestA: 0.95."
    )

    def validate(self) -> list[str]:
        errors, g = [], "algorithm.questa"
        starts = list(self.stage_starts) if isinstance(self.stage_starts, (list, tuple)) else []
        if isinstance(self.hint_ratios, (list, tuple)) and len(starts) != len(self.hint_ratios) - 1:
            errors.append(
                f"'{g}.stage_starts'={starts} must give one start per stage after the first "
                f"({len(self.hint_ratios) - 1} for '{g}.hint_ratios'={list(self.hint_ratios)})"
            )
        if any(b <= a for a, b in zip(starts, starts[1:])):
            errors.append(f"'{g}.stage_starts'={starts} must increase")
        if self.success_lb > self.success_ub:
            errors.append(f"'{g}.success_lb'={self.success_lb} exceeds '{g}.success_ub'={self.success_ub}")
        return errors


def stage_of(step: int, total_steps: int, stage_starts: Sequence[float]) -> int:
    """The stage of training step ``step`` (1-based): how many ``stage_starts`` lie before it, a start ``s``
    ending the previous stage after step ``floor(s·total_steps)``."""
    return sum(step > math.floor(s * total_steps + 1e-9) for s in stage_starts)


# ---------------------------------------------------------------- wiring
def _generation(target) -> Optional[str]:
    """The demonstration text of a ``target`` cell: the ``content`` of its first message (a plain string as is);
    None when it has none."""
    if isinstance(target, str):
        return target
    if isinstance(target, (list, tuple, np.ndarray)) and len(target) and isinstance(target[0], dict):
        content = target[0].get("content")
        return content if isinstance(content, str) else None
    return None


def _ground_truth(reward_model) -> Any:
    return reward_model.get("ground_truth") if isinstance(reward_model, dict) else None


class QuestaHints(StepHooks):
    """Builds each prompt's hinted prompt for the step's stage (``plan_slots``), then the gate and the advantage
    (``before_update``). Stateless: the stage is a function of the step."""

    name = "questa"

    def __init__(self, context):
        from deepscaler.rewards import fail_success_values
        from luffy_pool.replay.experience import question_key

        s, self.knobs = context.sections, context.sections.knobs
        self.tokenizer, self.dataset, self.total_steps = context.tokenizer, context.dataset, int(context.total_steps)
        if self.dataset is None:
            raise ValueError("algorithm.method=questa builds its hints from the training dataset; none was given")
        self.width = int(s.data.max_prompt_length)
        self.success = fail_success_values(int(s.data.reward_impl_version))[1]
        actor = s.workers.actor
        ranks = max(1, int(context.world_size) // int(actor.ulysses_sequence_parallel_size))
        self.update_scale = ranks * max(1, int(s.data.train_batch_size) // int(actor.ppo_mini_batch_size))
        self._key = question_key
        frame = self.dataset.dataframe
        self.prompts = frame[s.data.prompt_key].tolist()
        self.generations = [_generation(t) for t in frame[s.data.target_key].tolist()]
        answers = [_ground_truth(rm) for rm in frame["reward_model"].tolist()]
        self.positions = {question_key(v): i for i, v in enumerate(self.dataset.prompt_ids)}
        self.user_turn = []
        for item, messages in enumerate(self.prompts):
            turns = [i for i, m in enumerate(messages) if m["role"] == "user"]
            if not turns:
                raise ValueError(
                    f"{self.dataset.source_of(item)}: column {s.data.prompt_key!r} has no user message, where "
                    f"algorithm.method=questa appends the hint"
                )
            self.user_turn.append(turns[-1])
        self.eligible = np.array(
            [
                g is not None and (not self.knobs.require_answer_in_solution or answer_in_solution(a, solution_of(g)))
                for g, a in zip(self.generations, answers)
            ],
            dtype=bool,
        )
        if not self.eligible.any():
            raise ValueError(
                "algorithm.method=questa: no row of data.train_files has a demonstration whose solution (the text "
                "after its last </think>) contains the row's final answer (reward_model.ground_truth); QuestA drops "
                "such rows (algorithm.questa.require_answer_in_solution=False keeps them)"
            )
        if not self.eligible.all():
            logger.warning(
                "algorithm.method=questa: %d of %d training prompts are left out of training: no demonstration, or "
                "its solution does not contain the final answer (QuestA's add_prefix.py drops them)",
                int((~self.eligible).sum()),
                len(self.eligible),
            )
        for ratio in dict.fromkeys(self.knobs.hint_ratios):
            self._check_lengths(float(ratio), bool(s.data.filter_overlong_prompts))

    def hinted_prompt(self, item: int, ratio: float) -> tuple[str, int]:
        """(the chat-templated prompt of dataset item ``item`` with its hint at ``ratio``, the hint's characters)."""
        k = self.knobs
        messages = [{"role": m["role"], "content": m["content"]} for m in self.prompts[item]]
        turn, solution = self.user_turn[item], solution_of(self.generations[item] or "")
        messages[turn]["content"] = hinted_problem(
            messages[turn]["content"], solution, ratio, k.min_prefix_chars, k.hint_header
        )
        prefix = len(hint_prefix(solution, ratio))
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, prefix if prefix >= k.min_prefix_chars else 0

    def _check_lengths(self, ratio: float, filter_overlong: bool) -> None:
        """Every hinted prompt at ``ratio`` against ``data.max_prompt_length``, before the first step: refused with
        ``data.filter_overlong_prompts=False``, else counted (those rows keep their plain prompt, untrained)."""
        texts = [(i, self.hinted_prompt(i, ratio)[0]) for i in np.flatnonzero(self.eligible)]
        longer = [(i, t) for i, t in texts if len(t.encode("utf-8")) > self.width]  # a token spans >= 1 byte
        over = []
        for start in range(0, len(longer), 256):
            chunk = longer[start : start + 256]
            ids = self.tokenizer([t for _, t in chunk], add_special_tokens=False)["input_ids"]
            over += [(i, len(x)) for (i, _), x in zip(chunk, ids) if len(x) > self.width]
        if over and not filter_overlong:
            item, tokens = over[0]
            raise ValueError(
                f"{self.dataset.source_of(item)}: its prompt with QuestA's hint at p={ratio} has {tokens} tokens > "
                f"data.max_prompt_length={self.width} ({len(over)} such rows; longest {max(n for _, n in over)}); "
                f"raise data.max_prompt_length, or data.filter_overlong_prompts=True leaves them out of training"
            )
        if over:
            logger.warning(
                "algorithm.method=questa: at p=%s, %d hinted prompts are longer than data.max_prompt_length=%d "
                "(longest %d); they keep their plain prompt and are left out of training",
                ratio,
                len(over),
                self.width,
                max(n for _, n in over),
            )

    def _item(self, index) -> int:
        item = self.positions.get(self._key(index))
        if item is None:
            raise ValueError(f"algorithm.method=questa: batch row with index {index!r} is not in the training dataset")
        return item

    def plan_slots(self, batch, gen_batch, ratios, step: int):
        """Rewrite the engine's prompts (``gen_batch``) with the hints of step ``step``'s stage; mark the prompts
        that carry them (``questa_trainable``, repeated onto their rows)."""
        from verl.utils.torch_functional import compute_position_id_with_mask

        stage = stage_of(step, self.total_steps, self.knobs.stage_starts)
        ratio = float(self.knobs.hint_ratios[stage])
        t = gen_batch.batch
        ids, mask, positions = t["input_ids"], t["attention_mask"], t["position_ids"]
        width, pad = ids.shape[-1], self.tokenizer.pad_token_id
        items = [self._item(v) for v in batch.non_tensor_batch["index"]]
        rows = [b for b, item in enumerate(items) if self.eligible[item]]
        built = [self.hinted_prompt(items[b], ratio) for b in rows]
        tokens = self.tokenizer([text for text, _ in built], add_special_tokens=False)["input_ids"] if built else []
        trainable, chars = np.zeros(len(items), dtype=bool), []
        for b, seq, (_, hint) in zip(rows, tokens, built):
            if len(seq) > width:  # only with data.filter_overlong_prompts=True (refused at start otherwise)
                continue
            ids[b] = pad
            ids[b, width - len(seq) :] = torch.tensor(seq, dtype=ids.dtype)
            mask[b] = 0
            mask[b, width - len(seq) :] = 1
            positions[b] = compute_position_id_with_mask(mask[b])
            trainable[b] = True
            chars.append(hint)
        batch.non_tensor_batch[TRAINABLE] = trainable
        return ratios, {
            "questa/stage": stage,
            "questa/hint_ratio": ratio,
            "questa/hinted_share": float(np.mean([c > 0 for c in chars])) if chars else 0.0,
            "questa/hint_chars": float(np.mean(chars)) if chars else 0.0,
            "questa/untrained_prompts": int((~trainable).sum()),
        }

    def before_update(self, batch):
        """The success-rate gate (``loss_row_mask``), the advantage over the kept tokens, and the token scale the
        loss needs (``update_state``)."""
        k, t = self.knobs, batch.batch
        response_mask = t["attention_mask"][:, -t["responses"].shape[-1] :]
        success = (t["token_level_scores"].sum(-1) == self.success).to(torch.float64)
        trainable = np.asarray(batch.non_tensor_batch.get(TRAINABLE, np.ones(len(batch), dtype=bool)), dtype=bool)
        uids = np.asarray(batch.non_tensor_batch["uid"])
        groups = [np.flatnonzero(uids == u) for u in dict.fromkeys(uids.tolist())]
        groups = [g for g in groups if trainable[g].all()]
        counts = [int(success[g].sum()) for g in groups]
        keep = torch.zeros(len(uids), dtype=torch.bool)
        for g, kept in zip(groups, success_gate(counts, [len(g) for g in groups], k.success_lb, k.success_ub)):
            keep[torch.as_tensor(g)] = kept
        rewards = questa_rewards(success, k.reward_scale, k.reward_bias, k.reward_clip)
        t["advantages"] = global_token_advantages(rewards, response_mask, keep, k.adv_eps).to(t["advantages"].dtype)
        t["loss_row_mask"] = keep.to(torch.float32)
        tokens = float((response_mask.bool() & keep.unsqueeze(-1)).sum())
        kept_groups = len({u for u, kk in zip(uids.tolist(), keep.tolist()) if kk})
        return {
            "questa/kept_groups": kept_groups / max(len(dict.fromkeys(uids.tolist())), 1),
            "questa/success_rate": float(np.mean([c / len(g) for c, g in zip(counts, groups)])) if groups else 0.0,
            "questa/kept_tokens": tokens,
        }, {TOKEN_SCALE: self.update_scale / tokens if tokens else 0.0}


def check_solution_column(path: str, sections) -> Optional[str]:
    """A train file must carry the demonstrations QuestA cuts its hints from (``data.target_key``: a list of
    messages, the first one's ``content``), and at least one row whose solution holds its final answer; the first
    problem as one line naming file, row and column."""
    import pyarrow.parquet as pq

    key, knobs = sections.data.target_key, sections.knobs
    if sections.data.off_policy_files:
        return "algorithm.method=questa trains on no trace (its demonstrations only make hints); unset data.off_policy_files"
    if not os.path.isfile(path):
        return None  # check_parquet names a missing file
    names = pq.ParquetFile(path).schema_arrow.names
    if key not in names:
        return (
            f"data.train_files: {path}: no column {key!r} (data.target_key), the demonstrations algorithm.method="
            f"questa cuts each prompt's hint from (the text after </think>); data/prepare_train.py writes it"
        )
    columns = [key] + (["reward_model"] if "reward_model" in names else [])
    table = pq.ParquetFile(path).read(columns=columns)
    targets = table.column(key).to_pylist()
    truths = table.column("reward_model").to_pylist() if "reward_model" in names else [None] * len(targets)
    usable = 0
    for row, (target, reward_model) in enumerate(zip(targets, truths)):
        if target is None:
            continue  # no demonstration: the row is left out of training, as one whose answer is not in it
        generation = _generation(target)
        if generation is None:
            return (
                f"data.train_files: {path}: row {row}: column {key!r} must be a list of messages whose first has a "
                f"'content' string (the demonstration QuestA's hint is cut from), got {target!r:.60}"
            )
        answer = _ground_truth(reward_model)
        usable += not knobs.require_answer_in_solution or (
            answer is not None and answer_in_solution(answer, solution_of(generation))
        )
    if targets and not usable:
        return (
            f"data.train_files: {path}: no row's solution (column {key!r}, the text after its last </think>) contains "
            f"its final answer (reward_model.ground_truth): QuestA drops such rows, so nothing would train "
            f"(algorithm.questa.require_answer_in_solution=False keeps them)"
        )
    return None


QUESTA = register_method(
    Method(
        name="questa",
        mechanism="the problem plus the first p of the demonstration's solution as a hint (p 0.5, then 0.25); PPO on "
        "the hinted prompts, rewards normalised over the batch's tokens, all-solved / all-failed groups dropped",
        knobs=QuestaKnobs,
        loss=questa_loss,
        hooks=QuestaHints,
        needs_question_ids=True,
        check_train_file=check_solution_column,
        batch_keys=("loss_row_mask",),
    )
)
