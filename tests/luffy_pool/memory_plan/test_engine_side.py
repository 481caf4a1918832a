"""vLLM's own TP communicator outside ``gpu_memory_utilization`` in every phase of the engine's GPU, and the split
engine's weight-receive transient (luffy_pool/memory_plan/engine_side.py)."""

from __future__ import annotations

import math
import os

import pytest

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.engine_side import receive_transient, symm_mem_bytes
from luffy_pool.memory_plan.estimate import GiB
from luffy_pool.memory_plan.launch_script import script_overrides
from luffy_pool.memory_plan.shapes import model_shape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN, ASYNC = (os.path.join(ROOT, "exp_scripts", s) for s in ("train.sh", "train_async.sh"))
MiB = 2**20
VLLM_TP = "NCCL, vLLM's TP communicator"


@pytest.fixture(autouse=True)
def _h100_defaults(monkeypatch):
    for name in ("NCCL_NVLS_ENABLE", "VLLM_ALLREDUCE_USE_SYMM_MEM"):
        monkeypatch.delenv(name, raising=False)


def _plan(script, *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    return mp.plan_for_config(compose_config(script_overrides(script, list(extra), env=env)), mp.parse_gpu_memory("80"))


def _tp_lines(phase):
    return [ln for ln in phase.lines if ln.what.startswith(VLLM_TP)]


def test_the_colocated_engines_communicator_is_a_line_of_every_phase():
    plan = _plan(TRAIN)  # vLLM TP 2 on H100: 1.5 GiB of NCCL + vLLM's 64 MiB symmetric-memory all-reduce buffer
    for phase in plan.phases:
        (line,) = _tp_lines(phase)
        assert line.bytes == 3 * GiB // 2 + 64 * MiB, phase.name
        assert "outside gpu_memory_utilization" in line.what and "64 MiB symmetric memory" in line.what
        assert line.key == "actor_rollout_ref.rollout.tensor_model_parallel_size"
    # it is not one of the engine's lines: those still add up to util x total (vllm/v1/worker/utils.py)
    rollout = plan.phase("rollout (vLLM awake)")
    engine = sum(ln.bytes for ln in rollout.lines if ln.what.startswith("vLLM"))
    assert engine == math.ceil(int(79.2 * GiB) * 0.73)
    # nor of the trainer's tensors the fragmentation margin covers
    margin = next(ln for ln in rollout.lines if ln.what.startswith("allocator fragmentation"))
    torch_bytes = sum(ln.bytes for ln in rollout.lines[:-1] if not ln.what.startswith(("vLLM", "CUDA", "NCCL")))
    assert margin.bytes == int(0.03 * torch_bytes)


def test_its_size_follows_the_environment_and_tp_1_has_none(monkeypatch):
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    assert _tp_lines(_plan(TRAIN).phases[0])[0].bytes == 3 * GiB // 2
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    assert _tp_lines(_plan(TRAIN).phases[0])[0].bytes == 3 * GiB // 4
    monkeypatch.delenv("VLLM_ALLREDUCE_USE_SYMM_MEM")
    assert symm_mem_bytes(4) == 32 * MiB and symm_mem_bytes(8) == 64 * MiB and symm_mem_bytes(1) == 0
    plan = _plan(TRAIN, "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    assert not [ln for p in plan.phases for ln in _tp_lines(p)]


def test_split_engines_carry_it_on_the_engines_gpus_only():
    plan = _plan(ASYNC)
    assert plan.inputs.split_engines and plan.inputs.tp == 2
    assert _tp_lines(plan.phase("rollout (vLLM awake), its own GPUs"))[0].bytes == 3 * GiB // 2 + 64 * MiB
    for phase in plan.phases[1:]:
        assert not _tp_lines(phase), phase.name


def test_vllm_start_check_counts_the_communicator_as_taken():
    # 79.2 GiB - 3.55 GiB of actor fp32 shards - 1 GiB CUDA context - 1.56 GiB communicator = 73.09 GiB free at the
    # engine's start: 0.93 x 79.2 = 73.66 GiB is refused, where without the communicator 74.65 GiB would pass.
    plan = _plan(TRAIN, "actor_rollout_ref.rollout.gpu_memory_utilization=0.93")
    (note,) = [n for n in plan.notes if n.startswith("vLLM start")]
    assert "73.1 GiB free" in note and "73.7 GiB" in note


def test_split_receive_transient_for_a_152k_vocabulary_7b():
    shape = model_shape("Qwen/Qwen2.5-Math-7B")
    e = 152064 * 3584 * 2  # the embedding in bf16: 1,089,994,752 B, a tensor larger than the 256 MiB bucket
    bucket = 256 * MiB
    nbytes, what = receive_transient(shape, 2, 2, 2, bucket)
    # moment 1: its flat buffer + its clone + the next bucket's buffer (2.28 GiB); moment 2 (its clone + its TP-2
    # vocab shard + a bucket's buffer and clones) is 2,171,863,040 B; a decoder layer's 1,138,777,088 B
    assert nbytes == 2 * e + bucket == 2_448_424_960
    assert what == "weight receive (split engine): largest tensor's buffer + clone + next bucket"
    line = next(
        ln
        for ln in _plan(ASYNC).phase("rollout (vLLM awake), its own GPUs").lines
        if ln.what.startswith("weight receive")
    )
    assert line.bytes == 2_448_424_960 and line.key == "actor_rollout_ref.rollout.weight_sync_bucket_mb"
    # a bucket larger than the embedding: two buckets (buffer and clones) + the embedding's clone and shard win
    nbytes, what = receive_transient(shape, 2, 2, 2, 2 * e)
    assert nbytes == max(2 * e + 2 * e, e + e // 2 + 4 * e) == 5 * e + e // 2 and "clone + vLLM shard" in what


def test_cli_shows_the_communicator_line(capsys):
    assert cli([TRAIN, "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(VLLM_TP)]
    assert len(lines) == 4 and all(ln.split()[-2] == "1.56" for ln in lines)  # rollout, old log-prob, update x 2
