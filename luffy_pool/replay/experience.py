"""ExGRPO's experience pool on the driver: what it stores, how a step's batch is composed from it, and what a step
adds to it (``algorithm.method=exgrpo``, arXiv 2510.02245; the pure rules are luffy_pool/methods/exgrpo/blocks.py).

``ExperiencePool`` holds, per question id (the dataset's ``index``: ``extra_info.index`` or the row position), the
successful trajectories of partially solved groups with the per-token log-probs the actor recomputed for them at
that step (``old_log_probs``, the ones ExGRPO records), plus the bucket map (question -> latest success count),
the retired set and the phase (warm-up / mixed). Every call is tensors and plain data in, decisions out; the
trainer glue that draws prompts from the dataset and runs the entropy forward is luffy_pool/methods/exgrpo.py.

Relation to the self-replay pool (luffy_pool/replay/self_replay.py, ``data.self_replay``): it stays a distinct
option, and the two are refused together. Self-replay rewrites rows of groups with *no* success after generation,
with capacity, eviction and age limits and RNG-free choices; ExGRPO stores successes of *partially* solved groups
(at most ``max_trajectories_per_question`` per question, the newest), replaces whole prompts *before* generation
with questions drawn by success-count bucket, picks the lowest-entropy trajectory under the current actor, retires
solved questions and switches phase. Sharing one store would change both methods' numbers; what they do share is the
trace format (response tokens without the EOS, log-probs of tokens ++ EOS) and the full-trace slot of the rollout
(luffy_pool/rollout/slot_plan.py).

Trajectories are kept as token ids, not re-tokenised text, so the recorded log-prob vector always lines up with
the replayed tokens (re-tokenised text could differ from the sampled tokens and misalign them). They are int32 /
float32 arrays, 8 bytes per token: Python lists of ints and floats cost ~70 (an 8-byte pointer plus a 28-byte int or a 24-byte float per element), which over a
701-step run is tens of GB on the driver. float32 loses nothing: the recorded log-probs are the actor's float32
``old_log_probs``. The authors' pool has no cap; here a question keeps its newest ``max_trajectories_per_question``
(``algorithm.exgrpo``; 0 = no cap), which also bounds the entropy forward over a replayed question's trajectories.
The checkpoint stores the pool as four flat tensors (``_pack_pool``), not two tensors per trajectory; a version-1
state (int64 / float64 tensors per trajectory) still loads. Randomness (bucket multinomial, ``random.sample``,
``random`` trajectory choice) comes from the pool's own seeded ``numpy.random.RandomState`` and ``random.Random``,
saved with the checkpoint in :meth:`ExperiencePool.state_dict`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Hashable, Optional, Sequence

import numpy as np
import torch

from luffy_pool.methods.exgrpo.blocks import (
    BucketManager,
    collect_group,
    eligible_uids,
    experience_count,
    retire_group,
    sample_experience_uids,
    swap_recorded_log_probs,
    switch_to_mixed,
)

STATE_VERSION = 2  # 1: a (int64 ids, float64 log-probs) tensor pair per trajectory; 2: flat int32 / float32 tensors
# the authors filter retired questions out of the dataset only while it keeps more than batch + 20 of them
# (mix_trainer_experience.py fit, per epoch)
RETIRE_FILTER_MARGIN = 20


def question_key(value: Any) -> Hashable:
    """A dataset ``index`` as a plain, checkpointable dict key (numpy scalars -> Python)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (int, str)):
        return value
    return str(value)


class Trajectory:
    """One stored success: response tokens without the trailing EOS (``ids``, int32) and the recorded log-probs of
    tokens ++ EOS (``lps``, float32; NaN for an EOS the response never sampled: a response cut at the length limit).
    ``token_ids`` / ``log_probs`` give them as lists."""

    __slots__ = ("ids", "lps")

    def __init__(self, token_ids, log_probs):
        self.ids = np.array(token_ids, dtype=np.int32)
        self.lps = np.array(log_probs, dtype=np.float32)

    @property
    def token_ids(self) -> list[int]:
        return self.ids.tolist()

    @property
    def log_probs(self) -> list[float]:
        return self.lps.tolist()

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.lps.nbytes

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Trajectory)
            and np.array_equal(self.ids, other.ids)
            and np.array_equal(self.lps, other.lps, equal_nan=True)
        )

    def __repr__(self) -> str:
        return f"Trajectory({self.token_ids!r}, {self.log_probs!r})"


@dataclass(frozen=True)
class BatchPlan:
    """How a step's prompts are made: ``fresh`` positions of the drawn batch to keep (in order), then ``replay``
    question ids, each replayed with ``chosen``-th stored trajectory (filled in by :meth:`ExperiencePool.choose`)."""

    fresh: list[int]
    replay: list[Hashable]


class ExperiencePool:
    """ExGRPO's driver state (see the module docstring). ``knobs`` is the ``algorithm.exgrpo`` section;
    ``n`` the group size (``rollout.n``); ``success`` the reward value of a correct response."""

    def __init__(self, knobs, *, n: int, batch_size: int, dataset_size: int, success: float, seed: int):
        self.knobs = knobs
        self.n = int(n)
        self.batch_size = int(batch_size)
        self.dataset_size = int(dataset_size)
        self.success = float(success)
        self.pool: dict[Hashable, list[Trajectory]] = {}
        self.buckets = BucketManager()
        self.retired: set = set()
        self.mixed = False
        self.np_rng = np.random.RandomState(seed)
        self.py_rng = random.Random(seed)

    # ------------------------------------------------------------------ batch composition
    def plan(self, drawn_ids: Sequence[Any]) -> BatchPlan:
        """The step's prompts from the sampler's drawn batch (``drawn_ids``: their question ids, in order).

        Warm-up: the drawn batch. Mixed: ``n_exp = min(#eligible, ⌊B·experience_ratio⌋)`` questions sampled by
        bucket (:func:`sample_experience_uids`) and the first ``B − n_exp`` drawn prompts. Retired questions are
        passed over among the drawn ones (while the dataset keeps more than ``B + 20`` unretired questions, the
        authors' per-epoch filter done at draw time), refilled from the later drawn prompts; the batch keeps its size.
        """
        keys = [question_key(v) for v in drawn_ids]
        n_exp, replay = 0, []
        if self.mixed:
            eligible = eligible_uids(self.pool, self.retired, self.knobs.sample_range)
            n_exp = experience_count(self.batch_size, self.knobs.experience_ratio, len(eligible))
            method = self.knobs.bucket_weighting if self.knobs.bucket_weighting != "uniform" else None
            replay = sample_experience_uids(self.buckets, eligible, n_exp, self.n, method, self.np_rng, self.py_rng)
        want = len(keys) - len(replay)
        order = list(range(len(keys)))
        if self.retired and self.dataset_size - len(self.retired) > self.batch_size + RETIRE_FILTER_MARGIN:
            live = [i for i in order if keys[i] not in self.retired]
            order = live + [i for i in order if keys[i] in self.retired]
        return BatchPlan(fresh=sorted(order[:want]), replay=list(replay))

    def choose(self, uid: Hashable, metrics: Optional[Sequence[float]]) -> int:
        """Index of the stored trajectory of ``uid`` to replay: ``traj_metric=random`` a uniform draw, else
        ``traj_select`` (argmin/argmax) of ``metrics`` (one per stored trajectory)."""
        from luffy_pool.methods.exgrpo.blocks import select_best

        candidates = self.pool[uid]
        if self.knobs.traj_metric == "random":
            return self.py_rng.randrange(len(candidates))
        if len(candidates) == 1:
            return 0
        return select_best(list(metrics), self.knobs.traj_select)

    def needs_metric(self, uid: Hashable) -> bool:
        """Whether choosing among ``uid``'s trajectories needs the actor's forward (entropy / log-probs)."""
        return self.knobs.traj_metric != "random" and len(self.pool[uid]) > 1

    # ------------------------------------------------------------------ after the step's log-prob pass
    def observe(
        self,
        question_ids: Sequence[Any],
        group_ids: Sequence[Any],
        scores: torch.Tensor,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        old_log_probs: torch.Tensor,
        eos_token_id: int,
    ) -> dict:
        """Per group (rows sharing a ``group_ids`` value, all of one question): ``k`` = correct rows (the replayed row
        counts, as in the authors' code). All correct: the question retires (warm-up too). Mixed phase and
        ``lbound < k ≤ rbound``: each correct row's response joins the question's pool unless the same tokens are
        stored already, with its ``old_log_probs`` as the recorded log-probs (the oldest leave beyond
        ``max_trajectories_per_question``), and the question moves to bucket ``k``."""
        groups: dict[Any, list[int]] = {}
        for row, g in enumerate(group_ids):
            groups.setdefault(g, []).append(row)
        correct = scores == self.success
        valid = response_mask.sum(-1)
        cap = int(self.knobs.max_trajectories_per_question)
        added = retired = collected = dropped = 0
        for rows in groups.values():
            uid = question_key(question_ids[rows[0]])
            k = int(correct[rows].sum())
            if self.knobs.retire_all_correct and retire_group(k, len(rows)):
                self.retired.add(uid)
                retired += 1
            if not (self.mixed and collect_group(k, len(rows), self.knobs.lbound, self.knobs.rbound)):
                continue
            collected += 1
            stored = self.pool.setdefault(uid, [])
            for row in rows:
                length = int(valid[row])
                if not bool(correct[row]) or length == 0:
                    continue
                tokens = responses[row, :length].to(torch.int32).numpy()
                lps = old_log_probs[row, :length].float().numpy()
                if tokens[-1] == eos_token_id:
                    tokens = tokens[:-1]
                else:
                    lps = np.append(lps, np.float32(math.nan))
                if not len(tokens) or any(np.array_equal(t.ids, tokens) for t in stored):
                    continue
                stored.append(Trajectory(tokens, lps))
                added += 1
                if cap and len(stored) > cap:  # the newest stay: their recorded log-probs are the least stale
                    del stored[0]
                    dropped += 1
            self.buckets.update_bucket(uid, k)
        return {
            "exgrpo/collected_groups": collected,
            "exgrpo/added_trajectories": added,
            "exgrpo/retired_groups": retired,
            "exgrpo/dropped_trajectories": dropped,
        }

    def end_step(self, scores: torch.Tensor) -> dict:
        """After the update: drop retired questions from the pool and buckets, then switch to the mixed phase
        when the share of correct responses in the batch exceeds ``start_solved_ratio``."""
        for uid in [u for u in self.pool if u in self.retired]:
            del self.pool[uid]
        self.buckets.cleanup_consistency(self.pool)
        solved = float((scores == self.success).float().mean()) if scores.numel() else 0.0
        self.mixed = switch_to_mixed(self.mixed, solved, self.knobs.start_solved_ratio)
        out = {
            "exgrpo/solved_ratio": solved,
            "exgrpo/mixed": float(self.mixed),
            "exgrpo/pool_questions": len(self.pool),
            "exgrpo/pool_trajectories": sum(len(v) for v in self.pool.values()),
            "exgrpo/pool_mib": sum(t.nbytes for v in self.pool.values() for t in v) / 2**20,
            "exgrpo/retired_questions": len(self.retired),
        }
        out.update({f"exgrpo/{k}": v for k, v in self.buckets.get_bucket_stats().items()})
        return out

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """Tensors and plain data only (``data.pt`` is read with ``weights_only``); insertion orders kept."""
        np_state = self.np_rng.get_state()
        return {
            "version": STATE_VERSION,
            "pool": _pack_pool(self.pool),
            "buckets": self.buckets.state_dict(),
            "retired": sorted(self.retired, key=repr),
            "mixed": bool(self.mixed),
            "np_rng": [
                np_state[0],
                torch.from_numpy(np.asarray(np_state[1]).astype(np.int64)),
                int(np_state[2]),
                int(np_state[3]),
                float(np_state[4]),
            ],
            "py_rng": [self.py_rng.getstate()[0], list(self.py_rng.getstate()[1]), self.py_rng.getstate()[2]],
        }

    def load_state_dict(self, state: dict) -> None:
        """A version-2 state, or a version-1 one (per-trajectory int64 / float64 tensors, converted); a question over
        ``max_trajectories_per_question`` keeps its newest."""
        version = int(state.get("version", -1))
        if version == STATE_VERSION:
            self.pool = _unpack_pool(state["pool"])
        elif version == 1:
            self.pool = {
                uid: [Trajectory(ids.numpy(), lps.numpy()) for ids, lps in trajs] for uid, trajs in state["pool"]
            }
        else:
            raise ValueError(
                f"ExGRPO experience state version {state.get('version')!r}: this build reads 1 and {STATE_VERSION}"
            )
        cap = int(self.knobs.max_trajectories_per_question)
        if cap:
            self.pool = {uid: trajs[-cap:] for uid, trajs in self.pool.items()}
        self.buckets = BucketManager()
        self.buckets.load_state_dict(state["buckets"])
        self.retired = set(state["retired"])
        self.mixed = bool(state["mixed"])
        name, keys, pos, has_gauss, cached = state["np_rng"]
        self.np_rng.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
        version, internal, gauss = state["py_rng"]
        self.py_rng.setstate((version, tuple(internal), gauss))


def _pack_pool(pool: dict[Hashable, list[Trajectory]]) -> dict:
    """The pool as flat tensors (``data.pt`` holds one storage each, not two per trajectory): question ids (plain
    data, insertion order), trajectories per question, then each trajectory's token and log-prob counts and all the
    tokens (int32) and log-probs (float32) concatenated in that order."""
    trajs = [t for v in pool.values() for t in v]

    def cat(arrays, dtype):
        return torch.from_numpy(np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype))

    return {
        "uids": list(pool),
        "counts": torch.tensor([len(v) for v in pool.values()], dtype=torch.int32),
        "id_lengths": torch.tensor([len(t.ids) for t in trajs], dtype=torch.int32),
        "lp_lengths": torch.tensor([len(t.lps) for t in trajs], dtype=torch.int32),
        "token_ids": cat([t.ids for t in trajs], np.int32),
        "log_probs": cat([t.lps for t in trajs], np.float32),
    }


def _unpack_pool(packed: dict) -> dict[Hashable, list[Trajectory]]:
    ids = np.split(packed["token_ids"].numpy(), np.cumsum(packed["id_lengths"].numpy())[:-1])
    lps = np.split(packed["log_probs"].numpy(), np.cumsum(packed["lp_lengths"].numpy())[:-1])
    trajs = [Trajectory(i, lp) for i, lp in zip(ids, lps)] if len(packed["id_lengths"]) else []
    out, at = {}, 0
    for uid, count in zip(packed["uids"], packed["counts"].tolist()):
        out[uid] = trajs[at : at + count]
        at += count
    return out


def recorded_old_log_probs(
    old_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, prefix_mask: torch.Tensor
) -> torch.Tensor:
    """``old_log_probs`` with each replayed row's recorded log-probs (its ``behaviour_log_probs``, NaN outside the
    trace read as 0, the authors' right padding) in place of the actor's, as ExGRPO's ``exp_is_correct=True``."""
    off_rows = prefix_mask.bool().any(-1)
    recorded = torch.nan_to_num(behaviour_log_probs.to(old_log_probs.dtype), nan=0.0) * off_rows.unsqueeze(-1)
    return swap_recorded_log_probs(old_log_probs, recorded, off_rows)
