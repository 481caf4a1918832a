"""exp_scripts/gpu_smoke.py at CI size (``--device cpu --small``): the GPU smoke script's own code path, on CPU.

The same script runs on one GPU with Qwen2.5-1.5B shapes in bf16; here its checks (weights changed,
engine weights equal the actor's after the sync, the sync in the parameter dtype, gradient
checkpointing on, the expected backend and device, packed vs padded log-probs, the engine-vs-actor gap after
each push) must pass for the HF engine and vLLM-CPU, and the split-engine run (Ray) for the HF engine; a broken
push and a packing that leaks across sequences must fail theirs.
"""

import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, REPO_ROOT)  # exp_scripts.gpu_smoke_checks: the checks' bounds
CHECKS = {
    "weights_changed",
    "engine_equals_actor",
    "sync_in_param_dtype",
    "gradient_checkpointing",
    "backend",
    "device",
    "engine_vs_actor_kl",
    "packed_vs_padded",
}


def _env():
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )


def _smoke(tmp_path, *args, code=None):
    """Run the smoke on CPU at CI size (``code``: a Python prelude that patches, then calls ``gpu_smoke.main``);
    returns (process, the ``GPU_SMOKE`` summary)."""
    argv = ["--device", "cpu", "--small", *args, "--out", str(tmp_path)]
    run = f"import sys\n{code}\nfrom exp_scripts import gpu_smoke\nsys.exit(gpu_smoke.main({argv!r}))"
    cmd = (
        [sys.executable, os.path.join(REPO_ROOT, "exp_scripts", "gpu_smoke.py"), *argv]
        if code is None
        else [sys.executable, "-c", run]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=str(tmp_path))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("GPU_SMOKE ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(lines[-1][len("GPU_SMOKE ") :])


@pytest.mark.vllm
def test_gpu_smoke_small_on_cpu(tmp_path):
    """The default CPU run: both engines in-process, then the split run (``--split auto`` on CPU) with vLLM-CPU."""
    proc, summary = _smoke(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["ok"] and [r["engine"] for r in summary["results"]] == ["hf", "vllm"]
    for r in summary["results"]:
        assert set(r["checks"]) == CHECKS
        assert all(r["checks"].values()), r
        assert len(r["steps"]) == 2 and all(s["engine_tokens_per_s"] > 0 for s in r["steps"])
        assert r["sync_dtypes"] == ["torch.float32"] and r["peak_memory_gb"] > 0
    split = summary["split"]
    assert split["engine"] == "vllm" and set(split["checks"]) == {"engine_vs_actor_kl", "split_trained"}, split


@pytest.mark.slow  # builds a model and runs every numeric check (~15 s)
def test_numeric_checks_pass_on_cpu_with_the_hf_engine(tmp_path):
    """``--rollout hf --split off`` (no Ray, ~20 s): packed vs padded and the engine-vs-actor gap after each push run
    inside the real steps; in fp32 the actor and the HF engine do the same arithmetic, so both gaps are at rounding
    level, far below their fp32 bounds; a PASS line per check and the summary line are printed."""
    from exp_scripts.gpu_smoke_checks import KL_BOUNDS, PACKED_BOUNDS

    proc, summary = _smoke(tmp_path, "--rollout", "hf", "--split", "off")
    assert proc.returncode == 0 and summary["ok"], proc.stdout[-3000:] + proc.stderr[-3000:]
    (r,) = summary["results"]
    assert set(r["checks"]) == CHECKS and all(r["checks"].values()), r
    numeric = r["numeric"]
    assert numeric["precision"] == "fp32" and summary["split"] == {"skipped": "--split off"}
    # both steps were generated right after a push (hybrid engine: staleness 0), the second from trained weights
    assert [(s["step"], s["staleness"]) for s in numeric["engine_vs_actor"]] == [(1, 0), (2, 0)]
    for s in numeric["engine_vs_actor"]:
        assert s["tokens"] > 0 and abs(s["mean_actor_minus_engine"]) < 1e-5 and 0 <= s["kl_k3"] < 1e-8, s
        assert abs(s["mean_actor_minus_engine"]) < KL_BOUNDS["fp32"] / 100
    assert set(numeric["packed_vs_padded"]) == {"packed", "packed_chunked_head"}
    for g in numeric["packed_vs_padded"].values():
        assert g["tokens"] > 0 and g["max_abs"] < PACKED_BOUNDS["fp32"]["max_abs"] / 10, g
    out = proc.stdout
    assert "[gpu_smoke] PASS hf/packed_vs_padded: fp32 bounds" in out
    assert "[gpu_smoke] PASS hf/engine_vs_actor_kl: fp32 bound 0.001" in out
    assert "[gpu_smoke] SUMMARY: 8/8 checks passed; skipped: split" in out


# Two faults the numeric checks exist for: a push whose names map decoder layer 0 onto layer 1 and back (every
# tensor arrives, in the right dtype and shape), and a packed forward whose position ids run on across the packed
# sequences (transformers then sees one sequence: attention leaks across rows and RoPE shifts).
FAULTS = """
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.actor.dp_actor import DataParallelPPOActor

push = HFRollout.update_weights
SWAP = {".layers.0.": ".layers.1.", ".layers.1.": ".layers.0."}


def swapped(self, named):
    def rename(k):
        for a, b in SWAP.items():
            if a in k:
                return k.replace(a, b)
        return k
    return push(self, [(rename(k), v) for k, v in named])


packed = DataParallelPPOActor._packed_logits


def leaky(self, input_ids, attention_mask, position_ids):
    return packed(self, input_ids, attention_mask, attention_mask.flatten().long().cumsum(0).view_as(position_ids) - 1)


HFRollout.update_weights, DataParallelPPOActor._packed_logits = swapped, leaky
"""


@pytest.mark.slow
def test_a_layer_swapping_push_and_a_leaking_pack_fail_their_checks(tmp_path):
    from exp_scripts.gpu_smoke_checks import KL_BOUNDS, PACKED_BOUNDS

    proc, summary = _smoke(tmp_path, "--rollout", "hf", "--split", "off", code=FAULTS)
    assert proc.returncode == 1 and not summary["ok"], proc.stdout[-3000:] + proc.stderr[-3000:]
    (r,) = summary["results"]
    failed = {k for k, v in r["checks"].items() if not v}
    assert failed == {"engine_equals_actor", "engine_vs_actor_kl", "packed_vs_padded"}, r["checks"]
    # measured: k3 0.03-0.05 per step (50x the fp32 bound) on this 2-layer random model
    assert all(s["kl_k3"] > 10 * KL_BOUNDS["fp32"] for s in r["numeric"]["engine_vs_actor"]), r["numeric"]
    gaps = r["numeric"]["packed_vs_padded"]
    assert gaps["packed"]["mean_abs"] > PACKED_BOUNDS["bf16"]["mean_abs"]  # measured 0.03: fails even bf16's bound
    # the chunked head packs in response_head.py, not through _packed_logits: it stays at rounding level
    assert gaps["packed_chunked_head"]["max_abs"] < PACKED_BOUNDS["fp32"]["max_abs"]
    assert "[gpu_smoke] FAIL hf/engine_vs_actor_kl: fp32 bound 0.001" in proc.stdout
    assert (
        "[gpu_smoke] SUMMARY: 5/8 checks passed; FAILED: hf/engine_equals_actor, hf/engine_vs_actor_kl, "
        "hf/packed_vs_padded; skipped: split"
    ) in proc.stdout


@pytest.mark.e2e
def test_split_engines_one_step_off_on_cpu(tmp_path):
    """``--split on`` with the HF engine: the launcher builds 1 actor rank + 1 engine rank on Ray (gloo weight
    group), trains 2 steps one_step_off (batch 2 launched before update 1: staleness 1), then pushes the trained
    weights and generates once more: the gap is at rounding level on the staleness-0 batches and of the size of
    one update (lr 1e-3) on the stale one."""
    proc, summary = _smoke(tmp_path, "--rollout", "hf", "--split", "on")
    assert proc.returncode == 0 and summary["ok"], proc.stdout[-3000:] + proc.stderr[-3000:]
    split = summary["split"]
    assert split["engine"] == "hf" and split["checks"] == {"engine_vs_actor_kl": True, "split_trained": True}, split
    steps = split["steps"]
    assert [(s["step"], s["staleness"]) for s in steps] == [(1, 0), (2, 1), (3, 0)]  # step 3: after the last push
    assert steps[0]["kl_k3"] < 1e-8 and steps[2]["kl_k3"] < 1e-8 and steps[1]["kl_k3"] > 1e-3, steps
    assert "[gpu_smoke] PASS split/hf/split_trained: staleness per step [0, 1] (want [0, 1])" in proc.stdout
    assert "[gpu_smoke] SUMMARY: 10/10 checks passed" in proc.stdout


def test_verdicts_print_one_line_per_check_and_a_summary(capsys):
    smoke = _gpu_smoke_module()
    results = [
        {
            "engine": "hf",
            "checks": {"weights_changed": True, "engine_vs_actor_kl": False},
            "details": {"engine_vs_actor_kl": "fp32 bound 0.001"},
        }
    ]
    split = {"engine": "vllm", "checks": {"split_trained": True}, "details": {"split_trained": "staleness [0, 1]"}}
    smoke.print_verdicts(results, None, {"skipped": "no SP/TP in the recipe"}, split)
    assert capsys.readouterr().out.splitlines() == [
        "[gpu_smoke] PASS hf/weights_changed",
        "[gpu_smoke] FAIL hf/engine_vs_actor_kl: fp32 bound 0.001",
        "[gpu_smoke] PASS split/vllm/split_trained: staleness [0, 1]",
        "[gpu_smoke] SUMMARY: 2/3 checks passed; FAILED: hf/engine_vs_actor_kl; skipped: sp_tp_rehearsal",
    ]
    smoke.print_verdicts([], {"ok": True, "skipped": "cpu"}, None, {"skipped": "--split off"})
    assert capsys.readouterr().out.splitlines()[-1] == "[gpu_smoke] SUMMARY: 1/1 checks passed; skipped: split"


@pytest.mark.vllm
def test_gpu_smoke_recipe_train_sh_small_on_cpu(tmp_path):
    """``--recipe exp_scripts/train.sh``: the recipe's switches (read by luffy_pool/run/recipe.py, as the rehearsal
    reads them) run in the real worker: checkpointing, padding removal rule, dynamic batches, the reference
    with its offload, the parameter dtype, and the recipe's engine (vLLM) only."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "exp_scripts", "gpu_smoke.py"),
            "--device",
            "cpu",
            "--small",
            "--recipe",
            os.path.join(REPO_ROOT, "exp_scripts", "train.sh"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=str(tmp_path),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("GPU_SMOKE ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(lines[-1][len("GPU_SMOKE ") :])
    assert summary["ok"] and [r["engine"] for r in summary["results"]] == ["vllm"]
    r = summary["results"][0]
    assert {
        "recipe_remove_padding",
        "recipe_dynamic_bsz",
        "recipe_ref_offload",
        "recipe_param_dtype",
        "gradient_checkpointing",
    } <= set(r["checks"]) and all(r["checks"].values()), r
    sw = r["recipe"]
    assert sw["gradient_checkpointing"] and sw["dynamic_bsz"] and sw["ref_param_offload"] and sw["remove_padding"]
    assert sw["token_factor"] > 1 and sw["tp"] == 2  # budgets scaled by one factor; TP printed, not run on 1 device
    # H8: the recipe's rollout keys, carried and read back from the built engine (budgets only on CPU)
    keys = sw["rollout_keys"]
    assert keys["gpu_memory_utilization"] == 0.73 and keys["sleep_level"] == 2 and not keys["enforce_eager"]
    assert keys["max_num_batched_tokens"] == 8192 // sw["token_factor"] and r["checks"]["recipe_rollout_keys"]
    assert any(s["kl_to_ref"] > 0 for s in r["steps"])  # the reference pass ran (its KL to the trained actor)


def test_graphs_measurement_on_cpu_says_graphs_are_a_gpu_feature(capsys):
    """``graphs_vs_eager`` on cpu builds no engine: it prints why there is no eager/graphs ratio and passes."""
    from exp_scripts import gpu_smoke_graphs

    result = gpu_smoke_graphs.graphs_vs_eager("no-model-needed", "cpu")
    out = capsys.readouterr().out
    assert result == {"ok": True, "skipped": gpu_smoke_graphs.GRAPHS_ON_CPU}
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
    from exp_scripts import gpu_smoke_sp_tp as smoke

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
