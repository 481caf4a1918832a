"""Training methods selected by ``algorithm.method``: each a small module registering a :class:`Method`
(luffy_pool/methods/base.py) plus its YAML group ``algorithm.<name>``. Importing this package registers the
shipped ones; ``method_names()`` is the value list of ``algorithm.method``."""

from luffy_pool.methods.base import METHODS, Method, apply_method, get_method, register_method  # noqa: F401
from luffy_pool.methods import chord, exgrpo, grpo, hpt, luffy, prefix_rft, relift, srft, uft  # noqa: F401,E402 -- registration


def method_names() -> tuple[str, ...]:
    """The implemented values of ``algorithm.method``."""
    return tuple(sorted(METHODS))
