"""``algorithm.method=sdpo`` (arXiv 2601.20802, Self-Distillation Policy Optimisation): the policy, shown a
successful sibling rollout of the same group in its prompt, is the teacher of every other rollout; the student (the
plain prompt) is distilled toward the teacher's log-probs of its own sampled tokens. Its pure blocks first, then the
teacher pass shared with SDFT (luffy_pool/methods/sdft.py), then the method's registration.

Reference followed: TRL release 1.16.0 (PyPI wheel), ``trl/experimental/sdpo`` and its ``loss_utils.py`` (identical
to ``trl/experimental/sdft/loss_utils.py``): ``compute_sampled_token_self_distillation_loss`` (lines 114-135) ->
:func:`sampled_token_loss`; ``apply_importance_sampling_clipping`` (56-65) -> :func:`is_clipped`;
``sdpo_trainer.py`` ``_compute_self_distillation_loss`` (1186-1265, its aggregation) -> :func:`sequence_mean_loss`,
``_compute_policy_loss`` (1145-1184) -> :func:`policy_loss`, ``compute_loss`` (1114-1143) -> :func:`sdpo_loss`,
``SuccessfulRolloutTeacherContextBuilder.build`` (143-325) -> :func:`teacher_demo_rows` and
:meth:`SiblingTeacher.teacher_prompt`; the EMA teacher is ``SyncRefModelCallback`` (``trl/trainer/callbacks.py``):
``teacher ← (1 − r)·teacher + r·student`` after each step. The SDPO authors' own code (``lasgroup/SDPO``, a verl
fork) was not read or compared.

Per response token ``t`` of row ``i``: ``D_t = sg[ℓ_t − ℓ^T_t]·ℓ_t`` (reverse KL's score form, α = 1), times
``min(exp(clamp(ℓ_t − ℓ^old_t, ±20)), is_clip)`` (stop-grad); the distillation loss is the mean over the
micro-batch's rows of ``Σ_t m·D / max(Σ_t m, 1)`` with ``m`` = response mask × the row's teacher mask (rows without a
successful sibling count in the mean with 0, as theirs). Total ``(1 − w)·policy + w·distill`` (``w = 1``: pure
distillation; TRL then skips the policy term, as here). Divided by the gradient accumulation by the actor, as theirs.

Teacher pass (:class:`SelfTeacher`, after the log-prob passes): each row's teacher prompt (its dataset prompt with
the last user message rewritten by the template, chat-templated, left-truncated to ``max_reprompt_len`` tokens)
followed by the row's own response tokens is scored by the reference model of the actor worker
(``compute_ref_log_prob``): the frozen initial model, or with ``teacher=ema`` the reference moved toward the actor
after each update (``update_ref_ema``; its weights are saved with the actor's checkpoint). The trainer's own
reference pass over the student rows still runs (its KL-in-reward coefficient is 0 in the preset).

Differences kept visible: one EMA update per training step (theirs: per optimizer step; equal with one mini-batch
per step); rows are grouped by ``uid`` (theirs: consecutive blocks of ``num_generations``); only
``distillation_mode=sampled_token`` (the reference pass returns the sampled token's log-prob, not logits), so
``distillation_alpha`` is theirs 1; environment feedback (``include_environment_feedback``) is not implemented.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from verl.utils.config_section import OPEN_UNIT, POSITIVE, UNIT, Bound, key

TEACHER_KEYS = ("teacher_log_probs", "teacher_mask")
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
IS_CLIP = Bound(lambda v: v == -1 or v > 0, "must be -1 (off) or > 0")
# TRL SDPOConfig's templates (sdpo_config.py, reprompt_template / solution_template)
REPROMPT_TEMPLATE = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question.\n"
SOLUTION_TEMPLATE = "\nCorrect solution:\n\n{successful_previous_attempt}\n\n"


# ---------------------------------------------------------------------------------------------- pure blocks
def sampled_token_loss(log_prob: torch.Tensor, teacher_log_prob: torch.Tensor) -> torch.Tensor:
    """Per token ``sg[ℓ − ℓ^T]·ℓ``: its gradient is reverse KL(student‖teacher)'s on the sampled token."""
    return (log_prob - teacher_log_prob).detach() * log_prob


def is_clipped(per_token: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor, cap: float):
    """``per_token · min(exp(clamp(ℓ − ℓ_old, −20, 20)), cap)``, the ratio detached."""
    ratio = torch.exp(torch.clamp((log_prob - old_log_prob).detach(), min=-20.0, max=20.0)).clamp(max=cap)
    return per_token * ratio


def sequence_mean_loss(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``Σ_t m·v / max(Σ_t m, 1)`` (a row with an empty mask counts with 0)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def policy_loss(log_prob, old_log_prob, advantages, mask, clip: float, loss_type: str) -> torch.Tensor:
    """Their GRPO term ``−min(ρA, clip(ρ, 1−ε, 1+ε)A)`` aggregated by ``loss_type`` (``dr_grpo``: ÷ rows × width)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(log_prob - old_log_prob)
    per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)
    if loss_type == "grpo":
        return sequence_mean_loss(per_token, mask)
    if loss_type in ("dapo", "bnpo"):
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * per_token.size(1))
    raise ValueError(f"unknown loss_type {loss_type!r}; valid: {list(LOSS_TYPES)}")


def teacher_demo_rows(scores, uids, threshold: float, skip_self: bool = True) -> list:
    """Per row, the first row of its group (same uid, in row order) with score ``>= threshold``, other than itself
    with ``skip_self``; None where there is none."""
    scores = [float(s) for s in scores]
    groups: dict = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    out = []
    for i, uid in enumerate(uids):
        found = [j for j in groups[uid] if not (skip_self and j == i) and scores[j] >= threshold]
        out.append(found[0] if found else None)
    return out


def distillation_loss(inputs: FamilyLossInputs, knobs, name: str) -> tuple[torch.Tensor, dict]:
    """The self-distillation term of a micro-batch (``knobs``: ``distillation_mode``, ``is_clip``) and its metrics
    ``<name>/distill_loss`` (token mean, as theirs) and ``<name>/teacher_rows`` (share of rows with a teacher)."""
    if knobs.distillation_mode != "sampled_token":  # pre-flight refuses the logit modes; a direct call too
        raise ValueError(f"algorithm.{name}.distillation_mode={knobs.distillation_mode!r} is not implemented")
    is_clip = knobs.is_clip
    own = inputs.method_batch or {}
    missing = [k for k in TEACHER_KEYS if k not in own]
    if missing:
        raise ValueError(f"the {name} loss needs the batch key(s) {missing}, which its teacher pass adds")
    mask = inputs.response_mask * own["teacher_mask"].to(inputs.response_mask.dtype).unsqueeze(-1)
    per_token = sampled_token_loss(inputs.log_prob, own["teacher_log_probs"].to(inputs.log_prob.dtype))
    if is_clip != -1:
        per_token = is_clipped(per_token, inputs.log_prob, inputs.old_log_prob, is_clip)
    loss = sequence_mean_loss(per_token, mask)
    token_mean = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {f"{name}/distill_loss": token_mean.detach(), f"{name}/teacher_rows": own["teacher_mask"].mean()}


@dataclass(frozen=True)
class SdpoKnobs:
    """``algorithm.sdpo``: TRL 1.16.0 ``SDPOConfig``'s defaults (trl/experimental/sdpo/sdpo_config.py)."""

    distillation_weight: float = key(
        bounds=UNIT,
        default=1.0,
        doc="w in (1-w)*policy + w*distill. TRL SDPOConfig.distillation_weight: 1.0 (pure distillation).",
    )
    success_threshold: float = key(
        default=1.0,
        doc="A sibling rollout with sequence score >= this is a teacher demonstration. TRL "
        "SDPOConfig.success_reward_threshold: 1.0.",
    )
    dont_reprompt_on_self_success: bool = key(
        default=True,
        doc="A row is never its own demonstration. TRL SDPOConfig.dont_reprompt_on_self_success: True.",
    )
    distillation_mode: str = key(
        choices=("sampled_token", "topk_logits", "full_logits"),
        refuse={
            "topk_logits": "not implemented: the teacher pass returns the sampled token's log-prob, not logits",
            "full_logits": "not implemented: the teacher pass returns the sampled token's log-prob, not logits",
        },
        default="sampled_token",
        doc="TRL SDPOConfig.distillation_mode: sampled_token (reverse KL on the sampled token; alpha 1).",
    )
    is_clip: float = key(
        bounds=IS_CLIP,
        default=2.0,
        doc="Cap of the detached ratio exp(l - l_old) multiplying each distillation token; -1 off. TRL "
        "SDPOConfig.distillation_is_clip: 2.0.",
    )
    teacher: str = key(
        choices=("ema", "base"),
        default="ema",
        doc="ema: the reference model moved toward the actor after each update; base: the frozen initial model. "
        "TRL SDPOConfig.teacher_model_kind: ema.",
    )
    ema_rate: float = key(
        bounds=OPEN_UNIT,
        default=0.05,
        doc="EMA rate r: teacher <- (1-r)*teacher + r*actor after each step. TRL SDPOConfig.teacher_update_rate: 0.05.",
    )
    loss_type: str = key(
        choices=LOSS_TYPES,
        default="dapo",
        doc="Aggregation of the policy term (w < 1): dapo/bnpo sum/mask sum, grpo per-sequence mean, dr_grpo "
        "sum/(rows*response_length). TRL SDPOConfig.loss_type: dapo.",
    )
    max_reprompt_len: int = key(
        bounds=POSITIVE,
        default=10240,
        doc="Teacher prompts are left-truncated to this many tokens. TRL SDPOConfig.max_reprompt_len: 10240.",
    )
    remove_thinking_from_demonstration: bool = key(
        default=False,
        doc="Drop <think>...</think> from the sibling's text. TRL SDPOConfig.remove_thinking_from_demonstration: "
        "False.",
    )


def sdpo_loss(inputs: FamilyLossInputs, knobs: SdpoKnobs, step: int):
    """``(1 − w)·policy + w·distill`` (their ``compute_loss``: ``w = 1`` distillation only, ``w = 0`` policy only);
    the policy term's clip is the actor's ``clip_ratio``."""
    w = float(knobs.distillation_weight)
    metrics: dict = {}
    total = torch.zeros((), dtype=inputs.log_prob.dtype, device=inputs.log_prob.device)
    if w != 0.0:
        distill, metrics = distillation_loss(inputs, knobs, "sdpo")
        total = total + (distill if w == 1.0 else w * distill)
    if w != 1.0:
        pg = policy_loss(
            inputs.log_prob,
            inputs.old_log_prob,
            inputs.advantages,
            inputs.response_mask,
            float(inputs.settings.clip_ratio),
            knobs.loss_type,
        )
        metrics["sdpo/policy_loss"] = pg.detach()
        total = total + (pg if w == 0.0 else (1 - w) * pg)
    return total, metrics


# ---------------------------------------------------------------------------------------------- teacher pass
def left_pad_rows(rows: list, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists left-padded to the longest -> (ids, attention mask), both ``[rows, longest]`` long."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.as_tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


def last_user_turn(messages) -> int:
    turns = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not turns:
        raise ValueError("a self-distillation teacher prompt rewrites the last user message; this prompt has none")
    return turns[-1]


class SelfTeacher(StepHooks, abc.ABC):
    """Scores each row's response under its teacher prompt with the worker's reference model (``after_log_probs``)
    and, with an EMA teacher, moves the reference toward the actor (``after_update``). A method subclasses it with
    :meth:`teacher_prompt` (None: the row has no teacher and no distillation loss)."""

    name = "self_teacher"
    needs_old_log_probs = True

    def __init__(self, context):
        from luffy_pool.replay.experience import question_key

        s = context.sections
        self.knobs, self.wg, self.tokenizer = context.sections.knobs, context.wg, context.tokenizer
        self.dataset = context.dataset
        if self.dataset is None:
            raise ValueError(f"algorithm.method={s.algorithm.method} builds teacher prompts from the training dataset")
        self.prompts = self.dataset.dataframe[s.data.prompt_key].tolist()
        self.positions = {question_key(v): i for i, v in enumerate(self.dataset.prompt_ids)}
        self._key = question_key
        self.method = s.algorithm.method
        self.max_prompt_tokens = 0  # teacher prompts left-truncated to this many tokens (0: not truncated)
        if self.knobs.teacher == "ema":
            self.wg.init_ref_ema()

    @abc.abstractmethod
    def teacher_prompt(self, batch, row: int, item: int, context: dict):
        """The teacher's user text for ``row`` (dataset item ``item``), or None when the row has no teacher; each
        method's subclass gives it (SDPO: a successful sibling; SDFT: the demonstration)."""

    def prepare(self, batch) -> tuple[dict, dict]:
        """Per-step data :meth:`teacher_prompt` reads, and metrics."""
        return {}, {}

    def chat_prompt(self, item: int, user_text: str) -> str:
        messages = [{"role": m["role"], "content": m["content"]} for m in self.prompts[item]]
        messages[last_user_turn(messages)]["content"] = user_text
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def user_text(self, item: int) -> str:
        messages = self.prompts[item]
        return messages[last_user_turn(messages)]["content"]

    def item_of(self, index) -> int:
        item = self.positions.get(self._key(index))
        if item is None:
            raise ValueError(f"algorithm.method={self.method}: batch row with index {index!r} is not in the dataset")
        return item

    def after_log_probs(self, batch, step: int) -> dict:
        from verl.protocol import DataProto

        context, metrics = self.prepare(batch)
        indexes = batch.non_tensor_batch["index"]
        texts, active = [], []
        for row in range(len(batch)):
            item = self.item_of(indexes[row])
            text = self.teacher_prompt(batch, row, item, context)
            active.append(text is not None)
            # a row without a teacher is scored under its own prompt (masked out of the loss), as theirs
            texts.append(text if text is not None else self.chat_prompt(item, self.user_text(item)))
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        if self.max_prompt_tokens:
            ids = [x[-self.max_prompt_tokens :] for x in ids]
        responses = batch.batch["responses"]
        width = responses.size(1)
        response_attention = batch.batch["attention_mask"][:, -width:]
        prompt_ids, prompt_attention = left_pad_rows(ids, self.tokenizer.pad_token_id)
        attention = torch.cat([prompt_attention, response_attention.to(prompt_attention.dtype)], dim=1)
        position = torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0)
        teacher = DataProto.from_dict(
            tensors={
                "input_ids": torch.cat([prompt_ids, responses], dim=1),
                "attention_mask": attention,
                "position_ids": position,
                "responses": responses,
            }
        )
        out = self.wg.compute_ref_log_prob(teacher)
        batch.batch["teacher_log_probs"] = out.batch["ref_log_prob"].to(torch.float32)
        batch.batch["teacher_mask"] = torch.tensor(active, dtype=torch.float32)
        metrics[f"{self.method}/teacher_row_fraction"] = float(np.mean(active)) if active else 0.0
        metrics[f"{self.method}/teacher_prompt_tokens"] = float(np.mean([len(x) for x in ids])) if ids else 0.0
        return metrics

    def after_update(self, batch, timing: dict) -> dict:
        if self.knobs.teacher == "ema":
            self.wg.update_ref_ema(float(self.knobs.ema_rate))
        return {}


class SiblingTeacher(SelfTeacher):
    """SDPO's teacher prompt: the prompt with the first successful sibling's response (their template)."""

    name = "sdpo"

    def __init__(self, context):
        super().__init__(context)
        self.max_prompt_tokens = int(self.knobs.max_reprompt_len)

    def prepare(self, batch) -> tuple[dict, dict]:
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        uids = list(batch.non_tensor_batch["uid"])
        demos = teacher_demo_rows(
            scores, uids, float(self.knobs.success_threshold), bool(self.knobs.dont_reprompt_on_self_success)
        )
        groups = dict.fromkeys(uids)
        success = {u for u, s in zip(uids, scores) if s >= float(self.knobs.success_threshold)}
        return {"demos": demos}, {"sdpo/success_group_fraction": len(success) / max(len(groups), 1)}

    def teacher_prompt(self, batch, row: int, item: int, context: dict):
        demo = context["demos"][row]
        if demo is None:
            return None
        width = batch.batch["responses"].size(1)
        kept = batch.batch["attention_mask"][demo, -width:].bool()
        ids = batch.batch["responses"][demo][kept].tolist()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if self.knobs.remove_thinking_from_demonstration:
            text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL).strip()
        solution = SOLUTION_TEMPLATE.format(successful_previous_attempt=text)
        reprompt = REPROMPT_TEMPLATE.format(prompt=self.user_text(item), solution=solution, feedback="")
        return self.chat_prompt(item, reprompt)


SDPO = register_method(
    Method(
        name="sdpo",
        mechanism="self-distillation: the policy with a successful sibling rollout in its prompt teaches the others",
        knobs=SdpoKnobs,
        loss=sdpo_loss,
        hooks=SiblingTeacher,
        batch_keys=TEACHER_KEYS,
    )
)
