"""Backend-neutral pieces of the single controller: resource pools, class+init-args bundles, and the
WorkerGroup that turns every ``@register``-ed worker method into a driver-side method.

The Ray backend (``verl.single_controller.ray``) supplies the processes; this module only knows the
shape of a pool (processes per node) and how a registered method is bound.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from verl.single_controller.base.decorator import RegisteredMethod, get_dispatch_fns, get_registered_method

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup", "registered_methods"]


class ResourcePool:
    """``process_on_nodes[i]`` worker processes on node i; ``max_colocate_count`` worker groups may
    share each process slot (one process per slot when roles are fused into a WorkerDict)."""

    def __init__(self, process_on_nodes: Optional[list] = None, max_colocate_count: int = 1) -> None:
        process_on_nodes = list(process_on_nodes or [])
        if not process_on_nodes:
            raise ValueError("process_on_nodes must list at least one node, e.g. [n_gpus_per_node] * nnodes")
        for i, count in enumerate(process_on_nodes):
            if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
                raise ValueError(f"process_on_nodes[{i}] must be a positive int, got {count!r}")
        if not isinstance(max_colocate_count, int) or max_colocate_count <= 0:
            raise ValueError(f"max_colocate_count must be a positive int, got {max_colocate_count!r}")
        self._store = process_on_nodes
        self.max_colocate_count = max_colocate_count

    @property
    def store(self) -> list:
        return list(self._store)

    @property
    def world_size(self) -> int:
        return sum(self._store)

    def __len__(self) -> int:
        return len(self._store)


class ClassWithInitArgs:
    """A worker class plus the arguments to construct it with (construction happens remotely)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


def registered_methods(cls: type) -> dict[str, RegisteredMethod]:
    """``{name: RegisteredMethod}`` for every ``@register``-ed method of ``cls`` (inherited included)."""
    found = {}
    for name in dir(cls):
        if name.startswith("__"):
            continue
        try:
            attr = getattr(cls, name)
        except AttributeError:
            continue
        spec = get_registered_method(attr)
        if spec is not None:
            found[name] = spec
    return found


class WorkerGroup:
    """A set of ``world_size`` workers driven as one: registered worker methods become methods here."""

    def __init__(self, resource_pool: Optional[ResourcePool] = None) -> None:
        self._workers: list = []
        self._world_size = resource_pool.world_size if resource_pool is not None else 0
        self._bound_method_names: list[str] = []

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def workers(self) -> list:
        return list(self._workers)

    def _bind_worker_methods(
        self, worker_cls: type, make_method: Callable[[str, Callable, Callable, RegisteredMethod], Callable]
    ) -> list:
        """Install one driver-side method per registered method of ``worker_cls``."""
        for name, spec in registered_methods(worker_cls).items():
            if hasattr(self, name):
                raise ValueError(
                    f"worker method '{name}' of {worker_cls.__name__} clashes with an attribute of "
                    f"{type(self).__name__}; rename the worker method"
                )
            dispatch_fn, collect_fn = get_dispatch_fns(spec.dispatch_mode)
            method = make_method(name, dispatch_fn, collect_fn, spec)
            method.__name__ = name
            method.__doc__ = getattr(getattr(worker_cls, name), "__doc__", None)
            setattr(self, name, method)
            self._bound_method_names.append(name)
        return list(self._bound_method_names)
