"""Helpers of exp_scripts/bench_step.py: shared spec and CPU accounting, one module per contender, the report."""
