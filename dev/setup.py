"""Install the development package ``luffy_pool_dev``: machinery that makes the CPU test suite and the CPU rehearsals
faster, kept out of the product (``verl``, ``luffy_pool``, ``deepscaler``). ``exp_scripts/setup_venv.sh`` installs it
with ``pip install --no-deps -e dev``; nothing in it acts unless the harness switches it on
(luffy_pool_dev/__init__.py).
"""

from setuptools import setup

setup(
    name="luffy-pool-dev",
    version="0.1.0",
    description="LUFFY-POOL's test and rehearsal speed-ups (fork server, start-up GC pause, vLLM-CPU plugin)",
    python_requires=">=3.10",
    packages=["luffy_pool_dev"],
    install_requires=[],  # it runs in the project's venv, next to the product's pinned stack
    # vLLM calls every general plugin in each process that builds an engine (vllm/plugins/__init__.py
    # load_general_plugins); this one does nothing unless LUFFY_DEV_SPEEDUPS=1.
    entry_points={"vllm.general_plugins": ["luffy_pool_dev_cpu = luffy_pool_dev.vllm_plugin:register"]},
)
