#!/usr/bin/env bash
# Create/reuse .venv in the repo root, then run the test suite. Extra args go to pytest
# (e.g. `bash tests/run.sh -m "not e2e"` for the quick loop).
# Two pytest-xdist workers, one test file each at a time (--dist loadfile: a module's fixtures, e.g. the shared
# rehearsal pool, are built once): the 2 cores stay busy while one test waits on a start-up or a collective.
# LUFFY_TEST_WORKERS=0 runs in one process; a later -n in the arguments wins.
set -euo pipefail
cd "$(dirname "$0")/.."
bash exp_scripts/setup_venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
# The suite's speed-ups live outside the product, in dev/luffy_pool_dev (installed by setup_venv.sh), switched on here
# through generic seams: verl's per-actor runtime_env hook (each rank imports its class with the collector paused and,
# with LUFFY_FORK_WORKERS=1, is forked from a process that imported its modules once per node and environment: a
# rank's imports are 6-14 CPU-s and the suite starts ~130 of them; LUFFY_FORK_WORKERS=0 starts each as Ray does), and
# vLLM's general plugin for the CPU engines (LUFFY_DEV_SPEEDUPS=1). tests/conftest.py sets the same defaults.
export VERL_ACTOR_RUNTIME_ENV_HOOK=${VERL_ACTOR_RUNTIME_ENV_HOOK-luffy_pool_dev.fork_workers:actor_runtime_env}
export LUFFY_FORK_WORKERS=${LUFFY_FORK_WORKERS:-1} LUFFY_DEV_SPEEDUPS=${LUFFY_DEV_SPEEDUPS:-1}
# Byte-compile the project once: with PYTHONDONTWRITEBYTECODE set (as on these machines) every process of the suite
# (Ray workers, drivers, graders: hundreds) would otherwise compile the modules it imports again (~0.4 CPU-s each).
.venv/bin/python -m compileall -q -j 0 verl luffy_pool deepscaler dev exp_scripts eval_scripts > /dev/null || true
exec .venv/bin/python -m pytest -n "${LUFFY_TEST_WORKERS:-2}" --dist loadfile "$@"
