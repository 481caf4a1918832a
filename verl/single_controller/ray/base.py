"""The Ray backend of the single controller: placement groups per node, actor launch, method calls.

``RayResourcePool`` reserves one placement group per node. ``RayWorkerGroup`` starts one actor per
bundle with the torch.distributed environment (rank 0 first, so it can choose MASTER_ADDR/PORT for
the others) and binds every ``@register``-ed worker method as a driver method: dispatch, call each
actor, wait (never forever: a failed or dead rank ends the wait, see ``verl.utils.ray_utils``), collect.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
import random
import string
import sys
from typing import Any, Callable, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.single_controller.base.decorator import Execute, RegisteredMethod
from verl.single_controller.base.worker import Worker, find_free_port
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup
from verl.utils.ray_utils import WorkerGroupError, get_ranked

logger = logging.getLogger(__name__)
# A deployment may adjust the runtime env of every actor a worker group starts: start its process another way
# (``py_executable``), run Ray's ``worker_process_setup_hook`` in it (set per actor through the variable Ray reads it
# from, ``ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR``), add variables. This variable names a
# ``module:function``, called on the driver for each actor as ``function(runtime_env, worker_cls=, args=, kwargs=,
# num_gpus=)`` (``num_gpus``: what each rank asks Ray for); it returns the runtime env the actor starts with. Unset:
# actors start as Ray starts them. (tests/run.sh names one: the test suite's fork server and start-up GC pause.)
ACTOR_RUNTIME_ENV_HOOK_ENV = "VERL_ACTOR_RUNTIME_ENV_HOOK"


def actor_runtime_env_hook() -> Optional[Callable[..., dict]]:
    """The function ``VERL_ACTOR_RUNTIME_ENV_HOOK`` names, or None when it is unset."""
    spec = os.environ.get(ACTOR_RUNTIME_ENV_HOOK_ENV, "").strip()
    if not spec:
        return None
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{ACTOR_RUNTIME_ENV_HOOK_ENV}={spec!r}: expected module:function")
    return getattr(importlib.import_module(module), name)


__all__ = ["RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup", "unwrap_ray_actor_class"]


def _random_prefix(length: int = 6) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=length))


def _with_context(err: Exception, context: str) -> Exception:
    """The same kind of error with ``context`` in front (the original if its type cannot be rebuilt)."""
    try:
        return type(err)(f"{context}: {err}")
    except Exception:  # noqa: BLE001 - exception types with unusual constructors keep their message
        return err


def unwrap_ray_actor_class(cls: Any) -> type:
    """The plain Python class behind ``ray.remote(cls)`` (or ``cls`` itself)."""
    return getattr(cls, "__ray_actor_class__", cls) if isinstance(cls, ray.actor.ActorClass) else cls


def _node_ip_and_free_port() -> tuple[str, int]:
    addr = ray.util.get_node_ip_address()
    return addr, find_free_port(addr)


class RayResourcePool(ResourcePool):
    """Placement groups for ``process_on_nodes`` processes per node.

    Each node gets one placement group of ``process_on_nodes[i]`` bundles (``{"CPU": c}`` or
    ``{"CPU": c, "GPU": 1}``, c = ``max_colocate_count``). With STRICT_PACK a node's bundles share one
    Ray node and different node groups are required to land on different Ray nodes.
    """

    def __init__(
        self,
        process_on_nodes: Optional[list] = None,
        use_gpu: bool = True,
        name_prefix: str = "",
        max_colocate_count: int = 1,
        detached: bool = False,
        placement_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or _random_prefix()
        self.detached = detached
        self.placement_timeout_s = placement_timeout_s
        self.pgs: Optional[list[PlacementGroup]] = None
        self.strategy: Optional[str] = None

    def bundle(self) -> dict:
        resources = {"CPU": float(self.max_colocate_count)}
        if self.use_gpu:
            resources["GPU"] = 1.0
        return resources

    def _check_cluster_capacity(self) -> None:
        total = ray.cluster_resources()
        for resource, per_bundle in self.bundle().items():
            needed = per_bundle * self.world_size
            have = total.get(resource, 0.0)
            if have < needed:
                hint = " (pass use_gpu=False to run on CPU)" if resource == "GPU" else ""
                raise ValueError(
                    f"resource pool '{self.name_prefix}' needs {needed:g} {resource} for "
                    f"process_on_nodes={self.store}, but the Ray cluster has {have:g}{hint}"
                )

    def _target_nodes(self) -> list:
        """A distinct Ray node per node group (a soft hint for STRICT_PACK placement)."""
        bundle = self.bundle()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        used: set = set()
        targets = []
        for count in self.store:
            target = None
            for node in alive:
                fits = all(node["Resources"].get(r, 0.0) >= v * count for r, v in bundle.items())
                if fits and node["NodeID"] not in used:
                    target = node["NodeID"]
                    used.add(target)
                    break
            targets.append(target)
        return targets

    def get_placement_groups(self, strategy: str = "STRICT_PACK", name: Optional[str] = None) -> list:
        """The pool's placement groups (created and awaited on first call, then reused)."""
        if self.pgs is not None:
            if strategy != self.strategy:
                raise ValueError(
                    f"resource pool '{self.name_prefix}' is already placed with {self.strategy}, not {strategy}"
                )
            return self.pgs
        self._check_cluster_capacity()
        targets = self._target_nodes() if strategy == "STRICT_PACK" and len(self) > 1 else [None] * len(self)
        # Ray requires unique placement-group names; the token keeps pools with one prefix apart.
        name = f"{name or self.name_prefix}_{_random_prefix(4)}"
        pgs = [
            placement_group(
                bundles=[self.bundle()] * count,
                strategy=strategy,
                name=f"{name}_node{i}",
                lifetime="detached" if self.detached else None,
                _soft_target_node_id=target,
            )
            for i, (count, target) in enumerate(zip(self.store, targets))
        ]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.placement_timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            for pg in pgs:
                remove_placement_group(pg)
            raise RuntimeError(
                f"resource pool '{self.name_prefix}': placement groups {self.store} x {self.bundle()} were not "
                f"scheduled within {self.placement_timeout_s} s; available now: {ray.available_resources()}"
            ) from err
        self.pgs, self.strategy = pgs, strategy
        if strategy == "STRICT_PACK" and len(pgs) > 1:
            self._check_distinct_nodes()
        return pgs

    def node_ids(self) -> list:
        """The Ray node id hosting each node group (after placement)."""
        if self.pgs is None:
            raise RuntimeError("node_ids() needs get_placement_groups() first")
        return [next(iter(placement_group_table(pg)["bundles_to_node_id"].values())) for pg in self.pgs]

    def _check_distinct_nodes(self) -> None:
        nodes = self.node_ids()
        if len(set(nodes)) != len(nodes):
            self.release()
            raise RuntimeError(
                f"resource pool '{self.name_prefix}': node groups {self.store} were packed onto "
                f"Ray nodes {nodes}; each node group needs its own node (is nnodes larger than "
                f"the number of Ray nodes?)"
            )

    def release(self) -> None:
        """Remove the placement groups (their actors must be gone or they are killed by Ray)."""
        for pg in self.pgs or []:
            remove_placement_group(pg)
        self.pgs, self.strategy = None, None


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class (plain or ``ray.remote``) with its constructor arguments and Ray actor options."""

    def __init__(self, cls: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cls, *args, **kwargs)
        self._options: dict = {}
        self._additional_resource: dict = {}

    @property
    def user_cls(self) -> type:
        return unwrap_ray_actor_class(self.cls)

    def update_options(self, options: dict) -> None:
        """Extra ``.options(...)`` for every actor (e.g. ``runtime_env``, ``max_concurrency``)."""
        self._options.update(options)

    def set_additional_resource(self, resources: dict) -> None:
        self._additional_resource = dict(resources)

    def create_actor(
        self,
        placement_group: PlacementGroup,
        bundle_index: int,
        env_vars: dict,
        num_cpus: float,
        num_gpus: float,
        name: Optional[str] = None,
    ):
        """Start one actor in ``placement_group[bundle_index]`` with ``env_vars`` on top of the user's."""
        options = dict(self._options)
        runtime_env = dict(options.pop("runtime_env", {}) or {})
        merged_env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        merged_env.update(runtime_env.get("env_vars", {}) or {})
        merged_env.update(env_vars)
        runtime_env["env_vars"] = merged_env
        hook = actor_runtime_env_hook()
        if hook is not None:
            runtime_env = hook(
                runtime_env,
                worker_cls=self.user_cls,
                args=self.args,
                kwargs=self.kwargs,
                num_gpus=float(options.get("num_gpus", num_gpus) or 0.0)
                + float((options.get("resources") or self._additional_resource or {}).get("GPU", 0.0)),
            )
        actor_options = {
            "num_cpus": num_cpus,
            "runtime_env": runtime_env,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=bundle_index
            ),
        }
        if num_gpus:
            actor_options["num_gpus"] = num_gpus
        if self._additional_resource:
            actor_options["resources"] = dict(self._additional_resource)
        if name:
            actor_options["name"] = name
        actor_options.update(options)
        remote_cls = self.cls if isinstance(self.cls, ray.actor.ActorClass) else ray.remote(self.cls)
        return remote_cls.options(**actor_options).remote(*self.args, **self.kwargs)


class RayWorkerGroup(WorkerGroup):
    """``world_size`` Ray actors of one worker class, driven as one (see module docstring).

    ``call_timeout_s`` bounds every blocking call (None = wait while the ranks are alive);
    ``startup_timeout_s`` bounds actor start-up including the worker's ``__init__``.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        name_prefix: Optional[str] = None,
        bin_pack: bool = True,
        call_timeout_s: Optional[float] = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(resource_pool)
        self.worker_cls = ray_cls_with_init.user_cls
        if not (isinstance(self.worker_cls, type) and issubclass(self.worker_cls, Worker)):
            raise TypeError(f"worker class must subclass verl.single_controller.base.Worker, got {self.worker_cls!r}")
        self.name_prefix = name_prefix or _random_prefix()
        self.call_timeout_s = call_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.resource_pool = resource_pool
        self._launch(resource_pool, ray_cls_with_init, bin_pack)
        self._bind_worker_methods(self.worker_cls, self._make_group_method)

    @property
    def name(self) -> str:
        return self.name_prefix

    def __repr__(self) -> str:
        return (
            f"RayWorkerGroup(name={self.name_prefix!r}, worker={self.worker_cls.__name__}, "
            f"world_size={self.world_size})"
        )

    # ------------------------------------------------------------------ launch
    def _launch(self, pool: RayResourcePool, ray_cls: RayClassWithInitArgs, bin_pack: bool) -> None:
        pgs = pool.get_placement_groups(strategy="STRICT_PACK" if bin_pack else "PACK")
        self.master_addr, self.master_port = self._pick_rendezvous(pgs[0])
        num_gpus = 1.0 / pool.max_colocate_count if pool.use_gpu else 0.0
        slots = [(node, local) for node, count in enumerate(pool.store) for local in range(count)]
        # Actor names must be unique while alive; the token lets a group reuse a fixed name_prefix.
        actor_prefix = f"{self.name_prefix}_{_random_prefix(4)}_{self.worker_cls.__name__}"
        for rank, (node, local_rank) in enumerate(slots):
            env = {
                "WORLD_SIZE": str(self.world_size),
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(pool.store[node]),
                "RAY_LOCAL_RANK": str(local_rank),
                "RAY_LOCAL_WORLD_SIZE": str(pool.store[node]),
                "WG_PREFIX": self.name_prefix,
                "WG_BACKEND": "ray",
                "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port),
            }
            self._workers.append(
                ray_cls.create_actor(
                    pgs[node], local_rank, env, num_cpus=1.0, num_gpus=num_gpus, name=f"{actor_prefix}_{rank}"
                )
            )
        try:
            get_ranked(
                [w.__ray_ready__.remote() for w in self._workers],
                list(range(self.world_size)),
                group_name=self.name_prefix,
                method_name="__init__",
                timeout_s=self.startup_timeout_s,
            )
        except WorkerGroupError:
            self.shutdown()
            raise

    def _pick_rendezvous(self, rank_zero_pg: PlacementGroup) -> tuple[str, int]:
        """(address, free port) on the node of rank 0, chosen before any actor starts.

        Every rank gets MASTER_ADDR/PORT in its environment from the start, so workers may join
        torch.distributed inside ``__init__`` and all actors can start in parallel.
        """
        node_id = placement_group_table(rank_zero_pg)["bundles_to_node_id"][0]
        if node_id == ray.get_runtime_context().get_node_id():
            # Rank 0 lands on this driver's node (every single-node run): pick here. A probe task would start a
            # Ray task worker, a Python interpreter of its own (~2 CPU-s), only to bind one port.
            return _node_ip_and_free_port()
        probe = ray.remote(num_cpus=0)(_node_ip_and_free_port).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        )
        try:
            addr, port = ray.get(probe.remote(), timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            raise RuntimeError(
                f"worker group '{self.name_prefix}': could not reach rank 0's node {node_id} within "
                f"{self.startup_timeout_s} s to choose MASTER_PORT"
            ) from err
        return addr, int(port)

    def shutdown(self) -> None:
        """Kill the actors (the resource pool keeps its placement groups; see ``RayResourcePool.release``)."""
        for actor in self._workers:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an already-dead actor is fine here
                pass

    # ------------------------------------------------------------------ calls
    def _describe(self, method_name: str) -> str:
        return f"worker group '{self.name_prefix}' ({self.worker_cls.__name__}) method '{method_name}'"

    def _submit(self, method_name: str, ranks: list, per_rank_args: tuple, per_rank_kwargs: dict) -> list:
        return [
            getattr(self._workers[rank], method_name).remote(
                *(a[rank] for a in per_rank_args), **{k: v[rank] for k, v in per_rank_kwargs.items()}
            )
            for rank in ranks
        ]

    def _make_group_method(
        self, method_name: str, dispatch_fn: Callable, collect_fn: Callable, spec: RegisteredMethod
    ) -> Callable:
        def group_method(*args: Any, **kwargs: Any) -> Any:
            try:
                per_rank_args, per_rank_kwargs = dispatch_fn(self, *args, **kwargs)
            except (TypeError, ValueError) as err:
                raise _with_context(err, self._describe(method_name)) from err
            ranks = [0] if spec.execute_mode is Execute.RANK_ZERO else list(range(self.world_size))
            refs = self._submit(method_name, ranks, per_rank_args, per_rank_kwargs)
            if spec.execute_mode is Execute.RANK_ZERO:
                return refs[0] if not spec.blocking else self._get(refs, ranks, method_name)[0]
            outputs = self._get(refs, ranks, method_name) if spec.blocking else refs
            try:
                result = collect_fn(self, outputs)
            except (TypeError, ValueError) as err:
                raise _with_context(err, self._describe(method_name)) from err
            protocol = sys.modules.get("verl.protocol")  # imported whenever a collect made a future
            if protocol is not None and isinstance(result, protocol.DataProtoFuture):
                result.group_name, result.method_name, result.ranks = self.name_prefix, method_name, ranks
            return result

        return group_method

    def _get(self, refs: list, ranks: list, method_name: str, timeout_s: Optional[float] = None) -> list:
        return get_ranked(
            refs,
            ranks,
            group_name=self.name_prefix,
            method_name=method_name,
            timeout_s=timeout_s if timeout_s is not None else self.call_timeout_s,
        )

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method_name`` on every rank; list arguments of length world_size are split per rank."""
        values = list(args) + list(kwargs.values())
        n = self.world_size
        if values and all(isinstance(v, (list, tuple)) and len(v) == n for v in values):
            return self._submit(method_name, list(range(n)), args, kwargs)
        return self._submit(
            method_name, list(range(n)), tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}
        )

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """``execute_all_async`` and wait; one answer per rank."""
        return self._get(
            self.execute_all_async(method_name, *args, **kwargs), list(range(self.world_size)), method_name
        )

    execute_all_sync = execute_all

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any):
        return getattr(self._workers[0], method_name).remote(*args, **kwargs)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self._get([self.execute_rank_zero_async(method_name, *args, **kwargs)], [0], method_name)[0]

    execute_rank_zero_sync = execute_rank_zero

    def check_alive(self, timeout_s: float = 30.0) -> None:
        """Raise WorkerGroupError naming every rank whose process is dead or does not answer in time."""
        refs = [w.__ray_ready__.remote() for w in self._workers]
        self._get(refs, list(range(self.world_size)), "check_alive", timeout_s=timeout_s)

    # ------------------------------------------------------------------ colocated roles
    def spawn(self, prefix_set: Any) -> dict:
        """Per-role views of a group built from ``create_colocated_worker_cls``: view ``role`` exposes
        ``role_<method>`` as ``<method>`` on the same actors."""
        role_methods: dict = getattr(self.worker_cls, "_role_methods", {})
        views = {}
        for prefix in prefix_set:
            if prefix not in role_methods:
                raise ValueError(f"{self!r} has no role '{prefix}'; roles: {sorted(role_methods)}")
            view = copy.copy(self)
            view._bound_method_names = list(self._bound_method_names)
            for method_name in role_methods[prefix]:
                if hasattr(type(self), method_name):
                    raise ValueError(f"role '{prefix}' method '{method_name}' clashes with a RayWorkerGroup attribute")
                setattr(view, method_name, getattr(self, f"{prefix}_{method_name}"))
            views[prefix] = view
        return views
