"""``@register``: how a worker method is split across ranks and how the answers are merged.

A worker class marks its remote-callable methods with ``@register(dispatch_mode, execute_mode,
blocking)``. The worker group reads that mark and builds a driver-side method that (1) turns the
caller's arguments into one argument set per rank (dispatch), (2) calls every rank or only rank 0
(execute), (3) waits when blocking, and (4) merges the per-rank answers (collect).
Dispatch functions return ``(args, kwargs)`` in which every value is a list with one entry per rank.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import sys
from typing import Any, Callable, Optional, Union

__all__ = [
    "Dispatch",
    "Execute",
    "MAGIC_ATTR",
    "RegisteredMethod",
    "get_dispatch_fns",
    "get_registered_method",
    "register",
]

MAGIC_ATTR = "_luffy_registered_method"


class Dispatch(enum.Enum):
    """How a call's arguments are distributed over the ranks (see ``_DISPATCH_TABLE``)."""

    RANK_ZERO = "rank_zero"  # only rank 0 runs, with the arguments unchanged; its answer is returned
    ONE_TO_ALL = "one_to_all"  # every rank gets the same arguments; list of answers
    ALL_TO_ALL = "all_to_all"  # pass-through: per-rank lists are split, anything else is broadcast
    DP_COMPUTE = "dp_compute"  # every argument is already a per-rank list; list of answers
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto arguments chunked per rank; answers concatenated
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"  # first arg a function for all ranks
    DP_COMPUTE_METRIC = "dp_compute_metric"  # DataProto chunked; raw list of answers (metrics)


class Execute(enum.Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclasses.dataclass(frozen=True)
class RegisteredMethod:
    """What ``@register`` recorded on a worker method."""

    dispatch_mode: Union[Dispatch, dict]
    execute_mode: Execute
    blocking: bool


# ---------------------------------------------------------------------------- dispatch / collect
def _is_per_rank(value: Any, world_size: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == world_size


def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return tuple([arg] * n for arg in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    values = list(args) + list(kwargs.values())
    if values and all(_is_per_rank(v, n) for v in values):
        return tuple(list(arg) for arg in args), {k: list(v) for k, v in kwargs.items()}
    return dispatch_one_to_all(worker_group, *args, **kwargs)


def collect_all_to_all(worker_group, outputs):
    return outputs


def dispatch_dp_compute(worker_group, *args, **kwargs):
    n = worker_group.world_size
    for name, value in [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"'{k}'", v) for k, v in kwargs.items()]:
        if not _is_per_rank(value, n):
            got = (
                f"a {type(value).__name__} of length {len(value)}"
                if isinstance(value, (list, tuple))
                else f"a {type(value).__name__}"
            )
            raise ValueError(f"DP_COMPUTE needs {name} to be a list with one entry per rank ({n}), got {got}")
    return tuple(list(arg) for arg in args), {k: list(v) for k, v in kwargs.items()}


def collect_dp_compute(worker_group, outputs):
    if len(outputs) != worker_group.world_size:
        raise ValueError(f"expected {worker_group.world_size} outputs (one per rank), got {len(outputs)}")
    return list(outputs)


def _chunk_proto(name: str, value: Any, chunks: int):
    from verl.protocol import DataProto, DataProtoFuture

    if not isinstance(value, (DataProto, DataProtoFuture)):
        raise TypeError(
            f"DP_COMPUTE_PROTO needs {name} to be a DataProto or DataProtoFuture, got {type(value).__name__}"
        )
    return value.chunk(chunks)


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return (
        tuple(_chunk_proto(f"argument {i}", a, n) for i, a in enumerate(args)),
        {k: _chunk_proto(f"'{k}'", v, n) for k, v in kwargs.items()},
    )


def dispatch_dp_compute_data_proto_with_func(worker_group, *args, **kwargs):
    if not args or not callable(args[0]):
        raise TypeError("DP_COMPUTE_PROTO_WITH_FUNC needs a function as the first argument")
    func, rest = args[0], args[1:]
    split_args, split_kwargs = dispatch_dp_compute_data_proto(worker_group, *rest, **kwargs)
    return ([func] * worker_group.world_size,) + split_args, split_kwargs


def collect_dp_compute_data_proto(worker_group, outputs):
    import ray

    from verl.protocol import DataProto, DataProtoFuture

    outputs = collect_dp_compute(worker_group, outputs)
    if all(isinstance(o, ray.ObjectRef) for o in outputs):
        return DataProtoFuture.concat(outputs)
    for rank, output in enumerate(outputs):
        if not isinstance(output, DataProto):
            raise TypeError(
                f"rank {rank} returned {type(output).__name__}; DP_COMPUTE_PROTO methods must return a DataProto"
            )
    return DataProto.concat(outputs)


_DISPATCH_TABLE: dict[Dispatch, tuple[Callable, Callable]] = {
    Dispatch.RANK_ZERO: (dispatch_one_to_all, collect_all_to_all),
    Dispatch.ONE_TO_ALL: (dispatch_one_to_all, collect_all_to_all),
    Dispatch.ALL_TO_ALL: (dispatch_all_to_all, collect_all_to_all),
    Dispatch.DP_COMPUTE: (dispatch_dp_compute, collect_dp_compute),
    Dispatch.DP_COMPUTE_PROTO: (dispatch_dp_compute_data_proto, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: (dispatch_dp_compute_data_proto_with_func, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_METRIC: (dispatch_dp_compute_data_proto, collect_dp_compute),
}

# Modes whose dispatch splits data over ranks: running only rank 0 would drop the other shares.
_SPLITTING_MODES = {
    Dispatch.DP_COMPUTE,
    Dispatch.DP_COMPUTE_PROTO,
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
    Dispatch.DP_COMPUTE_METRIC,
}


def get_dispatch_fns(dispatch_mode: Union[Dispatch, dict]) -> tuple[Callable, Callable]:
    """(dispatch_fn, collect_fn) of a predefined mode or of a ``{"dispatch_fn", "collect_fn"}`` dict."""
    if isinstance(dispatch_mode, Dispatch):
        return _DISPATCH_TABLE[dispatch_mode]
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - dispatch_mode.keys()
        if missing:
            raise ValueError(
                f"a custom dispatch_mode dict needs keys dispatch_fn and collect_fn; missing {sorted(missing)}"
            )
        return dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"]
    raise TypeError(f"dispatch_mode must be a Dispatch or a dict, got {type(dispatch_mode).__name__}")


# ---------------------------------------------------------------------------- worker side
def _materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve DataProtoFuture arguments inside the worker (the driver never touches their data)."""
    protocol = sys.modules.get("verl.protocol")
    if protocol is None:  # no future can have been unpickled in this process without importing it
        return args, kwargs
    future_type = protocol.DataProtoFuture
    args = tuple(a.get() if isinstance(a, future_type) else a for a in args)
    kwargs = {k: v.get() if isinstance(v, future_type) else v for k, v in kwargs.items()}
    return args, kwargs


def register(
    dispatch_mode: Union[Dispatch, dict] = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
):
    """Mark a worker method as callable through a worker group.

    ``Dispatch.RANK_ZERO`` implies ``Execute.RANK_ZERO``. Data-splitting modes cannot run on rank 0
    only. With ``blocking=False`` the group method returns ObjectRefs (or a DataProtoFuture for the
    DataProto modes) instead of waiting.
    """
    get_dispatch_fns(dispatch_mode)  # validates the mode early, at class definition
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute, got {execute_mode!r}")
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    if execute_mode is Execute.RANK_ZERO and dispatch_mode in _SPLITTING_MODES:
        raise ValueError(f"{dispatch_mode} splits data over all ranks; it cannot run with Execute.RANK_ZERO")
    spec = RegisteredMethod(dispatch_mode=dispatch_mode, execute_mode=execute_mode, blocking=bool(blocking))

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def inner(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize(args, kwargs)
                return await func(*args, **kwargs)
        else:

            @functools.wraps(func)
            def inner(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize(args, kwargs)
                return func(*args, **kwargs)

        setattr(inner, MAGIC_ATTR, spec)
        return inner

    return decorator


def get_registered_method(attr: Any) -> Optional[RegisteredMethod]:
    """The ``@register`` record of a class attribute, or None for ordinary attributes."""
    spec = getattr(attr, MAGIC_ATTR, None)
    return spec if isinstance(spec, RegisteredMethod) else None
