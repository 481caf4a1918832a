"""Training methods selected by ``algorithm.method``: each a module (or package) of this package registering a
:class:`Method` (luffy_pool/methods/base.py), plus its YAML group luffy_pool/config/method/<name>.yaml.

Importing this package imports every module in it, so a new method needs no line here; ``method_names()`` is the
value list of ``algorithm.method``.
"""

import importlib
import pkgutil

from luffy_pool.methods.base import (  # noqa: F401
    METHODS,
    Method,
    MethodSelection,
    get_method,
    register_method,
    select_method,
)

# shared building blocks, not methods
_NOT_METHODS = {"base", "hooks", "loss_helpers", "loss_inputs", "losses"}

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in _NOT_METHODS and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")


def method_names() -> tuple[str, ...]:
    """The implemented values of ``algorithm.method``."""
    return tuple(sorted(METHODS))
