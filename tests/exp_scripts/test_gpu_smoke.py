"""exp_scripts/gpu_smoke.py at CI size (``--device cpu --small``): the GPU smoke script's own code path, on CPU.

The same script runs on one GPU with Qwen2.5-1.5B shapes in bf16; here its checks (weights changed,
engine weights equal the actor's after the sync, the sync in the parameter dtype, gradient
checkpointing on, the expected backend and device) must pass for the HF engine and vLLM-CPU.
"""
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.vllm
def test_gpu_smoke_small_on_cpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "exp_scripts", "gpu_smoke.py"), "--device", "cpu",
                           "--small", "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600,
                          cwd=str(tmp_path))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("GPU_SMOKE ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(lines[-1][len("GPU_SMOKE "):])
    assert summary["ok"] and [r["engine"] for r in summary["results"]] == ["hf", "vllm"]
    for r in summary["results"]:
        assert set(r["checks"]) == {"weights_changed", "engine_equals_actor", "sync_in_param_dtype",
                                    "gradient_checkpointing", "backend", "device"}
        assert all(r["checks"].values()), r
        assert len(r["steps"]) == 2 and all(s["engine_tokens_per_s"] > 0 for s in r["steps"])
        assert r["sync_dtypes"] == ["torch.float32"] and r["peak_memory_gb"] > 0


@pytest.mark.vllm
def test_gpu_smoke_recipe_train_sh_small_on_cpu(tmp_path):
    """``--recipe exp_scripts/train.sh``: the recipe's switches (read by luffy_pool/run/recipe.py, as the rehearsal
    reads them) run in the real worker: checkpointing, padding removal rule, dynamic batches, the reference
    with its offload, the parameter dtype, and the recipe's engine (vLLM) only."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "exp_scripts", "gpu_smoke.py"), "--device", "cpu",
                           "--small", "--recipe", os.path.join(REPO_ROOT, "exp_scripts", "train.sh"),
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600,
                          cwd=str(tmp_path))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("GPU_SMOKE ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(lines[-1][len("GPU_SMOKE "):])
    assert summary["ok"] and [r["engine"] for r in summary["results"]] == ["vllm"]
    r = summary["results"][0]
    assert {"recipe_remove_padding", "recipe_dynamic_bsz", "recipe_ref_offload", "recipe_param_dtype",
            "gradient_checkpointing"} <= set(r["checks"]) and all(r["checks"].values()), r
    sw = r["recipe"]
    assert sw["gradient_checkpointing"] and sw["dynamic_bsz"] and sw["ref_param_offload"] and sw["remove_padding"]
    assert sw["token_factor"] > 1 and sw["tp"] == 2  # budgets scaled by one factor; TP printed, not run on 1 device
    # H8: the recipe's rollout keys, carried and read back from the built engine (budgets only on CPU)
    keys = sw["rollout_keys"]
    assert keys["gpu_memory_utilization"] == 0.75 and keys["sleep_level"] == 2 and not keys["enforce_eager"]
    assert keys["max_num_batched_tokens"] == 8192 // sw["token_factor"] and r["checks"]["recipe_rollout_keys"]
    assert any(s["kl_to_ref"] > 0 for s in r["steps"])  # the reference pass ran (its KL to the trained actor)


def test_graphs_measurement_on_cpu_says_graphs_are_a_gpu_feature(capsys):
    """``graphs_vs_eager`` on cpu builds no engine: it prints why there is no eager/graphs ratio and passes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", os.path.join(REPO_ROOT, "exp_scripts", "gpu_smoke.py"))
    gpu_smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_smoke)
    result = gpu_smoke.graphs_vs_eager("no-model-needed", "cpu")
    out = capsys.readouterr().out
    assert result == {"ok": True, "skipped": gpu_smoke.GRAPHS_ON_CPU}
    assert "CUDA graphs are a GPU feature" in out and "no eager/graphs ratio on cpu" in out


def _gpu_smoke_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", os.path.join(REPO_ROOT, "exp_scripts", "gpu_smoke.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sp_tp_runs_on_the_gpus_that_hold_the_recipes_layout_and_is_skipped_without_them(monkeypatch):
    """H8: ``--recipe`` runs the recipe's SP x TP when the GPU count allows (train.sh: vLLM TP 2; train_16k.sh:
    SP 2 x TP 2): two DP groups when there are 4 GPUs, one on 2, none on 1."""
    smoke = _gpu_smoke_module()
    assert [smoke.sp_tp_ranks(2, 2, n) for n in (1, 2, 3, 4, 8)] == [0, 2, 2, 4, 4]
    assert [smoke.sp_tp_ranks(1, 2, n) for n in (1, 2, 8)] == [0, 2, 4]
    assert smoke.sp_tp_ranks(1, 1, 8) == 0  # nothing parallel to check beyond the one-GPU smoke
    assert smoke.run_sp_tp("train_16k.sh", 2, 2, 1, "/nonexistent") == {"skipped": "SP 2 x TP 2 needs 2 GPUs, 1 seen"}
    calls = []

    class Done:
        returncode, stdout, stderr = 0, "step:1 - a:1\nstep:2 - a:2\nREHEARSAL {}\n", ""

    monkeypatch.setattr("subprocess.run", lambda cmd, **kw: calls.append(cmd) or Done())
    assert smoke.run_sp_tp("exp_scripts/train_16k.sh", 2, 2, 8, "/w") == {"ranks": 4, "rc": 0, "steps": [1, 2]}
    assert calls[0][-7:] == ["exp_scripts/train_16k.sh", "--device", "cuda", "--ranks", "4", "--work", "/w"]


def test_rehearsal_plan_on_cuda_keeps_every_switch_and_the_recipes_attention(tmp_path):
    from luffy_pool.run.recipe import read_recipe
    from luffy_pool.run.rehearse import plan

    recipe = read_recipe(os.path.join(REPO_ROOT, "exp_scripts", "train_16k.sh"), dict(os.environ, MODEL_PATH="org/m"))
    env, overrides, report = plan(recipe, str(tmp_path), ranks=4, device="cuda")
    assert "trainer.device=cuda" in overrides and "trainer.n_gpus_per_node=4" in overrides
    assert not any("attn_implementation" in o for o in overrides) and report["gpu_only"] == {}
    assert "OMP_NUM_THREADS" not in env and env["WANDB_MODE"] == "offline" and report["device"].startswith("cuda")
    _, cpu_overrides, cpu_report = plan(recipe, str(tmp_path), ranks=4)
    assert [o.replace("=cuda", "=cpu") for o in overrides] == cpu_overrides and cpu_report["gpu_only"]
