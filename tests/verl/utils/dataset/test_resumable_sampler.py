"""Resumable samplers: LUFFY's permutation, a new one per epoch, and exact resume (docs/METHOD.md §1.1 item 5)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import DataLoader

from verl.utils.dataset.sampler import ResumableRandomSampler, ResumableSequentialSampler, build_sampler


def _loader(sampler, batch_size, drop_last):
    return DataLoader(
        list(range(sampler.data_len)), batch_size=batch_size, sampler=sampler, drop_last=drop_last, num_workers=0
    )


def _take(loader, count):
    """The trainer's loop: epochs of ``for batch in loader`` until ``count`` batches were consumed."""
    out, empty_epochs = [], 0
    while len(out) < count:
        before = len(out)
        for batch in loader:
            out.append(batch.tolist())
            if len(out) == count:
                break
        empty_epochs += len(out) == before
        assert empty_epochs < 3, "the loader keeps yielding nothing"
    return out


def test_first_epoch_is_luffys_seed_47_permutation():
    sampler = ResumableRandomSampler(10)
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(47)).tolist()
    assert list(sampler) == expected


def test_each_epoch_draws_a_new_permutation():
    sampler = ResumableRandomSampler(12, seed=3)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(12))
    assert first != second and sampler.epoch == 1


def test_sequential_sampler_repeats_in_order():
    sampler = build_sampler(4, shuffle=False)
    assert isinstance(sampler, ResumableSequentialSampler) and not isinstance(sampler, ResumableRandomSampler)
    assert list(sampler) + list(sampler) == [0, 1, 2, 3] * 2


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("data_len, batch_size, drop_last", [(10, 3, True), (9, 3, True), (10, 3, False)])
def test_resume_after_any_step_yields_the_same_batches(shuffle, data_len, batch_size, drop_last):
    total = 11  # > 3 epochs of batches, so resumes land mid-epoch and exactly on epoch boundaries
    reference = _take(_loader(build_sampler(data_len, shuffle, 5, batch_size, drop_last), batch_size, drop_last), total)
    for done in range(total + 1):
        sampler = build_sampler(data_len, shuffle, 5, batch_size, drop_last)
        head = _take(_loader(sampler, batch_size, drop_last), done)
        state = copy.deepcopy(sampler.state_dict())
        resumed = build_sampler(data_len, shuffle, 5, batch_size, drop_last)
        resumed.load_state_dict(state)
        tail = _take(_loader(resumed, batch_size, drop_last), total - done)
        assert head + tail == reference, f"resume after {done} batches diverged"


def test_state_round_trips_through_torch_save(tmp_path):
    sampler = ResumableRandomSampler(7)
    iterator = iter(sampler)
    seen = [next(iterator) for _ in range(3)]
    torch.save(sampler.state_dict(), tmp_path / "sampler_state.pt")
    resumed = ResumableRandomSampler(7)
    resumed.load_state_dict(torch.load(tmp_path / "sampler_state.pt", weights_only=False))
    assert seen + list(resumed) == list(ResumableRandomSampler(7))
    assert resumed.epoch == 0


def test_state_of_another_dataset_size_is_rejected():
    state = ResumableRandomSampler(5).state_dict()
    with pytest.raises(ValueError, match="dataset of 5 rows, this one has 6"):
        ResumableRandomSampler(6).load_state_dict(state)


def test_sequential_state_cannot_be_loaded_into_the_random_sampler():
    with pytest.raises(ValueError, match="generator_state"):
        ResumableRandomSampler(4).load_state_dict(ResumableSequentialSampler(4).state_dict())
