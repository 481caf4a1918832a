#!/usr/bin/env bash
# Create/reuse .venv in the repo root, then run the test suite. Extra args go to pytest
# (e.g. `bash tests/run.sh -m "not e2e"` for the quick loop).
set -euo pipefail
cd "$(dirname "$0")/.."
bash exp_scripts/setup_venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
exec .venv/bin/python -m pytest "$@"
