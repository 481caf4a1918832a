"""REVIEW H3: NCCL memory per communicator and how many each rank joins, a fragmentation margin, the workers'
allocator setting, and a driver that opens no CUDA context for the plan's device query."""

from __future__ import annotations

import os


from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.config.sections import ConfigSections
from luffy_pool.memory_plan import estimate
from luffy_pool.memory_plan.estimate import GiB
from luffy_pool.memory_plan.launch_script import script_overrides
from luffy_pool.run.launcher import worker_alloc_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN, TRAIN_16K = (os.path.join(ROOT, "exp_scripts", s) for s in ("train.sh", "train_16k.sh"))


def _config(script, *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    return compose_config(script_overrides(script, list(extra), env=env))


def _nccl_line(plan, phase="rollout (vLLM awake)"):
    return next(ln for ln in plan.phase(phase).lines if ln.what.startswith("NCCL"))


def test_communicators_are_counted_from_the_layout(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    plan = mp.plan_for_config(_config(TRAIN), mp.parse_gpu_memory("80"))  # 8 ranks, vLLM TP 2, SP 1
    assert estimate.nccl_communicators(plan.inputs) == ["world (FSDP)", "rollout TP (weight sync, prompts)"]
    assert _nccl_line(plan).bytes == 2 * 3 * GiB // 2
    plan = mp.plan_for_config(_config(TRAIN_16K), mp.parse_gpu_memory("80"))  # SP 2, TP 2
    assert estimate.nccl_communicators(plan.inputs) == [
        "world (FSDP)",
        "Ulysses SP",
        "rollout TP (weight sync, prompts)",
    ]
    plan = mp.plan_for_config(
        _config(
            TRAIN,
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        ),
        mp.parse_gpu_memory("80"),
    )
    assert estimate.nccl_communicators(plan.inputs) == ["world (FSDP)", "HSDP shard", "HSDP replicate"]
    assert _nccl_line(plan, "update: forward/backward").bytes == 3 * 3 * GiB // 2
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # no NVLink SHARP buffers: the A100-like figure
    plan = mp.plan_for_config(_config(TRAIN), mp.parse_gpu_memory("80"))
    assert _nccl_line(plan).bytes == 2 * 3 * GiB // 4


def test_every_gpu_phase_has_a_fragmentation_margin_over_the_trainer_tensors():
    plan = mp.plan_for_config(_config(TRAIN), mp.parse_gpu_memory("80"))
    for phase in plan.phases:
        margin = [ln for ln in phase.lines if ln.what.startswith("allocator fragmentation margin")]
        assert len(margin) == 1, phase.name
        trainer = sum(ln.bytes for ln in phase.lines[:-1] if not ln.what.startswith(("vLLM", "CUDA", "NCCL")))
        assert margin[0].bytes == int(0.03 * trainer)
    cpu = mp.plan_for_config(_config(TRAIN), None, device="cpu")
    assert not any("fragmentation" in ln.what for p in cpu.phases for ln in p.lines)


def test_workers_get_expandable_segments_unless_the_user_set_the_allocator():
    assert worker_alloc_env("cuda", {}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert worker_alloc_env("cuda", mine) == mine
    assert worker_alloc_env("cpu", {}) == {}


class _NoCuda:
    def __getattr__(self, name):
        raise AssertionError(f"the driver called torch.cuda.{name}")


def test_the_driver_plan_never_touches_torch_cuda(monkeypatch, capsys):
    import ray
    import torch

    asked = []

    class _Task:
        def remote(self):
            asked.append("task")
            return "ref"

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # the launcher joined Ray before check_run
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: int(79.2 * GiB) if ref == "ref" else None)
    monkeypatch.setattr(mp, "_device_total_task", lambda: _Task())
    monkeypatch.setattr(torch, "cuda", _NoCuda())
    plan = mp.check_run(ConfigSections.from_config(_config(TRAIN, "trainer.memory_plan=warn")), "cuda")
    assert asked == ["task"] and plan.device_bytes == int(79.2 * GiB)
    assert "memory plan (luffy_pool.memory_plan" in capsys.readouterr().out


def test_the_device_query_is_a_one_shot_gpu_task():
    opts = mp._device_total_task()._default_options
    assert opts["num_gpus"] == 1 and opts["max_calls"] == 1


def test_split_engines_plan_each_side_without_the_other():
    """train_async.sh: the engines' GPUs hold no actor state, the trainer's no sleeping engine."""
    colocated = mp.plan_for_config(_config(TRAIN), mp.parse_gpu_memory("80"))
    split = mp.plan_for_config(_config(os.path.join(ROOT, "exp_scripts", "train_async.sh")), mp.parse_gpu_memory("80"))
    assert split.inputs.split_engines and split.inputs.world == 4
    rollout = split.phase("rollout (vLLM awake), its own GPUs")
    assert not any(ln.what.startswith(("actor fp32", "AdamW", "ref fp32")) for ln in rollout.lines)
    assert "weight group" in _nccl_line(split, "rollout (vLLM awake), its own GPUs").what
    assert estimate.nccl_communicators(split.inputs) == ["world (FSDP)", "weight group (rank 0 -> engines)"]
    for name in ("log-prob: old (actor)", "update: forward/backward"):
        assert not any(ln.what.startswith("vLLM") for ln in split.phase(name).lines)
    # 0.85 of the engines' own GPU instead of 0.75 of a shared one: a larger KV cache
    assert split.kv_cache_tokens > colocated.kv_cache_tokens
