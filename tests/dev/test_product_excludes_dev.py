"""The test-speed machinery stays out of the product (``verl``, ``luffy_pool``, ``deepscaler``): none of its files is
there, no product module names the development package (dev/luffy_pool_dev), a plain interpreter that imports the
trainer's entry point and the workers loads none of it, and the harness switches it on through generic seams."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT = ("verl", "luffy_pool", "deepscaler")
# The modules that moved to dev/luffy_pool_dev (fork server, start-up GC pause, vLLM-CPU patches, gloo test ranks)
MOVED = ("worker_zygote", "startup_gc", "cpu_eager", "cpu_model_inspect", "cpu_tp_sockets", "gloo_ranks")
DEV_NAMES = (*MOVED, "luffy_pool_dev", "fork_workers", "vllm_plugin")


def _product_files():
    for package in PRODUCT:
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def test_no_file_of_the_dev_machinery_is_in_the_product():
    files = list(_product_files())
    assert len(files) > 100
    assert [f for f in files if os.path.basename(f)[:-3] in MOVED] == []
    for name in MOVED:
        assert os.path.isfile(os.path.join(REPO, "dev", "luffy_pool_dev", f"{name}.py")), name


def test_no_product_module_names_the_dev_package():
    naming = [f for f in _product_files() if "luffy_pool_dev" in open(f).read()]
    assert naming == []


# Loads the trainer's entry point, the Ray worker group, the FSDP workers, the vLLM rollout engine's module, the SFT
# trainer and the generator, and constructs a worker; prints every loaded module whose last name part is a dev one's.
PROBE = """
import sys
import luffy_pool.main_mix_ppo
import verl.single_controller.ray.base, verl.workers.fsdp_workers, verl.workers.rollout.vllm_rollout.vllm_rollout
import verl.trainer.fsdp_sft_trainer, verl.trainer.main_generation
verl.single_controller.base.Worker()  # a rank's construction (it used to end the start-up GC pause)
dev = set(sys.argv[1:])
print(sorted(m for m in sys.modules if m.split(".")[-1] in dev or m.split(".")[0] in dev))
"""


@pytest.mark.slow  # a fresh interpreter importing the trainer and workers (~12 s)
def test_a_plain_interpreter_importing_the_trainer_and_workers_loads_no_dev_module():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LUFFY_DEV_SPEEDUPS", "VERL_ACTOR_RUNTIME_ENV_HOOK", "LUFFY_FORK_WORKERS", "PYTHONPATH")
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *DEV_NAMES], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    # the check sees a loaded dev module (the probe is not blind)
    out = subprocess.run(
        [sys.executable, "-c", "import luffy_pool_dev.startup_gc\n" + PROBE, *DEV_NAMES],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.stdout.strip().splitlines()[-1] == "['luffy_pool_dev', 'luffy_pool_dev.startup_gc']", out.stderr[-2000:]


def test_the_suite_runs_with_the_dev_machinery_switched_on_through_the_generic_seams():
    """tests/conftest.py (as tests/run.sh) names the dev actor hook in verl's VERL_ACTOR_RUNTIME_ENV_HOOK and switches
    the vLLM plugin on; tests/run.sh forks the ranks as well."""
    from luffy_pool_dev import fork_workers

    from verl.single_controller.ray.base import actor_runtime_env_hook

    assert actor_runtime_env_hook() is fork_workers.actor_runtime_env
    assert os.environ["LUFFY_DEV_SPEEDUPS"] == "1"
    run_sh = open(os.path.join(REPO, "tests", "run.sh")).read()
    for line in (
        "export VERL_ACTOR_RUNTIME_ENV_HOOK=${VERL_ACTOR_RUNTIME_ENV_HOOK-luffy_pool_dev.fork_workers:actor_runtime_env}",
        "export LUFFY_FORK_WORKERS=${LUFFY_FORK_WORKERS:-1} LUFFY_DEV_SPEEDUPS=${LUFFY_DEV_SPEEDUPS:-1}",
    ):
        assert line in run_sh.splitlines()
