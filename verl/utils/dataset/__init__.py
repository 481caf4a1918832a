"""Datasets, collation and resumable samplers for the RL trainers."""

from verl.utils.dataset.collate import collate_fn
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.dataset.sampler import ResumableRandomSampler, ResumableSequentialSampler, build_sampler

__all__ = ["RLHFDataset", "ResumableRandomSampler", "ResumableSequentialSampler", "build_sampler", "collate_fn"]
