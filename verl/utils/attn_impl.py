"""Which attention kernel a model is built with: ``model.attn_implementation`` resolved per device.

``auto`` means flash-attention 2 on CUDA when its package is importable, sdpa otherwise (CPU, or a GPU
image without flash-attn): the fallback is announced once per process with the package's name, so a
GPU user sees why decoding and packed training are slower. An explicit flash-attention choice whose
package is missing is a configuration error; ``luffy_pool/run/preflight.py`` reports it before start-up
(``missing_kernel_package``) instead of every rank raising ImportError while building its model.

An installed flash-attn built against another torch/CUDA passes ``find_spec`` and transformers' check and fails
only at the first attention call, after a whole rollout: ``flash_attn_importable`` imports its
compiled extension, and each worker calls ``require_kernel`` when flash-attention 2 is asked for or auto-picked,
before it loads the model.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Optional

logger = logging.getLogger(__name__)

KEY = "actor_rollout_ref.model.attn_implementation"
# transformers' implementation name -> (module it imports, the pip distribution that provides it)
KERNEL_PACKAGES = {
    "flash_attention_2": ("flash_attn", "flash-attn"),
    "flash_attention_3": ("flash_attn_interface", "flash-attn-3"),
}

# flash-attn 2.x ships its kernels as the top-level extension module ``flash_attn_2_cuda`` (a .so next to the
# ``flash_attn`` package; flash_attn/flash_attn_interface.py imports it as ``flash_attn_gpu``).
EXTENSION_MODULE = "flash_attn_2_cuda"

_warned = False


def package_importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-installed package
        return False


def missing_kernel_package(name: str) -> Optional[str]:
    """The pip package an explicit ``name`` needs and this interpreter lacks; None when nothing is missing."""
    if name not in KERNEL_PACKAGES:
        return None
    module, dist = KERNEL_PACKAGES[name]
    return None if package_importable(module) else dist


def resolve_attn_implementation(name: str, device: str, key: str = KEY) -> str:
    """``auto`` -> ``flash_attention_2`` on cuda with flash-attn importable, else ``sdpa`` (one warning
    per process naming the package when a cuda run falls back); any other name is returned as is."""
    global _warned
    if name != "auto":
        return name
    if device != "cuda":
        return "sdpa"
    module, dist = KERNEL_PACKAGES["flash_attention_2"]
    if package_importable(module):
        return "flash_attention_2"
    if not _warned:
        _warned = True
        logger.warning(
            "%s=auto: the %s package (import %s) is not installed, using sdpa attention "
            "(pip install %s for flash-attention 2)",
            key,
            dist,
            module,
            dist,
        )
    return "sdpa"


def _torch_versions() -> str:
    try:
        import torch

        return f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    except ImportError:  # pragma: no cover - every worker has torch
        return "no torch"


def flash_attn_importable() -> Optional[str]:
    """Import flash-attn and its compiled CUDA extension in this process; None when both import, else one line
    naming the package, its version, the error and this process's torch/CUDA (a wheel built for another torch
    fails here with ``undefined symbol``)."""
    import importlib

    module, dist = KERNEL_PACKAGES["flash_attention_2"]
    try:
        from importlib.metadata import version

        installed = f"{dist} {version(dist)}"
    except Exception:  # noqa: BLE001 - metadata missing or odd: the name alone is enough
        installed = dist
    for name in (module, EXTENSION_MODULE):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - ImportError, OSError (libcudart), RuntimeError from its init
            err = " ".join(f"{type(exc).__name__}: {exc}".split())
            return (
                f"{installed} is installed but its CUDA extension does not import ({'import ' + name}: {err}); "
                f"this worker has {_torch_versions()}: reinstall {dist} built for them "
                f"(pip install {dist} --no-build-isolation), or set {KEY}=sdpa"
            )
    return None


def require_kernel(attn: str) -> None:
    """Raise RuntimeError with ``flash_attn_importable``'s line when ``attn`` (resolved) is flash-attention 2 and
    its extension does not import here; the worker calls it before it builds the model."""
    if attn != "flash_attention_2":
        return
    reason = flash_attn_importable()
    if reason:
        raise RuntimeError(reason)
