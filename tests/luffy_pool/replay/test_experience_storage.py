"""How ExGRPO's experience pool stores trajectories (luffy_pool/replay/experience.py): int32 / float32 arrays, the
per-question cap ``algorithm.exgrpo.max_trajectories_per_question``, the flat version-2 checkpoint state and the
version-1 one it still reads."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from luffy_pool.replay.experience import ExperiencePool, Trajectory

EOS, PAD = 2, 0


def pool(cap=0, **kw):
    knobs = dict(
        start_solved_ratio=0.35,
        experience_ratio=0.5,
        lbound=0,
        rbound=3,
        bucket_weighting="normal",
        traj_metric="ent",
        traj_select="argmin",
        sample_range="all",
        is_correct=True,
        metric_impl="paper",
        retire_all_correct=True,
        max_trajectories_per_question=cap,
    )
    p = ExperiencePool(SimpleNamespace(**{**knobs, **kw}), n=4, batch_size=4, dataset_size=100, success=1.0, seed=7)
    p.mixed = True
    return p


def group(rows, question=10, correct=3):
    """One group of 4 rows of question ``question``: the first ``correct`` rows correct; ``rows`` their tokens
    (EOS-ended unless cut), right-padded to 5; old log-probs -(row * 5 + position) / 8 (exact in float32)."""
    responses = torch.full((4, 5), PAD, dtype=torch.long)
    mask = torch.zeros((4, 5), dtype=torch.long)
    for r, tokens in enumerate(rows):
        responses[r, : len(tokens)] = torch.tensor(tokens)
        mask[r, : len(tokens)] = 1
    old = -torch.arange(20, dtype=torch.float32).reshape(4, 5) / 8
    scores = torch.tensor([1.0] * correct + [0.0] * (4 - correct))
    return dict(
        question_ids=[question] * 4,
        group_ids=[f"g{question}"] * 4,
        scores=scores,
        responses=responses,
        response_mask=mask,
        old_log_probs=old,
        eos_token_id=EOS,
    )


def test_trajectories_are_int32_ids_and_float32_log_probs_with_the_same_values():
    p = pool()
    p.observe(**group([[5, 6, EOS], [70000, 8, 9, 9, 9], [4, EOS], [3, EOS]]))
    first, cut, short = p.pool[10]
    assert first.ids.dtype == np.int32 and first.lps.dtype == np.float32
    assert first.token_ids == [5, 6] and first.log_probs == [0.0, -0.125, -0.25]  # tokens ++ EOS
    assert cut.token_ids == [70000, 8, 9, 9, 9] and cut.log_probs[:5] == [-0.625, -0.75, -0.875, -1.0, -1.125]
    assert math.isnan(cut.log_probs[5])  # cut at the length limit: no EOS sampled
    assert short.token_ids == [4] and first.nbytes == 2 * 4 + 3 * 4
    assert Trajectory([5, 6], [0.0, -0.125, -0.25]) == first and Trajectory([5, 7], [0.0, -0.125, -0.25]) != first
    # the arrays own their memory: a trajectory never keeps the step's [rows, width] tensors alive
    assert first.ids.base is None and first.lps.base is None


def test_the_cap_keeps_each_questions_newest_trajectories():
    p = pool(cap=2)
    metrics = p.observe(**group([[5, EOS], [6, EOS], [7, EOS]]))
    assert [t.token_ids for t in p.pool[10]] == [[6], [7]]
    assert metrics["exgrpo/added_trajectories"] == 3 and metrics["exgrpo/dropped_trajectories"] == 1
    p.observe(**group([[6, EOS], [8, EOS]], correct=2))  # [6] is stored already; [8] comes in, [6] leaves
    assert [t.token_ids for t in p.pool[10]] == [[7], [8]]
    unbounded = pool(cap=0)
    unbounded.observe(**group([[5, EOS], [6, EOS], [7, EOS]]))
    assert len(unbounded.pool[10]) == 3


def _filled(cap=0):
    p = pool(cap=cap)
    p.observe(**group([[5, 6, EOS], [70000, 8, 9, 9, 9], [4, EOS]], question=10))
    p.observe(**group([[3, EOS], [3, 3, EOS]], question="q11", correct=2))
    return p


def test_the_checkpoint_state_is_four_flat_tensors_and_round_trips(tmp_path):
    from verl.utils.checkpoint.safe_io import load_state, save_state

    p = _filled()
    packed = p.state_dict()["pool"]
    assert packed["uids"] == [10, "q11"] and packed["counts"].tolist() == [3, 2]
    assert packed["id_lengths"].tolist() == [2, 5, 1, 1, 2] and packed["lp_lengths"].tolist() == [3, 6, 2, 2, 3]
    assert packed["token_ids"].dtype == torch.int32 and packed["log_probs"].dtype == torch.float32
    assert packed["token_ids"].tolist() == [5, 6, 70000, 8, 9, 9, 9, 4, 3, 3, 3]
    save_state(str(tmp_path / "data.pt"), {"exgrpo": p.state_dict()})
    q = pool()
    q.load_state_dict(load_state(str(tmp_path / "data.pt"))["exgrpo"])
    assert list(q.pool) == [10, "q11"] and all(q.pool[u] == p.pool[u] for u in p.pool)  # NaN compared as equal
    empty = pool()
    empty.load_state_dict(pool().state_dict())
    assert empty.pool == {}


def _version_1(p) -> dict:
    """The state the previous code wrote: an int64 and a float64 tensor per trajectory."""
    state = p.state_dict()
    state["version"] = 1
    state["pool"] = [
        (
            uid,
            [
                (torch.tensor(t.token_ids, dtype=torch.long), torch.tensor(t.log_probs, dtype=torch.float64))
                for t in trajs
            ],
        )
        for uid, trajs in p.pool.items()
    ]
    return state


def test_a_version_1_checkpoint_loads_and_is_cut_to_the_cap(tmp_path):
    from verl.utils.checkpoint.safe_io import load_state, save_state

    p = _filled()
    save_state(str(tmp_path / "old.pt"), {"exgrpo": _version_1(p)})
    q = pool()
    q.load_state_dict(load_state(str(tmp_path / "old.pt"))["exgrpo"])
    assert all(q.pool[u] == p.pool[u] for u in p.pool) and q.pool[10][0].ids.dtype == np.int32
    capped = pool(cap=1)
    capped.load_state_dict(load_state(str(tmp_path / "old.pt"))["exgrpo"])
    assert [t.token_ids for t in capped.pool[10]] == [[4]] and [t.token_ids for t in capped.pool["q11"]] == [[3, 3]]
    state = p.state_dict()
    state["version"] = 7
    with pytest.raises(ValueError, match=r"^ExGRPO experience state version 7: this build reads 1 and 2$"):
        pool().load_state_dict(state)


def test_data_pt_is_about_half_of_the_version_1_size(tmp_path):
    from verl.utils.checkpoint.safe_io import save_state

    p = pool()
    rng = np.random.default_rng(0)
    for q in range(20):  # 20 questions x 5 trajectories x 1,000 tokens
        p.pool[q] = [Trajectory(rng.integers(3, 150000, 1000), -rng.random(1001)) for _ in range(5)]
    save_state(str(tmp_path / "v1.pt"), {"exgrpo": _version_1(p)})
    save_state(str(tmp_path / "v2.pt"), {"exgrpo": p.state_dict()})
    v1, v2 = os.path.getsize(tmp_path / "v1.pt"), os.path.getsize(tmp_path / "v2.pt")
    assert v1 > 100 * (8 * 1000 + 8 * 1001)  # 8 + 8 bytes per token and log-prob, plus a header per tensor
    assert 100 * (4 * 1000 + 4 * 1001) < v2 < 0.52 * v1


def test_the_cap_is_a_checked_config_key():
    from luffy_pool.config.check import ConfigError, check_config
    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.method_group import apply_method

    base = ["actor_rollout_ref.model.path=m", "data.train_files=x", "data.val_files=y", "algorithm.method=exgrpo"]
    config = compose_config(base)
    apply_method(config)  # the method's YAML group (luffy_pool/config/method/exgrpo.yaml) holds the knob's default
    assert config.algorithm.exgrpo.max_trajectories_per_question == 8
    with pytest.raises(ConfigError, match="algorithm.exgrpo.max_trajectories_per_question"):
        check_config(compose_config(base + ["algorithm.exgrpo.max_trajectories_per_question=-1"]))
