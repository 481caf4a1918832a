"""The driver's training loop (Ray single controller): one step as named stages."""
