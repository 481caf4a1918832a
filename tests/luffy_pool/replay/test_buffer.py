"""SelfReplayBuffer: insert, per-prompt and global eviction, age limit, seeded choices, pickle-free save/load."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from luffy_pool.replay.buffer import INDEX_FILE, TENSOR_FILE, SelfReplayBuffer


def _lps(k, base=-0.5):
    return [base - 0.01 * i for i in range(k + 1)]


def _snapshot(buf: SelfReplayBuffer) -> list:
    return [
        (key, e.token_ids, [None if math.isnan(v) else v for v in e.logprobs], e.step)
        for key, entries in buf._entries.items()
        for e in entries
    ]


def test_insert_keeps_tokens_logprobs_and_step_and_adds_unknown_eos():
    buf = SelfReplayBuffer(capacity=10, max_per_prompt=2)
    buf.insert(7, [5, 6, 7], [-0.1, -0.2, -0.3, -0.05], step=3)
    buf.insert("p", [9], [-1.0], step=4)  # no EOS log-prob given -> NaN for it
    assert len(buf) == 2 and buf.num_prompts == 2
    (e,) = buf.entries(7)
    assert (e.token_ids, e.logprobs, e.step) == ([5, 6, 7], [-0.1, -0.2, -0.3, -0.05], 3)
    (f,) = buf.entries("p")
    assert f.logprobs[0] == -1.0 and math.isnan(f.logprobs[1])
    assert buf.entries(7.0)[0] is not None  # prompt ids normalise like the pool's (7.0 -> 7)
    trace = e.as_trace(7)
    assert trace.token_ids == [5, 6, 7] and trace.source == "replay:7@3"


def test_insert_rejects_bad_input_with_the_prompt_named():
    buf = SelfReplayBuffer()
    with pytest.raises(ValueError, match="empty response for prompt 3"):
        buf.insert(3, [], None, step=1)
    with pytest.raises(ValueError, match="5 log-probs for 2 tokens of prompt 3"):
        buf.insert(3, [1, 2], [-1.0] * 5, step=1)
    with pytest.raises(ValueError, match="data.self_replay.eviction"):
        SelfReplayBuffer(eviction="lru")
    with pytest.raises(ValueError, match="data.self_replay.capacity"):
        SelfReplayBuffer(capacity=0)


def test_same_trace_again_refreshes_instead_of_duplicating():
    buf = SelfReplayBuffer(max_per_prompt=3)
    buf.insert(1, [4, 4], _lps(2), step=1)
    buf.insert(1, [5], _lps(1), step=2)
    buf.insert(1, [4, 4], _lps(2, base=-0.2), step=6)
    assert [(e.token_ids, e.step) for e in buf.entries(1)] == [([5], 2), ([4, 4], 6)]
    assert buf.entries(1)[1].logprobs[0] == -0.2


def test_per_prompt_eviction_drops_the_oldest():
    buf = SelfReplayBuffer(max_per_prompt=2, eviction="oldest")
    assert buf.insert(1, [10], _lps(1), step=1) == 0
    assert buf.insert(1, [11], _lps(1), step=2) == 0
    assert buf.insert(1, [12], _lps(1), step=3) == 1
    assert [e.token_ids for e in buf.entries(1)] == [[11], [12]]


def test_global_capacity_evicts_the_oldest_over_all_prompts():
    buf = SelfReplayBuffer(capacity=3, max_per_prompt=5, eviction="oldest")
    buf.insert("a", [1], _lps(1), step=2)
    buf.insert("b", [2], _lps(1), step=1)
    buf.insert("a", [3], _lps(1), step=3)
    assert buf.insert("c", [4], _lps(1), step=4) == 1  # drops b's step-1 trace: the oldest anywhere
    assert len(buf) == 3 and buf.entries("b") == [] and buf.num_prompts == 2
    assert [e.token_ids for e in buf.entries("a")] == [[1], [3]]


def test_age_limit_hides_and_expire_drops_old_traces():
    buf = SelfReplayBuffer(max_per_prompt=3, max_age=2)
    buf.insert(1, [1], _lps(1), step=1)
    buf.insert(1, [2], _lps(1), step=3)
    assert buf.sample(1, step=3).token_ids == [2]
    assert buf.sample(1, step=5).token_ids == [2]  # age 2: still allowed
    assert buf.sample(1, step=6) is None  # age 3 > max_age
    assert buf.mean_age(4) == pytest.approx((3 + 1) / 2)
    assert buf.expire(4) == 1 and [e.token_ids for e in buf.entries(1)] == [[2]]
    assert buf.expire(10) == 1 and len(buf) == 0 and buf.num_prompts == 0
    unlimited = SelfReplayBuffer(max_age=-1)
    unlimited.insert(1, [1], _lps(1), step=1)
    assert unlimited.expire(1000) == 0 and unlimited.sample(1, 1000) is not None


def test_latest_selection_and_unknown_prompt():
    buf = SelfReplayBuffer(max_per_prompt=3, selection="latest")
    buf.insert(1, [1], _lps(1), step=4)
    buf.insert(1, [2], _lps(1), step=2)
    assert buf.sample(1, step=5).token_ids == [1]
    assert buf.sample(99, step=5) is None


def _random_buffer(seed: int) -> SelfReplayBuffer:
    buf = SelfReplayBuffer(capacity=6, max_per_prompt=3, eviction="random", selection="random", seed=seed)
    for step in range(1, 9):
        for p in range(3):
            buf.insert(p, [step, p, 1], _lps(3), step=step)
    return buf


def test_random_eviction_and_selection_are_determined_by_the_seed():
    a, b = _random_buffer(0), _random_buffer(0)
    assert _snapshot(a) == _snapshot(b) and len(a) == 6
    picks_a = [a.sample(p, 9).token_ids for p in range(3) if a.entries(p)]
    picks_b = [b.sample(p, 9).token_ids for p in range(3) if b.entries(p)]
    assert picks_a == picks_b
    snapshots = {str(_snapshot(_random_buffer(s))) for s in range(6)}
    assert len(snapshots) > 1  # the seed matters: not one fixed order


def test_save_load_round_trip_is_pickle_free(tmp_path):
    buf = _random_buffer(3)
    buf.insert("str-id", [1, 2], [-0.3, float("nan"), -0.1], step=9)
    paths = buf.save(str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == sorted([INDEX_FILE, TENSOR_FILE])
    with open(tmp_path / INDEX_FILE) as f:
        index = json.load(f)  # plain JSON
    assert index["settings"]["eviction"] == "random" and len(index["index"]) == len(buf)
    restored = SelfReplayBuffer(capacity=6, max_per_prompt=3, eviction="random", selection="random", seed=3)
    restored.load(str(tmp_path))
    assert _snapshot(restored) == _snapshot(buf)
    # The restored buffer continues exactly like the original one.
    for target in (buf, restored):
        target.insert(1, [77], _lps(1), step=10)
    assert _snapshot(restored) == _snapshot(buf)


def test_load_reports_missing_and_inconsistent_files(tmp_path):
    buf = SelfReplayBuffer()
    with pytest.raises(FileNotFoundError, match=INDEX_FILE):
        buf.load(str(tmp_path))
    buf.insert(1, [1, 2], _lps(2), step=1)
    state = buf.state_dict()
    state["index"][0]["num_tokens"] = 5
    with pytest.raises(ValueError, match="index row 0"):
        SelfReplayBuffer().load_state_dict(state)
    state = buf.state_dict()
    state["token_ids"] = torch.cat([state["token_ids"], torch.tensor([3])])
    with pytest.raises(ValueError, match="more values"):
        SelfReplayBuffer().load_state_dict(state)
