"""H10: the memory plan prints the vLLM KV cache in tokens against the sequences that can be live at once.

train_16k.sh on an 80 GB GPU: up to 256 rollout rows per engine (128 prompts x 8 over 4 TP-2 engines) of
16,384 tokens want 4.2M tokens of KV; the plan's cache holds ~1.7M (REVIEW H10: vLLM preempts and recomputes).
"""

from __future__ import annotations

import os

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.config.sections import ConfigSections
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.launch_script import script_overrides
from luffy_pool.memory_plan.report import kv_demand_line, rollout_rows_per_engine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_16K = os.path.join(ROOT, "exp_scripts", "train_16k.sh")


def _config(*extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    return compose_config(script_overrides(TRAIN_16K, list(extra), env=env))


def _sections(*extra):
    return ConfigSections.from_config(_config(*extra))


def test_rows_per_engine_are_the_steps_rows_over_the_tp_engines():
    assert rollout_rows_per_engine(_sections()) == 128 * 8 // (8 // 2)
    assert rollout_rows_per_engine(_sections("actor_rollout_ref.rollout.tensor_model_parallel_size=1")) == 128 * 8 // 8
    assert rollout_rows_per_engine(_sections("data.train_batch_size=6", "trainer.n_gpus_per_node=4")) == 6 * 8 // 2


def test_train_16k_kv_demand_is_over_the_cache_and_says_what_vllm_does(capsys):
    plan = mp.plan_for_config(_config(), mp.parse_gpu_memory("80"))
    kv = plan.kv_cache_tokens
    assert 1_600_000 < kv < 1_800_000  # REVIEW H10: 1.72M tokens of KV
    assert cli([TRAIN_16K, "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("vLLM KV demand: "))
    assert line == (
        f"vLLM KV demand: 256 live sequences (min(max_num_seqs 1024, 256 rollout rows per engine)) x "
        f"16,384 tokens = {256 * 16384:,} tokens vs {kv:,} in the cache: {256 * 16384 / kv:.1f}x the "
        f"cache: at most {kv // 16384} run at full length, vLLM preempts and recomputes the rest "
        "(slower, not fatal)"
    )


def test_kv_demand_under_the_cache_fits_and_max_num_seqs_caps_the_live_sequences():
    plan = mp.plan_for_config(_config("actor_rollout_ref.rollout.max_num_seqs=64"), mp.parse_gpu_memory("80"))
    line = kv_demand_line(plan, rows_per_engine=256)
    assert line == (
        f"vLLM KV demand: 64 live sequences (min(max_num_seqs 64, 256 rollout rows per engine)) x 16,384 "
        f"tokens = {64 * 16384:,} tokens vs {plan.kv_cache_tokens:,} in the cache: fits"
    )
    assert kv_demand_line(plan).startswith("vLLM KV demand: 64 live sequences (max_num_seqs 64) x")
