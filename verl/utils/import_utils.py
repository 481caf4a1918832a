"""``model.external_lib``: the Python module(s) imported before a model is loaded, so that a module which
registers a custom architecture (``AutoConfig.register`` / ``AutoModelForCausalLM.register``) makes it
loadable by name. The driver and every worker import it (each is its own process)."""

from __future__ import annotations

import importlib
from typing import Sequence, Union


def import_external_libs(
    external_libs: Union[None, str, Sequence[str]], key: str = "actor_rollout_ref.model.external_lib"
) -> list:
    """Import each named module (a dotted module name, as for ``import``); returns the modules.

    A module that cannot be imported is one error naming the config key and the module.
    """
    if not external_libs:
        return []
    names: list[str] = [external_libs] if isinstance(external_libs, str) else list(external_libs)
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as err:
            raise ImportError(
                f"{key}={name!r} could not be imported ({err}); it must be an importable module "
                "name on PYTHONPATH, e.g. my_pkg.my_model"
            ) from err
    return modules
