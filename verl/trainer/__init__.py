"""Trainer package: the driver-side algorithms (advantages, losses, KL) and training entry points."""
