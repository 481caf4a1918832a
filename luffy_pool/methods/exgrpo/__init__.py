"""``algorithm.method=exgrpo`` (arXiv 2510.02245; ElliottYan/LUFFY ``ExGRPO/``): the model's own
earlier successes, replayed with the log-probs recorded when they were generated.

Warm-up: on-policy GRPO (PPO clip on). Once the share of correct responses in a batch passes
``algorithm.exgrpo.start_solved_ratio`` the run is mixed for good: each batch replaces ``experience_ratio`` of its
prompts with questions drawn by success-count bucket from the experience pool, each replayed as one full-trace slot
(its stored trajectory with the lowest entropy under the current actor) next to ``n − 1`` fresh rollouts; the
replayed row's old log-prob is the recorded one, so the loss (``exgrpo``, luffy_pool/methods/exgrpo/blocks.py
``exgrpo_token_loss``) shapes ``w = π_θ / π_recorded`` by ``w/(w+0.1)``, unclipped on the fresh rows.

Driver stages (:class:`ExgrpoDriver`, called by luffy_pool/trainer/mix_trainer.py where ``Method.driver`` is set):

1. ``compose`` (before the rollout): the drawn batch less its dataset targets (ExGRPO ignores the target column),
   cut to its first ``B − n_exp`` prompts, plus the replayed questions' prompts from the dataset; the entropy
   forward (``wg.compute_log_prob`` over every stored trajectory of each replayed question with more than one)
   picks each question's trajectory. ``metric_impl=paper`` (default): the mean entropy of the trajectory's own
   tokens (trace ++ EOS, as it is trained); ``original``: the authors' ``compute_postcal_metrics`` mask
   (``trajectory_metric_original``) over the last L positions of the left-padded prompt ++ trajectory.
2. ``attach`` (in the rollout): slot 0 of each replayed prompt gets prefix ratio 1 and the trajectory with its
   recorded log-probs (``behaviour_log_probs``); every other slot is on-policy.
3. ``after_log_probs``: collection and retirement (``ExperiencePool.observe``), then the recorded-log-prob swap.
4. ``end_step`` (after the update): retired questions leave the pool; the phase switch.

State (pool, buckets, retired set, phase, the pool's RNGs) travels in the trainer's ``state_dict`` into the
checkpoint's ``data.pt`` (plain data and tensors, manifest-checked, ``weights_only``). The pool keeps int32 token
ids and float32 log-probs, at most ``max_trajectories_per_question`` per question (luffy_pool/replay/experience.py).
The self-replay pool stays a separate option (luffy_pool/replay/experience.py says why);
``data.self_replay.enable=True`` is refused with it.
Fixed against the authors' code: the phase is saved and restored (theirs re-enters the mixed phase on resume only
after step 2 with a non-empty pool); trajectories are token ids, so the recorded log-probs stay aligned (theirs
re-tokenise the decoded text, which can shift the recorded log-prob vector).
Differences: retired questions are passed over when a batch is drawn rather than filtered out of the dataset at
each epoch start (the same questions train); a question keeps its newest ``max_trajectories_per_question``
trajectories (default 8; 0 = the authors' unbounded pool); not reproduced: the authors' ``skip_grad_bound=500`` step
skip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from verl.utils.config_section import NON_NEGATIVE, UNIT, key
from luffy_pool.methods.exgrpo.blocks import (  # noqa: F401 -- the pure blocks, re-exported
    bucket_probabilities,
    bucket_weight,
    BucketManager,
    collect_group,
    eligible_uids,
    exgrpo_token_loss,
    ExgrpoLossConfig,
    experience_count,
    retire_group,
    sample_experience_uids,
    sample_from_buckets,
    select_best,
    swap_recorded_log_probs,
    switch_to_mixed,
    trajectory_metric_original,
    trajectory_metric_paper,
    TRAJECTORY_METRICS,
    WEIGHTINGS,
)

TARGET_KEYS = ("tgt_input_ids", "behaviour_log_probs", "tgt_truncated")
LOG_PROB_KEYS = ["responses", "input_ids", "attention_mask", "position_ids"]
ORIGINAL_SUB_BATCH = 8  # compute_postcal_metrics batches the candidates by 8 (its mask quirk follows it)


@dataclass(frozen=True)
class ExgrpoKnobs:
    """``algorithm.exgrpo``: ExGRPO's experience pool, batch mix and phase switch."""

    start_solved_ratio: float = key(
        bounds=UNIT,
        default=0.35,
        doc="Warm-up ends (for good) after a step whose share of correct responses exceeds this. Authors: 0.35.",
    )
    experience_ratio: float = key(
        bounds=UNIT,
        default=0.5,
        doc="Share of each mixed batch's prompts replaced by experience questions (floor(B x ratio), at most the eligible pool). Authors: 0.5.",
    )
    lbound: int = key(
        bounds=NON_NEGATIVE,
        default=0,
        doc="A mixed-phase group with k successes is stored when lbound < k <= rbound (and k < n). Authors: 0.",
    )
    rbound: int = key(
        bounds=NON_NEGATIVE,
        default=7,
        doc="Upper bound of k for storing (set it to n - 1 with another rollout.n). Authors: 7 (n = 8).",
    )
    bucket_weighting: str = key(
        choices=("normal", "linear", "sqrt", "linear_clip", "uniform"),
        default='normal',
        doc="Bucket weights of the question sampler: normal (N(k; n/2, 1)), linear (k/n), sqrt, linear_clip, or uniform (no buckets: random.sample). Authors: normal.",
    )
    traj_metric: str = key(
        choices=("ent", "ppl", "random"),
        default='ent',
        doc="Which stored trajectory a replayed question uses: ent (its entropy under the current actor), ppl (perplexity), random. Authors' script: ent (their YAML default: random).",
    )
    traj_select: str = key(
        choices=("argmin", "argmax"), default='argmin', doc="argmin or argmax of traj_metric. Authors: argmin."
    )
    sample_range: str = key(
        choices=("all", "first_half", "last_half"),
        default='all',
        doc="Eligible questions: all, first_half (oldest half of the pool) or last_half (newest). Authors: all.",
    )
    is_correct: bool = key(
        default=True,
        doc="The replayed row's old log-prob is the one recorded at collection (ratio pi_theta / pi_recorded); False keeps the actor's recomputed one. Authors: True (exp_is_correct).",
    )
    metric_impl: str = key(
        choices=("paper", "original"),
        default='paper',
        doc="traj_metric reduction: paper (mean over the trajectory's own tokens) or original (the authors' mask in compute_postcal_metrics, ElliottYan/LUFFY ExGRPO/.../experience/experience_helpers.py: averages over the pad positions of another candidate's row). Not in their code: paper.",
    )
    retire_all_correct: bool = key(
        default=True,
        doc="A question whose n rollouts are all correct retires from the batches and the pool. Authors: True.",
    )
    max_trajectories_per_question: int = key(
        bounds=NON_NEGATIVE,
        default=8,
        doc="Stored trajectories per question: beyond it the oldest leave (their recorded log-probs are the stalest). It bounds the driver's pool (int32 ids + float32 log-probs, 8 B per token, in data.pt too) and the entropy forward, which scores every stored trajectory of a replayed question. 0 = no cap. Authors: no cap.",
    )


def _off(value):
    """LUFFY's clamp keys: -1 (or null) is off."""
    return None if value is None or float(value) == -1 else float(value)


def exgrpo_loss(inputs, knobs: ExgrpoKnobs, step: int):
    """:func:`exgrpo_token_loss` with the actor's loss keys. ExGRPO's trainer sends ``loss_remove_clip`` only in
    the mixed phase and forces PPO clip in warm-up (the hooks' ``update_state["mixed"]``)."""
    loss = inputs.settings
    mixed = bool((inputs.update_state or {}).get("mixed", False))
    cfg = ExgrpoLossConfig(
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_clip=bool(loss.loss_remove_clip and mixed),
        loss_remove_token_mean=loss.loss_remove_token_mean,
        off_policy_reshape=loss.off_policy_reshape,
        off_policy_max_clip=_off(loss.off_policy_max_clip),
        off_policy_min_clip=_off(loss.off_policy_min_clip),
        all_max_clip=_off(loss.all_max_clip),
    )
    return exgrpo_token_loss(inputs, cfg)


def exgrpo_memory(sections) -> dict:
    """What ExGRPO adds to the memory plan: the trajectory-metric forward over stored trajectories (an extra actor
    log-prob pass) and the driver's experience pool (host memory, bounded by the cap)."""
    knobs, n = sections.knobs, sections.workers.rollout.n
    extra = f"log-prob: ExGRPO trajectory {knobs.traj_metric} (actor)" if knobs.traj_metric != "random" else ""
    # a group is stored when lbound < k <= rbound and k < n, each of its k successes once; the cap keeps a
    # question's newest, so a step adds at most min(rbound, n - 1, cap) trajectories per group
    per_group = min(int(knobs.rbound), n - 1)
    if knobs.max_trajectories_per_question:
        per_group = min(per_group, int(knobs.max_trajectories_per_question))
    pool = {
        "label": "ExGRPO experience pool",
        "cap_key": "algorithm.exgrpo.max_trajectories_per_question",
        "cap": int(knobs.max_trajectories_per_question),
        "per_group": per_group,
    }
    return {"extra_forward": extra, "host_pool": pool}


class ExgrpoDriver(StepHooks):
    """ExGRPO's stages of the step (module docstring), a hook built from its context (luffy_pool/methods/hooks.py:
    ``sections``, ``wg``, ``tokenizer``, ``dataset``, ``collate_fn``, ``world_size``, ``response_length``)."""

    name = "exgrpo"
    needs_old_log_probs = True  # collection records them; the replayed rows swap in the recorded ones

    def __init__(self, trainer):
        from deepscaler.rewards import fail_success_values
        from luffy_pool.replay.experience import ExperiencePool, question_key

        s = trainer.sections
        self.trainer = trainer
        self.knobs = s.knobs
        self.dataset = trainer.dataset
        self.positions = {question_key(v): i for i, v in enumerate(self.dataset.prompt_ids)}
        success = fail_success_values(int(s.data.reward_impl_version))[1]
        self.pool = ExperiencePool(
            self.knobs,
            n=s.workers.rollout.n,
            batch_size=int(s.data.train_batch_size),
            dataset_size=len(self.dataset),
            success=success,
            seed=int(s.trainer.seed),
        )
        self.replays: dict[int, object] = {}  # this step: batch row -> the Trajectory replayed there

    # ------------------------------------------------------------------ 1. the step's prompts
    def compose(self, batch):
        """The step's prompt batch (see the module docstring); sets ``self.replays``; returns (batch, metrics)."""
        from verl.protocol import DataProto
        from verl.utils.dataset.rl_dataset import RLHFDataset

        keys = [k for k in TARGET_KEYS if k in batch.batch.keys()]
        if keys:
            batch.pop(batch_keys=keys)
        plan = self.pool.plan(list(batch.non_tensor_batch["index"]))
        if len(plan.fresh) != len(batch):
            batch = batch.select_idxs(plan.fresh)
        self.replays = {}
        if not plan.replay:
            return batch, {"exgrpo/replayed_questions": 0, "exgrpo/metric_forward_rows": 0}
        missing = [uid for uid in plan.replay if uid not in self.positions]
        if missing:
            raise ValueError(
                f"ExGRPO: question id {missing[0]!r} of the experience pool is not in data.train_files "
                f"(the checkpoint comes from another dataset?)"
            )
        rows = [RLHFDataset.__getitem__(self.dataset, self.positions[uid]) for uid in plan.replay]
        replay = DataProto.from_single_dict(self.trainer.collate_fn(rows))
        drop = [k for k in TARGET_KEYS if k in replay.batch.keys()]
        if drop:
            replay.pop(batch_keys=drop)
        first = len(batch)
        batch = DataProto.concat([batch, replay])
        # one actor forward over the candidates of every question that needs it (original: of every replayed
        # question, in draw order, since the authors' mask quirk depends on the whole list of candidates)
        scored = [
            (first + i, uid)
            for i, uid in enumerate(plan.replay)
            if self.pool.needs_metric(uid)
            or (self.knobs.metric_impl == "original" and self.knobs.traj_metric != "random")
        ]
        values = self._trajectory_metrics(batch, [(row, tr) for row, uid in scored for tr in self.pool.pool[uid]])
        per_uid, at = {}, 0
        for _, uid in scored:
            per_uid[uid] = values[at : at + len(self.pool.pool[uid])]
            at += len(self.pool.pool[uid])
        for i, uid in enumerate(plan.replay):
            self.replays[first + i] = self.pool.pool[uid][self.pool.choose(uid, per_uid.get(uid))]
        return batch, {"exgrpo/replayed_questions": len(plan.replay), "exgrpo/metric_forward_rows": len(values)}

    def _candidates(self, batch, candidates):
        """The rows the actor's log-prob pass takes for ``candidates`` ``[(batch row of the prompt, trajectory)]``,
        and what the metric averages over: ``paper``: prompt ++ trace ++ EOS as the rollout's full-trace slot, and
        its response mask; ``original``: the authors' frame (prompt ++ trajectory ++ EOS left-padded to P + L, the
        last L positions as the response), and the trajectories ++ EOS right-padded to L (their mask source)."""
        from luffy_pool.rollout.slot_plan import assemble_responses, build_slot_plan
        from verl.utils.torch_functional import compute_position_id_with_mask

        t, tok = batch.batch, self.trainer.tokenizer
        L, c = self.trainer.response_length, len(candidates)
        pad, eos = tok.pad_token_id, tok.eos_token_id
        rows = [row for row, _ in candidates]
        if self.knobs.metric_impl == "paper":
            width = max(len(tr.ids) for _, tr in candidates)
            traces = torch.full((c, width), pad, dtype=torch.long)
            for i, (_, tr) in enumerate(candidates):
                traces[i, : len(tr.ids)] = torch.from_numpy(tr.ids)
            plan = build_slot_plan(
                t["input_ids"][rows],
                t["attention_mask"][rows],
                traces.unsqueeze(1),
                np.ones((c, 1)),
                pad,
                eos,
                L,
                prompt_position_ids=t["position_ids"][rows],
            )
            out = assemble_responses(plan, []).tensors
            return {k: out[k] for k in LOG_PROB_KEYS}, out["response_mask"]
        total = t["input_ids"].shape[1] + L
        ids = torch.full((c, total), pad, dtype=torch.long)
        mask = torch.zeros((c, total), dtype=torch.long)
        right = torch.full((c, L), pad, dtype=torch.long)
        for i, (row, tr) in enumerate(candidates):
            trajectory = tr.token_ids + [eos]
            seq = (t["input_ids"][row][t["attention_mask"][row].bool()].tolist() + trajectory)[-total:]
            ids[i, total - len(seq) :] = torch.tensor(seq)
            mask[i, total - len(seq) :] = 1
            right[i, : min(L, len(trajectory))] = torch.tensor(trajectory[:L])
        tensors = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": compute_position_id_with_mask(mask),
            "responses": ids[:, -L:],
        }
        return tensors, right

    def _trajectory_metrics(self, batch, candidates) -> list[float]:
        """One value per candidate ``(prompt row, trajectory)`` (``traj_metric`` ent / ppl under the current actor;
        ``metric_impl`` paper / original); no forward for none."""
        from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

        if not candidates:
            return []
        tensors, mask = self._candidates(batch, candidates)
        # the plain forward on every rank (verl/workers/actor/dp_actor.py compute_log_prob): candidates are no
        # GRPO groups, so prompts repeat on some ranks' micro-batches and not on others'
        data = DataProto.from_dict(tensors=tensors, meta_info={"shared_prompt_forward": False})
        data, pad = pad_dataproto_to_divisor(data, self.trainer.world_size)
        out = unpad_dataproto(self.trainer.wg.compute_log_prob(data), pad).batch
        kind = self.knobs.traj_metric
        values = (out["old_entropy"] if kind == "ent" else out["old_log_probs"]).float()
        if self.knobs.metric_impl == "paper":
            return trajectory_metric_paper(values, mask, kind)
        return trajectory_metric_original(values, mask, self.trainer.tokenizer.pad_token_id, kind, ORIGINAL_SUB_BATCH)

    # ------------------------------------------------------------------ 2. the rollout's slots
    def attach(self, gen_batch, bsz: int, n: int) -> np.ndarray:
        """Prefix ratios ``[B, n]`` (1 on slot 0 of each replayed prompt, 0 elsewhere) and, when a prompt is
        replayed, the per-slot traces ``tgt_input_ids [B, n, T]`` and ``behaviour_log_probs [B, n, T + 1]`` (the
        recorded log-probs) in ``gen_batch``."""
        ratios = np.zeros((bsz, n), dtype=np.float64)
        if not self.replays:
            return ratios
        pad = self.trainer.tokenizer.pad_token_id
        width = max(len(tr.ids) for tr in self.replays.values())
        tgt = torch.full((bsz, n, width), pad, dtype=torch.long)
        lps = torch.full((bsz, n, width + 1), float("nan"), dtype=torch.float64)
        for row, tr in self.replays.items():
            ratios[row, 0] = 1.0
            tgt[row, 0, : len(tr.ids)] = torch.from_numpy(tr.ids)
            lps[row, 0, : len(tr.lps)] = torch.from_numpy(tr.lps)  # float32 -> float64: exact
        gen_batch.batch["tgt_input_ids"] = tgt
        gen_batch.batch["behaviour_log_probs"] = lps
        return ratios

    # ------------------------------------------------------------------ 3. after the old-log-prob pass
    def after_log_probs(self, batch, step: int = 0) -> dict:
        """Collect and retire (``ExperiencePool.observe``, with the actor's old log-probs as the recorded ones),
        then give the replayed rows their recorded log-probs as old log-probs (``is_correct``)."""
        from luffy_pool.replay.experience import recorded_old_log_probs

        t = batch.batch
        L = self.trainer.response_length
        metrics = self.pool.observe(
            batch.non_tensor_batch["index"],
            batch.non_tensor_batch["uid"],
            t["token_level_scores"].sum(-1),
            t["responses"],
            t["attention_mask"][:, -L:],
            t["old_log_probs"],
            self.trainer.tokenizer.eos_token_id,
        )
        if self.knobs.is_correct and self.replays and "behaviour_log_probs" in t.keys():
            t["old_log_probs"] = recorded_old_log_probs(t["old_log_probs"], t["behaviour_log_probs"], t["prefix_mask"])
        return metrics

    def plan_slots(self, batch, gen_batch, ratios, step: int):
        return self.attach(gen_batch, len(ratios), self.trainer.sections.workers.rollout.n), {}

    def before_update(self, batch):
        """The loss's phase: ``mixed`` (unclipped on-policy tokens as configured) or warm-up (PPO clip)."""
        return {}, {"mixed": bool(self.pool.mixed)}

    def after_update(self, batch, timing: dict) -> dict:
        return self.end_step(batch)

    # ------------------------------------------------------------------ 4. after the update
    def end_step(self, batch) -> dict:
        self.replays = {}
        return self.pool.end_step(batch.batch["token_level_scores"].sum(-1))

    def state_dict(self) -> dict:
        return self.pool.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.pool.load_state_dict(state)


EXGRPO = register_method(
    Method(
        name="exgrpo",
        mechanism="replay of the model's own successes (bucket-sampled, lowest entropy), "
        "shaped f(π_θ/π_recorded); warm-up on-policy",
        knobs=ExgrpoKnobs,
        loss=exgrpo_loss,
        hooks=ExgrpoDriver,
        needs_question_ids=True,
        stateful=True,
        memory=exgrpo_memory,
    )
)
