"""Which attention kernel a model is built with: ``model.attn_implementation`` resolved per device.

``auto`` means flash-attention 2 on CUDA when its package is importable, sdpa otherwise (CPU, or a GPU
image without flash-attn): the fallback is announced once per process with the package's name, so a
GPU user sees why decoding and packed training are slower. An explicit flash-attention choice whose
package is missing is a configuration error; ``luffy_pool/run/preflight.py`` reports it before start-up
(``missing_kernel_package``) instead of every rank raising ImportError while building its model.
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
        logger.warning("%s=auto: the %s package (import %s) is not installed, using sdpa attention "
                       "(pip install %s for flash-attention 2)", key, dist, module, dist)
    return "sdpa"
