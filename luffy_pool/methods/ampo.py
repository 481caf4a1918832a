"""``algorithm.method=ampo`` (arXiv 2510.02227, AMPO: adaptive multi-guidance policy optimisation): the group is
pure on-policy unless all n rollouts fail; then up to two failed rows are replaced by whole teacher traces, the
teachers (up to 4 per prompt) ranked by how well the current policy *comprehends* each: its mean probability of
the ground-truth answer tokens when the teacher's reasoning is kept and its final answer replaced by the ground
truth. Replaced rows are trained with LUFFY's shaped off-policy term, the others with dual-clip PPO. Pure blocks
first, then the hook and the registration.

Blocks mirror SII-Enigma/AMPO (commit b88d3656), ``ampo/verl/verl/``:

- ``workers/reward_manager/prob.py`` ``compute_scoreB`` (line 308: float32 mean of ``exp ℓ`` over the GT
  tokens, then rounded to bfloat16) and ``__call__`` (line 194: ``score = 0.9·threshold_0(scoreB − scoreA)
  + 0.1·format``, scoreA = 0) -> :func:`comprehension_score`; ``workers/reward_manager/format.py`` line 3
  (``R1_nothink``: exactly one ``<answer>`` and one ``</answer>``) -> :func:`answer_format_ok`;
- ``adaptive_mix_src/mix_dapo_trainer.py`` ``replace_answer_with_gt_batch`` (line 1998: the text up to the
  last ``<answer>``, then ``<answer>`` + its leading whitespace (else one space) + GT + ``' </answer>'``; an invalid
  format gives an all-zero GT mask, i.e. scoreB = 0) -> :func:`replace_answer`; ``batch_locate_substring_tokens``
  (line 2192: the tokens overlapping the GT's characters) -> :func:`gt_token_positions`;
- ``mix_off_policy_rollout`` (lines 1272-1671): gate ``#correct/n < 1/n`` (1375-1410), ``random.sample(incorrect,
  eff_k)`` then one ``random.uniform(min_prefix_ratio, max_prefix_ratio)`` per chosen slot (1444-1446: 1.0 here, but
  it draws), ``eff_k = min(#teachers, n_prefix)``; teachers sorted by score (``_sort_batch_by_scores``, ``argsort``
  descending, line 1741), the first ``eff_k`` available; failed positions ``j`` in order, a chosen one takes the
  available teacher ``j mod len(avail)`` (popped, 1576-1583) -> :func:`assign_teachers`; a teacher row's reward is
  raised to 1.0 (1597-1599);
- ``adaptive_mix_src/mix_core_alg.py`` ``compute_token_on_seq_off_policy_loss`` (lines 304-593) ->
  :func:`ampo_token_loss`.

Quirks kept: the slot of a teacher is ``j mod len(avail)``, not "best teacher to the first slot"; scoreB's bf16
rounding ties teachers (ties keep the ``quality_score`` order: a stable sort; torch's unstable ``argsort`` leaves
them to the implementation); ``on_pg_clipfrac`` is averaged over every valid token, teacher rows included; the
logged ``off_pg_loss`` is the mean over teacher rows of their token means (the optimised loss is one ``Σ/L`` sum).
Differences: the rollouts' reward is the run's (``data.reward_impl_version``; theirs ``0.9·acc + 0.1·format``
with ``<answer>`` tags): a group fails when none of its rows reaches the run's success value (theirs ``r > 0.6``,
the same rows under their reward); the replaced rows score that success value (theirs 1.0). ``answer_format=boxed``
(LUFFY's data) replaces the last ``\\boxed{...}``'s content instead of the ``<answer>`` block. The teachers come
from the train file's ``algorithm.ampo.teachers_key`` column (their ``target_lst``), a list of
``{content, source, quality_score}``. Knobs: :class:`AmpoKnobs`.
"""

from __future__ import annotations

import random
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from luffy_pool.methods.loss_helpers import masked_mean_eps, shape_off_ratio
from verl.utils.config_section import AT_LEAST_ONE, NON_NEGATIVE, UNIT, Bound, key

ANSWER_OPEN, ANSWER_CLOSE, BOXED = "<answer>", "</answer>", "\\boxed{"
ANSWER_FORMATS = ("answer_tag", "boxed")
LENGTH_STRATEGIES = ("short", "long")
THINK_OPEN = "<think>\n"


# ---------------------------------------------------------------------------------------------- pure blocks
def answer_format_ok(text: str, answer_format: str = "answer_tag") -> float:
    """The teacher's format score: ``answer_tag`` is their ``R1_nothink`` rule (one ``<answer>``, one
    ``</answer>``, in that order); ``boxed`` asks for a closed ``\\boxed{...}``."""
    if answer_format == "boxed":
        return 1.0 if _last_boxed(text) is not None else 0.0
    if text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
        return 0.0
    return 1.0 if re.fullmatch(r".*<answer>.*</answer>.*", text, re.DOTALL) else 0.0


def _last_boxed(text: str) -> Optional[tuple[int, int]]:
    """(start, end) of the content of the last closed ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(BOXED)
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start + len(BOXED), i
        i += 1
    return None


def replace_answer(text: str, ground_truth: str, answer_format: str = "answer_tag") -> tuple[str, Optional[tuple]]:
    """The teacher's response with its final answer replaced by ``ground_truth`` -> (new text, GT character span or
    None when the format is invalid: then no GT token is scored, scoreB = 0). ``answer_tag``: the text up to the last
    ``<answer>``, ``<answer>`` + its leading whitespace (one space when none) + GT + ``' </answer>'``; ``boxed``:
    the last ``\\boxed{...}``'s content replaced, the rest of the text kept."""
    if answer_format == "boxed":
        span = _last_boxed(text)
        if span is None:
            return text, None
        new = text[: span[0]] + ground_truth + text[span[1] :]
        return new, (span[0], span[0] + len(ground_truth))
    if text.count(ANSWER_OPEN) != 1 or not re.fullmatch(r"^.*<answer>.*$", text, re.DOTALL):
        return text, None
    head, section = text.split(ANSWER_OPEN)[0], text.split(ANSWER_OPEN)[1]
    if not section.strip():
        return text, None
    lead = section[: len(section) - len(section.lstrip(" \n\t\r"))] or " "
    start = len(head) + len(ANSWER_OPEN) + len(lead)
    return head + ANSWER_OPEN + lead + ground_truth + " " + ANSWER_CLOSE, (start, start + len(ground_truth))


def gt_token_positions(offsets, span: tuple[int, int]) -> list[int]:
    """The tokens whose character range overlaps ``span`` (their ``batch_locate_substring_tokens``)."""
    return [i for i, (s, e) in enumerate(offsets) if s < span[1] and e > span[0]]


def comprehension_score(
    gt_log_probs: torch.Tensor, format_score: float, format_coef: float = 0.1, threshold: float = 0.0
) -> tuple[float, float]:
    """(scoreB, score) of one teacher: ``scoreB = bf16(mean_float32(exp ℓ_GT))`` (0 without GT tokens),
    ``score = (1 − c)·threshold_t(scoreB − 0) + c·format`` (``threshold_t(x) = 0 if x < t else x``)."""
    if gt_log_probs.numel() == 0:
        score_b = 0.0
    else:
        score_b = torch.exp(gt_log_probs.to(torch.float32)).mean().item()
        score_b = torch.tensor(score_b, dtype=torch.bfloat16).item()
    delta = 0.0 if score_b < threshold else score_b
    return score_b, (1 - format_coef) * delta + format_coef * format_score


def rank_teachers(scores) -> list[int]:
    """Teacher indices by score, descending, as the float32 tensor their reward holds; ties keep the given order."""
    values = torch.tensor([float(s) for s in scores], dtype=torch.float32)
    return torch.sort(values, descending=True, stable=True).indices.tolist()


def assign_teachers(incorrect: list[int], eff_k: int, rng: random.Random, ratio_range=(1.0, 1.0)) -> dict[int, int]:
    """Slot -> rank of the teacher (0 = best) for one failed group: ``rng.sample(incorrect, min(eff_k, #))`` chosen
    slots, one ``rng.uniform`` per chosen slot (theirs draws the prefix ratio), then failed positions ``j`` in
    order: a chosen ``j`` takes the available rank ``j mod len(avail)`` (the only one when one is left), popped."""
    chosen = rng.sample(incorrect, min(eff_k, len(incorrect)))
    ratios = {pos: rng.uniform(*ratio_range) for pos in chosen}
    avail, out = list(range(eff_k)), {}
    for j in incorrect:
        if ratios.get(j, 0.0) > 0.5 and avail:
            idx = j % len(avail) if len(avail) > 1 else 0
            out[j] = avail.pop(idx)
    return out


@dataclass(frozen=True)
class AmpoLossConfig:
    """The constants of :func:`ampo_token_loss` (their script: clip 0.2/0.2, ``clip_ratio_c=10``, ``p_div_p_0.1``,
    ``loss_remove_token_mean=True``)."""

    clip_ratio: float = 0.2
    clip_ratio_c: float = 10.0
    off_policy_reshape: str = "p_div_p_0.1"
    loss_remove_token_mean: bool = True
    loss_remove_clip: bool = False


def ampo_token_loss(inputs, cfg: AmpoLossConfig) -> tuple[torch.Tensor, dict]:
    """Their ``compute_token_on_seq_off_policy_loss`` (``target_probs`` None, no off-policy clamps): on-policy
    tokens ``max(−A·r, −A·clip(r, 1±ε))``, for ``A < 0`` also ``min(·, −A·c)`` (dual clip), ``r = exp(clamp(ℓ −
    ℓ_old, ±20))``; teacher tokens ``−A·f(p)`` (``f`` the reshape, ``p/(p+0.1)``); ``Σ/L`` (or the token mean).
    Metrics: ``on_pg_loss`` (token mean over on-policy tokens, 0 when none), ``off_pg_loss`` (mean over teacher
    rows of their token means), ``on_pg_clipfrac`` (over every valid token), ``on_pg_clipfrac_lower``, ``ppo_kl``,
    ``off_ratio_mean``, ``off_policy_prob``, ``on_policy_prob``. Means are their verl's ``Σ v·m / (Σ m + 1e-8)``."""
    log_prob, old, adv = inputs.log_prob, inputs.old_log_prob, inputs.advantages
    mask = inputs.response_mask.to(log_prob.dtype)
    prefix = inputs.prefix_mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    neg_kl = torch.clamp(log_prob - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean_eps(-neg_kl, mask)
    on_losses = -adv * ratio
    on_mask = (~prefix).to(mask.dtype) * mask
    if cfg.loss_remove_clip:
        clipfrac = clipfrac_lower = zero
    else:
        losses2 = -adv * torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
        clipped = torch.maximum(on_losses, losses2)
        clipfrac = masked_mean_eps(torch.gt(losses2, on_losses).to(mask.dtype), mask)
        losses3 = -adv * cfg.clip_ratio_c
        clipfrac_lower = masked_mean_eps((torch.gt(clipped, losses3) * (adv < 0)).to(mask.dtype), mask)
        on_losses = torch.where(adv < 0, torch.min(losses3, clipped), clipped)
    on_pg_loss = masked_mean_eps(on_losses, on_mask)
    on_pg_loss = zero if torch.isnan(on_pg_loss) else on_pg_loss
    off_ratio = shape_off_ratio(torch.exp(log_prob), cfg.off_policy_reshape, "ampo")
    off_losses = -adv * off_ratio
    rows = torch.where(prefix.any(-1))[0].tolist()
    row_losses, row_ratios, row_probs = [], [], []
    for r in rows:
        m = prefix[r].to(mask.dtype) * mask[r]
        row_losses.append(_or_zero(masked_mean_eps(off_losses[r], m), zero))
        row_ratios.append(_or_zero(masked_mean_eps(off_ratio[r], m), zero))
        row_probs.append(_or_zero(masked_mean_eps(torch.exp(log_prob[r]), m), zero))
    prefix_f = prefix.to(mask.dtype)
    pg_losses = off_losses * prefix_f + on_losses * (1 - prefix_f)
    if cfg.loss_remove_token_mean:
        pg_loss = (pg_losses * mask).sum() / mask.shape[-1]
    else:
        pg_loss = masked_mean_eps(pg_losses, mask)
    on_prob = _or_zero(masked_mean_eps(torch.exp(old), (1 - prefix_f) * mask), zero)
    metrics = {
        "on_pg_loss": on_pg_loss.detach(),
        "off_pg_loss": torch.stack(row_losses).mean().detach() if rows else zero,
        "on_pg_clipfrac": clipfrac.detach(),
        "on_pg_clipfrac_lower": clipfrac_lower.detach(),
        "ppo_kl": ppo_kl.detach(),
        "off_ratio_mean": torch.stack(row_ratios).mean().detach() if rows else zero,
        "off_policy_prob": torch.stack(row_probs).mean().detach() if rows else zero,
        "on_policy_prob": on_prob.detach(),
    }
    return pg_loss, metrics


def _or_zero(value: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return zero if torch.isnan(value) else value


# ---------------------------------------------------------------------------------------------- knobs and loss
@dataclass(frozen=True)
class AmpoKnobs:
    """``algorithm.ampo`` (SII-Enigma/AMPO ``exp_scripts/train_ampo.sh``, commit b88d3656)."""

    n_guides: int = key(
        bounds=AT_LEAST_ONE,
        default=2,
        doc="Failed rows of an all-failed group replaced by teacher traces (at most this many, at most the "
        "teachers). Authors: num_off_policy_targets=2 (their rollout.n_prefix).",
    )
    max_teachers: int = key(
        bounds=AT_LEAST_ONE,
        default=4,
        doc="Teachers per prompt read from the teachers column (after the quality sort). Authors: "
        "max_available_targets=4.",
    )
    teachers_key: str = key(
        default="targets",
        doc="Train-file column holding each prompt's teachers: a list of {content, source, quality_score}. "
        "Authors: their dataset's target_lst.",
    )
    length_strategy: str = key(
        choices=LENGTH_STRATEGIES,
        default="short",
        doc="Teacher order before scoring: short = quality_score descending, long = ascending (stable). "
        "Authors: short (rl_dataset_with_target.py lines 194-197).",
    )
    answer_format: str = key(
        choices=ANSWER_FORMATS,
        default="answer_tag",
        doc="Where a teacher's final answer is (replaced by the ground truth for the comprehension score; also "
        "its format score): answer_tag = their <answer>...</answer> (format_mode=R1_nothink); boxed = the last "
        "\\boxed{...} (LUFFY's data).",
    )
    format_coef: float = key(
        bounds=UNIT,
        default=0.1,
        doc="c in score = (1-c)*threshold(scoreB) + c*format. Authors: reward_model.format_coefficient=0.1.",
    )
    score_threshold: float = key(
        bounds=NON_NEGATIVE,
        default=0.0,
        doc="scoreB below it counts 0 (their shaping threshold_t). Authors: threshold_0.",
    )
    clip_ratio_c: float = key(
        bounds=Bound(lambda v: v > 1.0, "must be > 1 (dual-clip PPO)"),
        default=10.0,
        doc="Dual-clip bound c of the on-policy loss for negative advantages. Authors: clip_ratio_c=10.0.",
    )


def ampo_loss(inputs, knobs: AmpoKnobs, step: int):
    """:func:`ampo_token_loss` with the actor's clip / reshape / aggregation keys and the method's ``c``."""
    s = inputs.settings
    cfg = AmpoLossConfig(
        clip_ratio=s.clip_ratio,
        clip_ratio_c=knobs.clip_ratio_c,
        off_policy_reshape=s.off_policy_reshape,
        loss_remove_token_mean=s.loss_remove_token_mean,
        loss_remove_clip=s.loss_remove_clip,
    )
    return ampo_token_loss(inputs, cfg)


# ---------------------------------------------------------------------------------------------- the hook
def sorted_teachers(teachers, knobs) -> list[dict]:
    """A row's teachers (a list of dicts; None = none) in the quality order of ``length_strategy``, at most
    ``max_teachers``; each as ``{content, source}``."""
    if teachers is None:
        return []
    items = [dict(t) for t in teachers]
    for k, t in enumerate(items):
        t.setdefault("source", f"teacher{k}")
    if all("quality_score" in t for t in items):
        items = sorted(items, key=lambda t: float(t["quality_score"]), reverse=knobs.length_strategy == "short")
    return items[: knobs.max_teachers]


class AmpoGuidance(StepHooks):
    """After the reward: in every group none of whose rows succeeded, score the prompt's teachers with one forward
    of the actor, and write the chosen teacher traces over failed rows (``prefix_mask`` on every token, trace ++
    EOS, reward = the success value). State: the slot draw's RNG and the per-teacher usage counts."""

    name = "ampo"

    def __init__(self, context):
        from deepscaler.rewards import fail_success_values

        s = context.sections
        self.knobs, self.wg, self.tokenizer = context.knobs, context.wg, context.tokenizer
        self.world_size, self.length = context.world_size, context.response_length
        self.success = fail_success_values(int(s.data.reward_impl_version))[1]
        self.ratio_range = (float(s.workers.rollout.min_prefix_ratio), float(s.workers.rollout.max_prefix_ratio))
        self.rng = random.Random(int(s.trainer.seed))
        self.usage: Counter = Counter()

    def plan_slots(self, batch, gen_batch, ratios, step: int):
        return np.zeros_like(np.asarray(ratios, dtype=np.float64)), {}  # n fresh rollouts per prompt

    def after_score(self, batch, step: int) -> dict:
        t, key_ = batch.batch, self.knobs.teachers_key
        if key_ not in batch.non_tensor_batch:
            raise ValueError(f"algorithm.method=ampo: the batch has no column {key_!r} (algorithm.ampo.teachers_key)")
        scores = t["token_level_scores"].sum(-1)
        groups: "OrderedDict[Any, list[int]]" = OrderedDict()
        for row, uid in enumerate(batch.non_tensor_batch["uid"]):
            groups.setdefault(uid, []).append(row)
        plans = []  # (rows, teachers, {slot: rank})
        for rows in groups.values():
            if any(float(scores[r]) >= self.success for r in rows):
                continue
            teachers = sorted_teachers(batch.non_tensor_batch[key_][rows[0]], self.knobs)
            if not teachers:
                continue
            eff_k = min(len(teachers), self.knobs.n_guides)
            plans.append((rows, teachers, assign_teachers(list(range(len(rows))), eff_k, self.rng, self.ratio_range)))
        ranked, score_b, score = self._rank(batch, plans)
        written = []
        for (rows, teachers, slots), order in zip(plans, ranked):
            for slot, rank in slots.items():
                teacher = teachers[order[rank]]
                self._write(batch, rows[slot], teacher["content"])
                self.usage[str(teacher["source"])] += 1
                written.append(rows[slot])
        groups_n = max(len(groups), 1)
        return {
            "ampo/guided_groups": len(plans) / groups_n,
            "ampo/guided_rows": len(written),
            "ampo/teacher_scoreB": float(np.mean(score_b)) if score_b else 0.0,
            "ampo/teacher_score": float(np.mean(score)) if score else 0.0,
        }

    # -- the comprehension score
    def _rank(self, batch, plans) -> tuple[list[list[int]], list[float], list[float]]:
        """Per plan the teachers' order (best first); a single teacher needs no score (theirs skips the pass)."""
        jobs = [(p, k) for p, (_, teachers, _) in enumerate(plans) if len(teachers) > 1 for k in range(len(teachers))]
        values = self._gt_log_probs(batch, [(plans[p][0][0], plans[p][1][k]) for p, k in jobs])
        per_plan: dict[int, list[float]] = {}
        score_b, score = [], []
        for (p, k), (lps, fmt) in zip(jobs, values):
            b, s = comprehension_score(lps, fmt, self.knobs.format_coef, self.knobs.score_threshold)
            per_plan.setdefault(p, []).append(s)
            score_b.append(b)
            score.append(s)
        ranked = [rank_teachers(per_plan[p]) if p in per_plan else [0] for p in range(len(plans))]
        return ranked, score_b, score

    def _opens_think(self, batch, row: int) -> bool:
        ids, mask = batch.batch["input_ids"][row], batch.batch["attention_mask"][row]
        prompt = ids[: ids.shape[0] - self.length][mask[: ids.shape[0] - self.length].bool()]
        return self.tokenizer.decode(prompt[-8:].tolist()).endswith(THINK_OPEN)

    def _gt_log_probs(self, batch, jobs) -> list[tuple[torch.Tensor, float]]:
        """For each (row, teacher): the actor's log-probs of the GT tokens in prompt ++ teacher-with-GT ++ EOS, and
        the teacher's format score; one forward over all of them."""
        from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
        from verl.utils.torch_functional import compute_position_id_with_mask

        if not jobs:
            return []
        t, L = batch.batch, self.length
        pad, eos, fmt_kind = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, self.knobs.answer_format
        width = t["input_ids"].shape[1]
        ids = torch.full((len(jobs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        gt_masks, formats = torch.zeros((len(jobs), L), dtype=torch.bool), []
        for i, (row, teacher) in enumerate(jobs):
            ground_truth = str(batch.non_tensor_batch["reward_model"][row]["ground_truth"])
            text = str(teacher["content"])
            formats.append(answer_format_ok(text, fmt_kind))
            if self._opens_think(batch, row) and text.startswith(THINK_OPEN):
                text = text[len(THINK_OPEN) :]
            new_text, span = replace_answer(text, ground_truth, fmt_kind)
            enc = self.tokenizer(new_text, add_special_tokens=False, return_offsets_mapping=True)
            response = (list(enc["input_ids"]) + [eos])[:L]
            prompt = t["input_ids"][row, : width - L][t["attention_mask"][row, : width - L].bool()].tolist()
            seq = prompt + response
            ids[i, width - len(seq) :] = torch.tensor(seq)
            mask[i, width - len(seq) :] = 1
            if span is not None:  # positions in the last L tokens (the response slice of the forward)
                for p in gt_token_positions(enc["offset_mapping"], span):
                    if p < len(response):
                        gt_masks[i, L - len(response) + p] = True
        data = DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": compute_position_id_with_mask(mask),
                "responses": ids[:, -L:],
            },
            meta_info={"shared_prompt_forward": False},
        )
        data, n_pad = pad_dataproto_to_divisor(data, self.world_size)
        lps = unpad_dataproto(self.wg.compute_log_prob(data), n_pad).batch["old_log_probs"]
        return [(lps[i][gt_masks[i]], formats[i]) for i in range(len(jobs))]

    # -- the replaced row
    def _write(self, batch, row: int, content: str) -> None:
        """Row ``row`` becomes the teacher's trace ++ EOS (cut to L), every token off-policy, scored the success
        value on its last token."""
        t, L = batch.batch, self.length
        text = str(content)
        if self._opens_think(batch, row) and text.startswith(THINK_OPEN):
            text = text[len(THINK_OPEN) :]
        tokens = (list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id])[:L]
        k = len(tokens)
        resp = torch.full((L,), self.tokenizer.pad_token_id, dtype=t["responses"].dtype)
        resp[:k] = torch.tensor(tokens, dtype=resp.dtype)
        t["responses"][row] = resp
        t["input_ids"][row, -L:] = resp
        valid = torch.zeros((L,), dtype=t["attention_mask"].dtype)
        valid[:k] = 1
        t["attention_mask"][row, -L:] = valid
        if "response_mask" in t.keys():
            t["response_mask"][row] = valid.to(t["response_mask"].dtype)
        t["prefix_mask"][row] = False
        t["prefix_mask"][row, :k] = True
        for name in ("behaviour_log_probs",):
            if name in t.keys():
                t[name][row] = float("nan")
        if "rollout_log_probs" in t.keys():
            t["rollout_log_probs"][row] = 0.0  # no engine-generated token in this row
        t["token_level_scores"][row] = 0.0
        t["token_level_scores"][row, k - 1] = self.success

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "usage": dict(self.usage)}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.usage = Counter(state.get("usage") or {})


# ---------------------------------------------------------------------------------------------- data
def teacher_problem(value) -> Optional[str]:
    """Why one row's teachers value is unusable (None when fine): null (no guidance) or a list of dicts, each with a
    ``content`` string, an optional ``source`` string and a numeric ``quality_score`` (on all of a row's or none)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        return f"expected a list of {{content, source, quality_score}} or null, got {value!r:.60}"
    with_quality = 0
    for k, teacher in enumerate(value):
        if not isinstance(teacher, dict) or not isinstance(teacher.get("content"), str):
            return f"teacher {k} must be a dict with a 'content' string, got {teacher!r:.60}"
        if teacher.get("source") is not None and not isinstance(teacher["source"], str):
            return f"teacher {k}: 'source' must be a string, got {teacher['source']!r:.40}"
        q = teacher.get("quality_score")
        if q is not None:
            if isinstance(q, bool) or not isinstance(q, (int, float)):
                return f"teacher {k}: 'quality_score' must be a number, got {q!r:.40}"
            with_quality += 1
    if with_quality not in (0, len(value)):
        return "'quality_score' is on some teachers only (the quality sort needs it on all or none)"
    return None


def check_teachers_column(path: str, sections) -> Optional[str]:
    """The train file must carry ``algorithm.ampo.teachers_key``; the first bad row as one line naming file, row and
    column."""
    import os

    import pyarrow.parquet as pq

    column = sections.knobs.teachers_key
    if not os.path.isfile(path):
        return None  # check_parquet names a missing file
    if column not in pq.ParquetFile(path).schema_arrow.names:
        return (
            f"data.train_files: {path}: no column {column!r} (algorithm.ampo.teachers_key), the teachers' "
            f"solutions of each prompt: a list of {{content, source, quality_score}}"
        )
    for row, value in enumerate(pq.ParquetFile(path).read(columns=[column]).column(column).to_pylist()):
        problem = teacher_problem(value)
        if problem is not None:
            return f"data.train_files: {path}: row {row}: column {column!r}: {problem}"
    return None


def add_teachers(records, path: str, target_key: str = "target", teachers_key: str = "targets") -> list[dict]:
    """``records`` with ``teachers_key`` = one teacher per message of LUFFY's ``target`` column (source
    ``target<k>``, quality 1.0): the rehearsal's train file (a one-teacher AMPO run)."""
    out = []
    for rec in records:
        target = rec.get(target_key)
        teachers = (
            None
            if target is None
            else [
                {"content": str(m["content"]), "source": f"target{k}", "quality_score": 1.0}
                for k, m in enumerate(target)
            ]
        )
        out.append({**rec, teachers_key: teachers})
    return out


def ampo_memory(sections) -> dict:
    """What AMPO adds to the memory plan: the comprehension forward (an actor log-prob pass over prompt + teacher rows
    of the old-log-prob pass's width, at most ``max_teachers`` per failed prompt)."""
    return {"extra_forward": "log-prob: AMPO teacher comprehension (actor)"}


AMPO = register_method(
    Method(
        name="ampo",
        mechanism="all-failed groups only: up to 2 failed rows replaced by teacher traces ranked by the policy's "
        "comprehension (mean p of the GT answer tokens); LUFFY's shaped off-policy term + dual-clip PPO",
        knobs=AmpoKnobs,
        loss=ampo_loss,
        hooks=AmpoGuidance,
        check_train_file=check_teachers_column,
        rehearsal_data=add_teachers,
        memory=ampo_memory,
    )
)
