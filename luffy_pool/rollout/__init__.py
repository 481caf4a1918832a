"""The off-policy pool and the slot plan: which group slots get an off-policy prefix, and the dataset rows."""
