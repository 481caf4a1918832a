"""Self-replay: the run's own correct rollouts kept in a buffer and replayed into failed groups."""
