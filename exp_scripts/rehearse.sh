#!/usr/bin/env bash
# Rehearse a shipped launch script on CPU for 2 steps with every switch it sets (luffy_pool/run/rehearse.py):
# only the model (tiny random model of the same family, heads divisible by SP and TP), the data (tiny task),
# lengths / token budgets (one factor), the device (cpu, gloo, sdpa), the world (4 ranks or SP x TP) and
# the trackers (offline) are replaced, and the rehearsal prints that list before the script runs, with a WARNING
# line for each switch of the script the CPU turns off (graphs, remove padding, flash-attn, bf16, sleep/wake).
#
# Usage: bash exp_scripts/rehearse.sh exp_scripts/train_16k.sh [--work DIR] [--dry-run] [key=value ...]
#          [--cache DIR]        keep the tiny models / task data in DIR between rehearsals (built once per spec)
#          [--ray-address ADDR] an RL script joins this running Ray (RAY_ADDRESS) instead of starting its own
# Uses $LUFFY_VENV (default .venv) for Python. Exit code: the launch script's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${LUFFY_VENV:-$ROOT/.venv}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# The CPU speed-ups of the test suite, outside the product (dev/luffy_pool_dev, installed by setup_venv.sh): ranks
# import their class with the collector paused (LUFFY_FORK_WORKERS=1 also forks them from one process that imported
# their modules) and CPU engines run the vLLM plugin's speed-ups. A venv without the package rehearses without them.
if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('luffy_pool_dev') is None)"; then
  export VERL_ACTOR_RUNTIME_ENV_HOOK=${VERL_ACTOR_RUNTIME_ENV_HOOK-luffy_pool_dev.fork_workers:actor_runtime_env}
  export LUFFY_DEV_SPEEDUPS=${LUFFY_DEV_SPEEDUPS:-1}
fi
exec "$VENV/bin/python" -m luffy_pool.run.rehearse "$@"
