"""Colocated worker classes: several roles (actor, rollout, ref, critic) in one process per slot.

``create_colocated_worker_cls({"actor": RayClassWithInitArgs(...), "ref": ...})`` builds a
"WorkerDict" worker that constructs every role in its ``__init__`` and exposes each role's registered
method ``m`` as ``<role>_m``. A RayWorkerGroup of it launches one process per bundle, and
``group.spawn(roles)`` hands back per-role views whose methods carry the plain names again.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from verl.single_controller.base.decorator import MAGIC_ATTR, RegisteredMethod
from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import registered_methods
from verl.single_controller.ray.base import RayClassWithInitArgs

__all__ = ["create_colocated_worker_cls"]


def _make_role_proxy(role: str, name: str, func: Callable, spec: RegisteredMethod) -> Callable:
    """A WorkerDict method forwarding to ``self.worker_dict[role].name`` with the role method's mark."""
    if inspect.iscoroutinefunction(func):

        async def proxy(self, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.worker_dict[role], name)(*args, **kwargs)
    else:

        def proxy(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.worker_dict[role], name)(*args, **kwargs)

    proxy.__name__ = proxy.__qualname__ = f"{role}_{name}"
    proxy.__doc__ = func.__doc__
    setattr(proxy, MAGIC_ATTR, spec)
    return proxy


def create_colocated_worker_cls(class_dict: dict) -> RayClassWithInitArgs:
    """One worker class hosting every role of ``class_dict`` ({role: RayClassWithInitArgs}) in-process."""
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    roles: dict = {}
    options: dict = {}
    for role, cls_with_init in class_dict.items():
        if not isinstance(role, str) or not role.isidentifier():
            raise ValueError(f"role name {role!r} must be a Python identifier (it prefixes method names)")
        if not isinstance(cls_with_init, RayClassWithInitArgs):
            raise TypeError(f"role '{role}' must be a RayClassWithInitArgs, got {type(cls_with_init).__name__}")
        user_cls = cls_with_init.user_cls
        if not (isinstance(user_cls, type) and issubclass(user_cls, Worker)):
            raise TypeError(f"role '{role}': {user_cls!r} is not a Worker subclass")
        roles[role] = (user_cls, cls_with_init.args, cls_with_init.kwargs)
        for key, value in cls_with_init._options.items():
            if key in options and options[key] != value:
                raise ValueError(
                    f"roles disagree on actor option '{key}' ({options[key]!r} vs {value!r}); they "
                    f"share one process, so set it identically"
                )
            options[key] = value

    class WorkerDict(Worker):
        """Hosts one instance of every colocated role (``self.worker_dict[role]``)."""

        def __init__(self) -> None:
            super().__init__()
            self.worker_dict = {name: cls(*args, **kwargs) for name, (cls, args, kwargs) in roles.items()}

    role_methods: dict = {}
    for role, (user_cls, _, _) in roles.items():
        role_methods[role] = []
        for name, spec in registered_methods(user_cls).items():
            attr_name = f"{role}_{name}"
            if hasattr(WorkerDict, attr_name):
                raise ValueError(f"colocated method name '{attr_name}' is produced twice; rename a role or method")
            setattr(WorkerDict, attr_name, _make_role_proxy(role, name, getattr(user_cls, name), spec))
            role_methods[role].append(name)
    WorkerDict._role_methods = role_methods
    WorkerDict.__name__ = WorkerDict.__qualname__ = "WorkerDict_" + "_".join(roles)

    colocated = RayClassWithInitArgs(WorkerDict)
    colocated.update_options(options)
    return colocated
