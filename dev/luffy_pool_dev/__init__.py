"""LUFFY-POOL's development package: what makes the CPU test suite and the CPU rehearsals faster, outside the product.

Nothing here is imported by ``verl``, ``luffy_pool`` or ``deepscaler``. The harness (``tests/run.sh``,
``tests/conftest.py``, ``exp_scripts/rehearse.sh``) switches it on through generic seams only:

- ``VERL_ACTOR_RUNTIME_ENV_HOOK=luffy_pool_dev.fork_workers:actor_runtime_env`` (verl's per-actor runtime_env hook,
  verl/single_controller/ray/base.py): every worker rank gets Ray's ``worker_process_setup_hook`` that pauses the
  cyclic collector while it imports its class (startup_gc.py), and with ``LUFFY_FORK_WORKERS=1`` CPU ranks are forked
  from a process that imported their modules once (worker_zygote.py);
- ``LUFFY_DEV_SPEEDUPS=1``: the vLLM general plugin of this package (vllm_plugin.py, an entry point of dev/setup.py)
  makes CPU engines run vLLM's compiled helpers eager (cpu_eager.py), inspect their model class in-process
  (cpu_model_inspect.py), reduce a TP group over a socket mesh (cpu_tp_sockets.py) and start over a frozen heap;
- test helpers: ``run_gloo_ranks`` (gloo_ranks.py, N gloo ranks of this machine, no Ray).
"""

SPEEDUPS_ENV = "LUFFY_DEV_SPEEDUPS"  # the vLLM-CPU plugin acts only when it is "1"
FORK_WORKERS_ENV = "LUFFY_FORK_WORKERS"  # the actor hook forks CPU ranks only when it is on
ACTOR_HOOK = "luffy_pool_dev.fork_workers:actor_runtime_env"  # the value of verl's VERL_ACTOR_RUNTIME_ENV_HOOK
