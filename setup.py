"""Install LUFFY-POOL: the verl fork (``verl``), the dual-pool method (``luffy_pool``) and rewards (``deepscaler``)."""

from setuptools import find_packages, setup


def _reqs(path):
    with open(path) as f:
        return [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]


setup(
    name="luffy-pool",
    version="0.1.0",
    description="LUFFY off-policy guided GRPO on a VERL-style Ray single controller",
    python_requires=">=3.10",
    packages=find_packages(include=["verl", "verl.*", "luffy_pool", "luffy_pool.*", "deepscaler", "deepscaler.*"]),
    package_data={"luffy_pool": ["config/*.yaml"], "verl": ["trainer/config/*.yaml"]},
    install_requires=[],  # pinned stacks live in requirements*.txt (CPU and GPU differ)
    extras_require={
        "cpu": _reqs("requirements.txt"),
        "gpu": _reqs("requirements-gpu.txt"),
        "bench": _reqs("requirements-bench.txt"),
    },
    entry_points={"console_scripts": ["luffy-train=luffy_pool.main_mix_ppo:main"]},
)
