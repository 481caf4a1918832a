"""Self-replay: two stages of the training step, one on each side of the old/ref log-prob pass.

With ``data.self_replay.enable`` the training step calls, as a hook (luffy_pool/methods/hooks.py), in this order:

* ``SelfReplay.fill_failed_groups`` before the pass (``replay_into_failed_groups``): in every group none
  of whose on-policy rows succeeded, up to ``data.self_replay.slots`` rows are rewritten with a trace the
  policy itself produced at an earlier step (``SelfReplayBuffer.sample``): first the group's off-policy
  slots that hold no trace (prefix ratio > 0 but nothing in the pool), then its last on-policy rows. A
  rewritten row is an off-policy row like a teacher trace (``prefix_mask`` on every token, trace ++ EOS),
  regraded by the reward function, and carries the recorded behaviour log-probs as ``behaviour_log_probs``
  so the loss weights it by p / π_behaviour (``actor.use_off_policy_probs``). Rows whose behaviour is
  unknown hold NaN there, so the loss keeps its configured shaping for them (dataset targets, for
  instance). It must come first: the pass computes the actor's old (and reference) log-probs of the rows
  as rewritten, which the KL penalty and the update read.
* the pass itself (the trainer's own stage);
* ``SelfReplay.keep_successes`` after the pass: every on-policy row that succeeded goes into the buffer
  with its behaviour log-probs (the actor's recomputed ``old_log_probs``, else the engine's), which exist
  only once the pass has run. Sampling and expiry (before) therefore always see the buffer as the previous
  step left it.

Each stage gets what it needs as arguments (the batch, the step, the drawn ratios); neither calls back
into the trainer.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Optional

import numpy as np
import torch

from deepscaler.rewards import fail_success_values
from luffy_pool.replay.buffer import SelfReplayBuffer
from luffy_pool.methods.hooks import StepHooks
from verl.protocol import DataProto

# The batch's behaviour log-probs (NaN = unknown), the one representation from dataset/rollout to the loss.
BEHAVIOUR_KEY = "behaviour_log_probs"


def _groups(uids) -> "OrderedDict[Any, list[int]]":
    groups: "OrderedDict[Any, list[int]]" = OrderedDict()
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    return groups


def _write_trace(
    batch: DataProto, row: int, token_ids: list[int], logprobs: list[float], eos_token_id: int, pad_token_id: int
) -> None:
    """Rewrite ``row``'s response as the full off-policy trace ``token_ids ++ EOS`` (truncated to L)."""
    t = batch.batch
    length = t["responses"].shape[1]
    tokens = (list(token_ids) + [eos_token_id])[:length]
    k = len(tokens)
    resp = torch.full((length,), pad_token_id, dtype=t["responses"].dtype)
    resp[:k] = torch.tensor(tokens, dtype=resp.dtype)
    t["responses"][row] = resp
    t["input_ids"][row, -length:] = resp
    mask = torch.zeros((length,), dtype=t["attention_mask"].dtype)
    mask[:k] = 1  # the trace holds no EOS before its last token, so the EOS mask is its length
    t["attention_mask"][row, -length:] = mask
    if "response_mask" in t.keys():
        t["response_mask"][row] = mask.to(t["response_mask"].dtype)
    t["prefix_mask"][row] = False
    t["prefix_mask"][row, :k] = True
    behaviour = torch.full((length,), float("nan"), dtype=torch.float64)
    behaviour[:k] = torch.tensor(logprobs[:k], dtype=torch.float64)  # NaN (unknown) stays NaN
    t[BEHAVIOUR_KEY][row] = behaviour.to(t[BEHAVIOUR_KEY].dtype)
    if "rollout_log_probs" in t.keys():
        t["rollout_log_probs"][row] = 0.0  # no engine-generated token in this row


def replay_into_failed_groups(
    batch: DataProto,
    buffer: SelfReplayBuffer,
    step: int,
    *,
    slots: int,
    success: float,
    reward_fn: Callable,
    eos_token_id: int,
    pad_token_id: int,
    prefix_ratios: Optional[np.ndarray] = None,
) -> dict:
    """Rewrite rows of the step's failed groups with replayed traces; returns the ``replay/*`` metrics.

    ``batch`` is the rewarded rollout (``token_level_scores``); ``prefix_ratios`` ``[B, n]`` the ratios the
    driver drew (rows of a group in slot order). Adds ``behaviour_log_probs`` (NaN = unknown) when the
    batch has none, so the actor finds it on every step.
    """
    t = batch.batch
    scores = t["token_level_scores"].sum(-1)
    on_policy = ~t["prefix_mask"].bool().any(-1)
    # The on-policy reward of the rows as the policy generated them (the replaced rows leave the on-policy set).
    metrics = {"replay/generated_on_score": float(scores[on_policy].float().mean()) if on_policy.any() else 0.0}
    expired = buffer.expire(step)
    flat_ratios = np.asarray(prefix_ratios, dtype=np.float64).reshape(-1) if prefix_ratios is not None else None
    chosen: list[tuple[int, Any]] = []
    ids = batch.non_tensor_batch["index"]
    for rows in _groups(batch.non_tensor_batch["uid"]).values():
        on_rows = [r for r in rows if bool(on_policy[r])]
        if not on_rows or any(float(scores[r]) >= success for r in on_rows):
            continue
        entry = buffer.sample(ids[rows[0]], step)
        if entry is None:
            continue
        empty_off = [r for r in on_rows if flat_ratios is not None and flat_ratios[r] > 0]
        rest = [r for r in reversed(on_rows) if r not in empty_off]
        chosen.extend((r, entry) for r in (empty_off + rest)[:slots])
    if BEHAVIOUR_KEY not in t.keys():  # the actor reads it on every step (use_off_policy_probs)
        t[BEHAVIOUR_KEY] = torch.full(t["responses"].shape, float("nan"), dtype=torch.float32)
    if chosen:
        for row, entry in chosen:
            _write_trace(batch, row, entry.token_ids, entry.logprobs, eos_token_id, pad_token_id)
        rows = [r for r, _ in chosen]
        new_scores, _ = reward_fn(batch.select_idxs(rows))
        t["token_level_scores"][rows] = new_scores.to(t["token_level_scores"].dtype)
    ages = [entry.age(step) for _, entry in chosen]
    metrics.update(
        {
            "replay/used": len(chosen),
            "replay/age_mean": float(np.mean(ages)) if ages else 0.0,
            "replay/expired": expired,
        }
    )
    if chosen:
        replayed = t["token_level_scores"][[r for r, _ in chosen]].sum(-1)
        metrics["replay/replayed_score"] = float(replayed.float().mean())
    return metrics


def keep_successes(batch: DataProto, buffer: SelfReplayBuffer, step: int, *, success: float, eos_token_id: int) -> dict:
    """Insert this step's successful on-policy rows with their behaviour log-probs; returns metrics."""
    t = batch.batch
    length = t["responses"].shape[1]
    scores = t["token_level_scores"].sum(-1)
    on_policy = ~t["prefix_mask"].bool().any(-1)
    valid = t["attention_mask"][:, -length:].sum(-1)
    if "old_log_probs" in t.keys():
        behaviour = t["old_log_probs"]
    elif "rollout_log_probs" in t.keys():
        behaviour = t["rollout_log_probs"]
    else:
        behaviour = None
    inserted = evicted = 0
    for row in range(len(batch)):
        k = int(valid[row])
        if not bool(on_policy[row]) or float(scores[row]) < success or k == 0:
            continue
        tokens = t["responses"][row, :k].tolist()
        lps = behaviour[row, :k].double().tolist() if behaviour is not None else [math.nan] * k
        if tokens[-1] == eos_token_id:
            tokens = tokens[:-1]  # kept like a pool trace: the replay appends the EOS again
        else:
            lps = lps + [math.nan]  # truncated response: no EOS was sampled
        if not tokens:
            continue
        evicted += buffer.insert(batch.non_tensor_batch["index"][row], tokens, lps, step)
        inserted += 1
    return {
        "replay/inserted": inserted,
        "replay/evicted": evicted,
        "replay/size": len(buffer),
        "replay/prompts": buffer.num_prompts,
        "replay/buffer_age_mean": buffer.mean_age(step),
    }


class SelfReplay(StepHooks):
    """The buffer plus what its two stages need (slots, success value, reward function, token ids): a hook of
    the step (luffy_pool/methods/hooks.py). It sees the step's final slot plan, fills failed groups after the
    score (``fill_failed_groups``) and keeps the successes after the log-prob pass (``keep_successes``);
    ``save``/``load`` are what the checkpointer uses (``luffy_pool.run.checkpointing``: the buffer's JSON index +
    safetensors in ``self_replay/``, too large for the trainer's ``data.pt``).
    """

    name = "self_replay"
    needs_old_log_probs = True  # the kept successes carry the old log-probs as their behaviour log-probs

    def __init__(self, buffer: SelfReplayBuffer, *, slots: int, success: float, reward_fn: Callable, tokenizer):
        self.prefix_ratios = None  # this step's [B, n] slot plan, from plan_slots
        self.buffer = buffer
        self.slots = int(slots)
        self.success = float(success)
        self.reward_fn = reward_fn
        self.tokenizer = tokenizer  # read at call time: EOS and pad ids

    @classmethod
    def from_sections(cls, sections, *, reward_fn: Callable, tokenizer) -> Optional["SelfReplay"]:
        """The run's self-replay from ``data.self_replay`` (``ConfigSections``); None when it is off."""
        cfg = sections.data.self_replay
        if not cfg.enable:
            return None
        success = fail_success_values(int(sections.data.reward_impl_version))[1]
        return cls(
            SelfReplayBuffer.from_config(cfg, seed=int(sections.trainer.seed)),
            slots=cfg.slots,
            success=success,
            reward_fn=reward_fn,
            tokenizer=tokenizer,
        )

    def fill_failed_groups(self, batch: DataProto, step: int, prefix_ratios) -> dict:
        """Before the log-prob pass: rewrite rows of the failed groups of ``batch`` (the scored rollout,
        ``token_level_scores``) in place; ``prefix_ratios`` ``[B, n]`` are the ratios drawn for it."""
        return replay_into_failed_groups(
            batch,
            self.buffer,
            step,
            slots=self.slots,
            success=self.success,
            reward_fn=self.reward_fn,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            prefix_ratios=prefix_ratios,
        )

    def keep_successes(self, batch: DataProto, step: int) -> dict:
        """After the log-prob pass: put the step's successful on-policy rows into the buffer."""
        return keep_successes(batch, self.buffer, step, success=self.success, eos_token_id=self.tokenizer.eos_token_id)

    # ------------------------------------------------------------------ the step's hooks
    def plan_slots(self, batch, gen_batch, ratios, step: int):
        self.prefix_ratios = ratios
        return ratios, {}

    def after_score(self, batch: DataProto, step: int) -> dict:
        return self.fill_failed_groups(batch, step, self.prefix_ratios)

    def after_log_probs(self, batch: DataProto, step: int) -> dict:
        return self.keep_successes(batch, step)

    def save(self, directory: str) -> list[str]:
        return self.buffer.save(directory)

    def load(self, directory: str) -> None:
        self.buffer.load(directory)
