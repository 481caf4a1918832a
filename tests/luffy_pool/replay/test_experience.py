"""ExGRPO's driver-side experience pool (luffy_pool/replay/experience.py) and its trainer stages'
tensor work (luffy_pool/methods/exgrpo.py): hand-built groups, no Ray."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from luffy_pool.replay.experience import ExperiencePool, Trajectory, recorded_old_log_probs

EOS, PAD = 2, 0


def knobs(**kw):
    base = dict(
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
        max_trajectories_per_question=0,
    )
    return SimpleNamespace(**{**base, **kw})


def pool(n=4, batch_size=4, dataset_size=100, **kw):
    return ExperiencePool(knobs(**kw), n=n, batch_size=batch_size, dataset_size=dataset_size, success=1.0, seed=7)


def group_batch():
    """Two questions (ids 10, 11), n = 4, width 5: q10 has 2 correct rows (one twice the same tokens, one cut at the
    length limit without EOS), q11 all 4 correct."""
    responses = torch.tensor(
        [
            [5, 6, EOS, PAD, PAD],
            [7, 8, 9, 9, 9],
            [5, 6, EOS, PAD, PAD],
            [3, EOS, PAD, PAD, PAD],
            [4, EOS, PAD, PAD, PAD],
        ]
        + [[4, 4, EOS, PAD, PAD]] * 3
    )
    mask = (torch.arange(5) < torch.tensor([3, 5, 3, 2, 2, 3, 3, 3]).unsqueeze(-1)).long()
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    old = -torch.arange(40, dtype=torch.float32).reshape(8, 5) / 10
    return dict(
        question_ids=[10] * 4 + [11] * 4,
        group_ids=["g0"] * 4 + ["g1"] * 4,
        scores=scores,
        responses=responses,
        response_mask=mask,
        old_log_probs=old,
        eos_token_id=EOS,
    )


def test_warm_up_retires_all_correct_groups_and_collects_nothing():
    p = pool()
    metrics = p.observe(**group_batch())
    assert p.retired == {11} and p.pool == {}
    assert metrics == {
        "exgrpo/collected_groups": 0,
        "exgrpo/added_trajectories": 0,
        "exgrpo/retired_groups": 1,
        "exgrpo/dropped_trajectories": 0,
    }


def test_mixed_phase_collects_partial_groups_with_recorded_log_probs():
    p = pool()
    p.mixed = True
    metrics = p.observe(**group_batch())
    # q10: k = 3 correct of 4 -> stored; rows 0 and 2 are the same tokens (one kept); row 1 has no EOS
    assert metrics["exgrpo/collected_groups"] == 1 and metrics["exgrpo/added_trajectories"] == 2
    first, cut = p.pool[10]
    assert first.token_ids == [5, 6] and first.log_probs == pytest.approx([0.0, -0.1, -0.2])  # tokens ++ EOS
    assert cut.token_ids == [7, 8, 9, 9, 9] and cut.log_probs[:5] == pytest.approx([-0.5, -0.6, -0.7, -0.8, -0.9])
    assert math.isnan(cut.log_probs[5])
    assert p.buckets.uid_to_bucket == {10: 3} and 11 not in p.pool and p.retired == {11}


def test_bounds_decide_collection():
    p = pool(lbound=0, rbound=2)  # k = 3 > rbound: not stored
    p.mixed = True
    p.observe(**group_batch())
    assert p.pool == {}


def test_plan_warm_up_keeps_the_drawn_batch_and_mixed_replaces_half():
    p = pool(batch_size=4)
    assert p.plan([1, 2, 3, 4]).fresh == [0, 1, 2, 3] and p.plan([1, 2, 3, 4]).replay == []
    p.mixed = True
    assert p.plan([1, 2, 3, 4]).replay == []  # empty pool: nothing eligible
    for uid, k in ((20, 1), (21, 2), (22, 3)):
        p.pool[uid] = [Trajectory([5], [-0.1, -0.2])]
        p.buckets.update_bucket(uid, k)
    plan = p.plan([1, 2, 3, 4])
    assert plan.fresh == [0, 1] and len(plan.replay) == 2 and set(plan.replay) <= {20, 21, 22}
    p.retired = {2}  # the retired drawn prompt is passed over (dataset 100 > 4 + 20)
    assert p.plan([1, 2, 3, 4]).fresh == [0, 2]
    small = pool(batch_size=4, dataset_size=24)  # 24 - 1 retired is not > 4 + 20: the authors keep it
    small.retired = {2}
    assert small.plan([1, 2, 3, 4]).fresh == [0, 1, 2, 3]


def test_end_step_cleans_retired_and_switches_strictly_above_the_ratio():
    p = pool(start_solved_ratio=0.5)
    p.pool = {1: [Trajectory([5], [0.0, 0.0])], 2: [Trajectory([6], [0.0, 0.0])]}
    p.buckets.update_bucket(1, 2)
    p.buckets.update_bucket(2, 1)
    p.retired = {2}
    metrics = p.end_step(torch.tensor([1.0, 0.0, 1.0, 0.0]))  # 0.5 is not > 0.5
    assert list(p.pool) == [1] and p.buckets.uid_to_bucket == {1: 2} and not p.mixed
    assert metrics["exgrpo/solved_ratio"] == 0.5 and metrics["exgrpo/bucket/2_count"] == 1
    p.end_step(torch.tensor([1.0, 1.0, 1.0, 0.0]))
    assert p.mixed
    p.end_step(torch.tensor([0.0, 0.0]))
    assert p.mixed, "mixed for good"


def test_state_round_trip_through_the_checkpoint_format_continues_the_same_draws(tmp_path):
    from verl.utils.checkpoint.safe_io import load_state, save_state

    p = pool(batch_size=8)
    p.mixed = True
    for uid, k in ((20, 1), (21, 2), ("q22", 3), (23, 2), (24, 1)):
        p.pool[uid] = [Trajectory([5, uid if isinstance(uid, int) else 9], [-0.25, -0.5, math.nan])]
        p.buckets.update_bucket(uid, k)
    p.retired = {3, "x"}
    p.plan(list(range(8)))  # advance the RNGs
    save_state(str(tmp_path / "s.pt"), {"exgrpo": p.state_dict()})
    q = pool(batch_size=8)
    q.load_state_dict(load_state(str(tmp_path / "s.pt"))["exgrpo"])
    assert list(q.pool) == list(p.pool) and q.retired == p.retired and q.mixed
    assert q.pool[20][0].token_ids == [5, 20] and math.isnan(q.pool[20][0].log_probs[2])
    assert q.buckets.state_dict() == p.buckets.state_dict()
    assert [q.plan(list(range(8))).replay for _ in range(3)] == [p.plan(list(range(8))).replay for _ in range(3)]
    assert q.py_rng.random() == p.py_rng.random()


def test_choose_random_uses_the_pool_rng_and_argmin_the_metric():
    p = pool(traj_metric="random")
    p.pool[1] = [Trajectory([5], [0.0, 0.0]), Trajectory([6], [0.0, 0.0]), Trajectory([7], [0.0, 0.0])]
    expected = __import__("random").Random(7)
    assert [p.choose(1, None) for _ in range(5)] == [expected.randrange(3) for _ in range(5)]
    assert not p.needs_metric(1)
    q = pool()
    q.pool[1] = p.pool[1]
    assert q.needs_metric(1) and q.choose(1, [0.3, 0.1, 0.2]) == 1


def test_recorded_log_probs_replace_the_replayed_rows_only():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    behaviour = torch.tensor([[float("nan")] * 3, [-0.5, -0.25, float("nan")]])
    prefix = torch.tensor([[False] * 3, [True, True, False]])
    out = recorded_old_log_probs(old, behaviour, prefix)
    assert out.tolist() == [[-1.0, -1.0, -1.0], [-0.5, -0.25, 0.0]]


def _driver(replays, pad=PAD):
    from luffy_pool.methods.exgrpo import ExgrpoDriver

    driver = ExgrpoDriver.__new__(ExgrpoDriver)
    driver.trainer = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=pad, eos_token_id=EOS), response_length=6)
    driver.replays = replays
    return driver


def test_attach_puts_each_replayed_trajectory_in_slot_0_with_its_recorded_log_probs():
    from verl.protocol import DataProto

    gen = DataProto.from_dict(tensors={"input_ids": torch.ones(3, 2, dtype=torch.long)})
    ratios = _driver({2: Trajectory([5, 6, 7], [-0.1, -0.2, -0.3, -0.4])}).attach(gen, 3, 4)
    assert ratios.tolist() == [[0.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 0.0]]
    assert gen.batch["tgt_input_ids"].shape == (3, 4, 3) and gen.batch["tgt_input_ids"][2, 0].tolist() == [5, 6, 7]
    assert int(gen.batch["tgt_input_ids"][:2].sum() + gen.batch["tgt_input_ids"][2, 1:].sum()) == 0
    assert gen.batch["behaviour_log_probs"][2, 0].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert torch.isnan(gen.batch["behaviour_log_probs"][:2]).all()
    assert (_driver({}).attach(gen, 3, 4) == np.zeros((3, 4))).all()


@pytest.mark.parametrize("impl", ["paper", "original"])
def test_candidate_rows_for_the_entropy_forward(impl):
    """paper: the full-trace slot the rollout builds (trace ++ EOS after the prompt); original: the authors' frame
    (prompt ++ trajectory ++ EOS left-padded, the last L positions as the 'response', the right-padded trajectory
    ++ EOS as mask source). Candidates of two prompts in one batch."""
    from verl.protocol import DataProto

    driver = _driver({})
    driver.knobs = knobs(metric_impl=impl)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([[PAD, 8, 9], [7, 7, 7]]),
            "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
            "position_ids": torch.tensor([[0, 0, 1], [0, 1, 2]]),
        }
    )
    candidates = [
        (0, Trajectory([5, 6], [0.0] * 3)),
        (0, Trajectory([5, 6, 7, 3], [0.0] * 5)),
        (1, Trajectory([4], [0.0] * 2)),
    ]
    tensors, mask = driver._candidates(batch, candidates)
    if impl == "paper":
        assert tensors["responses"].tolist() == [
            [5, 6, EOS, PAD, PAD, PAD],
            [5, 6, 7, 3, EOS, PAD],
            [4, EOS, PAD, PAD, PAD, PAD],
        ]
        assert mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]]
        assert tensors["input_ids"][:, :3].tolist() == [[PAD, 8, 9], [PAD, 8, 9], [7, 7, 7]]
        assert tensors["position_ids"][1].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7]
    else:
        assert tensors["input_ids"].tolist() == [
            [PAD] * 4 + [8, 9, 5, 6, EOS],
            [PAD] * 2 + [8, 9, 5, 6, 7, 3, EOS],
            [PAD] * 4 + [7, 7, 7, 4, EOS],
        ]
        assert tensors["responses"].tolist() == [[PAD, 8, 9, 5, 6, EOS], [9, 5, 6, 7, 3, EOS], [PAD, 7, 7, 7, 4, EOS]]
        assert mask.tolist() == [[5, 6, EOS, PAD, PAD, PAD], [5, 6, 7, 3, EOS, PAD], [4, EOS, PAD, PAD, PAD, PAD]]
        assert tensors["position_ids"][0].tolist()[-5:] == [0, 1, 2, 3, 4]
