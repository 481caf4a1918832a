"""Workers: FSDP actor/ref, rollout engines, sharding managers, reward managers."""
