#!/usr/bin/env bash
# Tiny LUFFY training on CPU in a few minutes: a tiny random Qwen2 learns the synthetic arithmetic task
# from 1 teacher trace + 7 own samples per group, on 2 FSDP ranks (Ray actors), with LUFFY's loss
# settings. Config: luffy_pool/config/tiny_cpu_luffy.yaml (on top of mix_ppo_trainer.yaml).
#
# Usage: bash exp_scripts/quickstart.sh [key=value ...]    e.g. trainer.total_training_steps=3
# Steps: (1) exp_scripts/setup_venv.sh creates .venv when missing (skip with SKIP_SETUP=1);
# (2) the tiny model and task are built into $QUICKSTART_DIR/{model,data} when missing
# (default outputs/quickstart); (3) warm start: LUFFY starts from a pretrained base (Qwen2.5-Math-7B) that
# already writes the answer format and solves some problems; the random tiny model gets that from a short
# SFT (verl/trainer/fsdp_sft_trainer.py) on data/warm.parquet, problems disjoint from train and test
# ($QUICKSTART_WARM_STEPS steps, default 250: ~40 s, the base then solves ~65-85% of problems, so LUFFY's
# on-policy reward has room to rise; 0 starts LUFFY from the random model); (4) the trainer
# runs from the warm model; extra arguments are Hydra overrides, appended last; (5) a short summary
# (exp_scripts/quickstart_summary.py): steps, time, on-policy reward first vs last 10 steps, validation score
# first vs last, and where the metrics file, the plots and the best checkpoint are.
# Signals: each step runs as a child that gets the TERM/INT/HUP this script's own process receives (a container
# whose PID 1 is this bash, `kill -TERM <pid>`, Ctrl-C), so the trainer saves its step and the script exits with
# its code (143 after SIGTERM, 130 after Ctrl-C) without printing the summary.
# LUFFY_VENV [.venv]: the virtual environment whose python runs every step.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${LUFFY_VENV:-.venv}
OUT=$(mkdir -p "${QUICKSTART_DIR:-outputs/quickstart}" && cd "${QUICKSTART_DIR:-outputs/quickstart}" && pwd)

# Run "$@" in its own process group (so a terminal's Ctrl-C reaches it once, through the trap, not twice) and
# forward the signals this script receives; `wait` returns early when a trap runs, so wait again until the child
# has exited and return its exit code. The traps are set before the child starts: a signal that arrives before
# `pid` is known is held and sent as soon as it is (a signal between the fork and the trap lines was lost).
run_forwarding() {
  local pid="" pending="" rc
  trap 'if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; else pending=TERM; fi' TERM
  trap 'if [ -n "$pid" ]; then kill -INT "$pid" 2>/dev/null || true; else pending=INT; fi' INT
  trap 'if [ -n "$pid" ]; then kill -HUP "$pid" 2>/dev/null || true; else pending=HUP; fi' HUP
  set -m
  "$@" </dev/null &
  pid=$!
  set +m
  if [ -n "$pending" ]; then kill -"$pending" "$pid" 2>/dev/null || true; fi
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - TERM INT HUP
  return "$rc"
}

if [ "${SKIP_SETUP:-0}" != "1" ]; then
  bash exp_scripts/setup_venv.sh
fi

# One OpenMP thread per process (docs/CPU_STACK.md §5.3: oversubscribed threads collapse throughput), Ray without
# token auth or usage stats, vLLM's engine in-process.
export OMP_NUM_THREADS=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
export TOKENIZERS_PARALLELISM=false
# Progress bars only on a terminal: in a captured log each refresh joins one ever-growing line.
[ -t 2 ] || export HF_HUB_DISABLE_PROGRESS_BARS=1

if [ ! -f "$OUT/model/config.json" ] || [ ! -f "$OUT/data/train.parquet" ] || [ ! -f "$OUT/data/test.parquet" ] \
    || [ ! -f "$OUT/data/warm.parquet" ]; then
  run_forwarding "$VENV/bin/python" -m luffy_pool.tiny --out "$OUT/model" --data "$OUT/data" --n-warm 2048
fi

WARM_STEPS=${QUICKSTART_WARM_STEPS:-250}
BASE="$OUT/model"
if [ "$WARM_STEPS" -gt 0 ]; then
  BASE="$OUT/warm_sft_$WARM_STEPS/final"
  if [ ! -f "$BASE/config.json" ]; then
    echo "quickstart: warm-starting the tiny model with $WARM_STEPS SFT steps on $OUT/data/warm.parquet -> $BASE"
    run_forwarding env OMP_NUM_THREADS=2 "$VENV/bin/python" -m verl.trainer.fsdp_sft_trainer \
        data.train_files="$OUT/data/warm.parquet" model.path="$OUT/model" data.max_length=160 \
        data.train_batch_size=32 data.micro_batch_size_per_gpu=32 optim.lr=3e-3 \
        trainer.total_training_steps="$WARM_STEPS" trainer.device=cpu "trainer.logger=[jsonl]" \
        trainer.default_local_dir="$OUT/warm_sft_$WARM_STEPS" trainer.experiment_name=quickstart_warm_sft
  fi
fi

# QUICKSTART_PREPARE_ONLY=1: stop here, with the model, the task and the warm model built (exp_scripts/bench_async.py
# builds its default inputs this way).
if [ "${QUICKSTART_PREPARE_ONLY:-0}" = "1" ]; then
  echo "quickstart: inputs ready: model $BASE, data $OUT/data"
  exit 0
fi

# The jsonl tracker writes $OUT/checkpoints/metrics.jsonl for the summary (an override, not a YAML change).
START=$(date +%s)
# The run this script starts writes where the last trainer.default_local_dir override says (Hydra: the last one
# wins), relative to this folder; the summary reads that run's metrics file, and only when this run wrote it.
RUN_DIR="$OUT/checkpoints"
for arg in "$@"; do
  case "$arg" in
    trainer.default_local_dir=*|+trainer.default_local_dir=*|++trainer.default_local_dir=*) RUN_DIR="${arg#*=}" ;;
  esac
done
case "$RUN_DIR" in /*) ;; *) RUN_DIR="$ROOT/$RUN_DIR" ;; esac
STARTED_MARK=$(mktemp "${TMPDIR:-/tmp}/quickstart-start.XXXXXX")
trap 'rm -f "$STARTED_MARK"' EXIT
RC=0
run_forwarding "$VENV/bin/python" -m luffy_pool.main_mix_ppo --config-name tiny_cpu_luffy \
    actor_rollout_ref.model.path="$BASE" \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/test.parquet" \
    trainer.default_local_dir="$OUT/checkpoints" \
    "trainer.logger=[console,jsonl]" \
    "$@" || RC=$?
# A stopped (143/130) or failed run ends here with the trainer's exit code.
[ "$RC" -eq 0 ] || exit "$RC"
WALL=$(( $(date +%s) - START ))
# No summary after a Hydra flag (--cfg job, --help, --info: nothing was trained) or without a metrics file.
for arg in "$@"; do case "$arg" in -*) exit 0 ;; esac; done
if [ -f "$RUN_DIR/metrics.jsonl" ] && [ "$RUN_DIR/metrics.jsonl" -nt "$STARTED_MARK" ]; then
  "$VENV/bin/python" exp_scripts/quickstart_summary.py --run-dir "$RUN_DIR" --wall-s "$WALL"
else
  echo "quickstart: no summary: this run wrote no metrics file in $RUN_DIR (the jsonl logger is off in" \
       "trainer.logger, or the run trained no step)"
fi
