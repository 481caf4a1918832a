"""``algorithm.method=uft`` (arXiv 2505.16984, METHODS_SPEC §6, liumy2010/UFT): a hint (the first ``s_j`` segments
of the prompt's solution) continued by every rollout of the group, ``j ∼ Binomial(m, p(t))`` with ``p(t)`` cosine
annealed 0.95 -> 0.05 over ``T_hint`` steps and 0 after, and ``β·`` the hint tokens' NLL added to the GRPO loss.

Mapping onto the slot plan: UFT appends the hint to the prompt; here the hint is the first part of every slot's
response, a prefix the engine continues (``prefix_mask`` marks it): the tokens the policy is conditioned on, and
the hint tokens' log-probs, are the same (the hint is tokenised on its own, as UFT's). The ``uft`` loss keeps the
hint tokens out of the policy gradient and puts them in the NLL term. Differences this leaves: the hint takes part
of ``data.max_response_length`` (UFT: of the prompt length); the reward scores hint + continuation (UFT's verl
reward decodes prompt + response, so the same text); the entropy bonus averages over the hint tokens too; no ±100
logit clamp on the NLL (only logits beyond it differ).

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
from typing import Optional

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from verl.utils.data_format import DataFormatError

A = "actor_rollout_ref.actor"
PREPARE = "python data/prepare_uft_hints.py"
THINK_OPEN = "<think>\n"  # a solution's opening, which the LUFFY model's template already ends with


class UftHintSampler:
    """Draws each prompt's hint, writes its tokens as the prompt's trace ``tgt_input_ids`` and gives every slot
    the ratio that makes the slot plan's prefix exactly the hint (``(h + ½)/(h + 1)`` of hint ++ EOS)."""

    KIND = "uft"

    def __init__(self, n: int, cfg, hint_key: str, tokenizer, seed: int):
        self.n, self.cfg, self.hint_key, self.tokenizer = n, cfg, hint_key, tokenizer
        self.rng = np.random.RandomState(seed)

    @classmethod
    def from_sections(cls, sections, *, seed: int, total_steps: int = 0, tokenizer=None) -> "UftHintSampler":
        from luffy_pool.algorithm.family.uft import UftConfig

        k = sections.algorithm.uft
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
        from luffy_pool.algorithm.family.uft import sample_hint

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

    def draw_batch(self, batch, global_step: int) -> tuple[np.ndarray, dict]:
        from luffy_pool.algorithm.family.uft import hint_probability

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
        opens_think = self._opens_think(batch)
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
    from luffy_pool.algorithm.family.uft import split_solution

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

    key = sections.algorithm.uft.hint_key
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
        requires={f"{A}.policy_loss": "uft", "algorithm.adv_estimator": "grpo"},
        replaces={f"{A}.use_off_policy_loss": False},
        knobs="uft",
        ratio_sampler=UftHintSampler.from_sections,
        check_train_file=check_hint_column,
    )
)
