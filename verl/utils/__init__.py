"""Shared helpers for the trainer: tensor math, sequence balancing, datasets, checkpoints, logging."""
