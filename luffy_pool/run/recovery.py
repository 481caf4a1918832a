"""Automatic recovery from a lost worker or node: the restart policy and the capacity wait.

With ``trainer.max_restarts > 0`` the launcher (``fit_and_close``) hands a failed ``fit`` to :class:`Recovery`:
the failure is classified (:func:`classify_failure`); a recoverable one (a Ray actor or node died, the OS or
Ray's memory monitor killed a rank, a collective timed out or lost its peer) is restarted unless it replays: the
same cause at a step no later than the one its last restart was for, or ``max_restarts`` restarts without
progress (:class:`RestartPolicy`). A restart stops the remaining workers and frees their placement groups, waits
up to ``trainer.restart_wait_s`` until the Ray cluster can host the world again (:func:`wait_for_capacity`:
``nnodes`` node groups of ``n_gpus_per_node`` ranks, each on its own alive node, and with split engines
(``hybrid_engine=False``) the rollout pool's ``rollout.nnodes`` groups of ``rollout.n_gpus_per_node`` too),
rebuilds the run with ``build_trainer`` (same tracker) and resumes from the newest checkpoint this run saved
(``resume_mode=auto``), or as the run first started when it saved none (:func:`restart_resume_mode`). Each
restart is one WARNING line and ``trainer/restarts`` / ``trainer/steps_lost`` in the next step's metrics. A
config or user error is never restarted.

The policy, the classification and the capacity test are pure (time source and node listing injectable);
only :class:`Recovery` touches Ray and the launcher.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

logger = logging.getLogger(__name__)

RESTARTS_METRIC = "trainer/restarts"
STEPS_LOST_METRIC = "trainer/steps_lost"

# Causes a restart can cure: the process or node is gone, not the program wrong.
WORKER_DIED, NODE_DIED, OOM_KILLED, COLLECTIVE_TIMEOUT = "worker_died", "node_died", "oom_killed", "collective_timeout"
RECOVERABLE = (WORKER_DIED, NODE_DIED, OOM_KILLED, COLLECTIVE_TIMEOUT)

# A surviving rank's view of a lost peer (gloo / NCCL / torch.distributed), and of a collective that timed out.
_PEER_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "econnreset",
    "socket closed",
    "ncclremoteerror",
    "remote process exited",
)
_TIMEOUT = (
    "collective operation timeout",
    "watchdog caught collective",
    "timed out",
    "timeout",
    "disttimeouterror",
    "distbackenderror",
)
# In a dead actor's message only: the process was killed for memory (a CUDA OOM raised in a rank is not a kill).
_MEMORY_KILL = re.compile(r"out of memory|\boom\b|oom.kill|low on memory|memory monitor|outofmemoryerror")
_IP_RE = re.compile(r"\bip:\s*([0-9a-fA-F.:]+)")


@dataclass(frozen=True)
class Failure:
    """What ended a ``fit``: ``cause`` (one of RECOVERABLE, or the exception's type name), whether a restart can
    cure it, a one-line ``detail`` and the node's ip when Ray named it."""

    cause: str
    recoverable: bool
    detail: str
    node: Optional[str] = None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _chain(exc: BaseException) -> list:
    """``exc``, its causes/contexts and, for a worker-group error, every rank's error (no repeats)."""
    seen, out, todo = set(), [], [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen or not isinstance(e, BaseException):
            continue
        seen.add(id(e))
        out.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
        todo += [v for v in (getattr(e, "failures", None) or {}).values() if isinstance(v, BaseException)]
    return out


def _texts(exc: BaseException) -> list:
    """Every message in the chain, including a worker-group error's per-rank descriptions."""
    texts = [str(e) for e in _chain(exc)]
    texts += [str(v) for e in _chain(exc) for v in (getattr(e, "failures", None) or {}).values()]
    return texts


def classify_failure(exc: BaseException) -> Failure:
    """Sort a ``fit`` failure into a recoverable cause or not (see the module docstring)."""
    import ray.exceptions as rex

    from luffy_pool.run.checkpointing import CheckpointSaveError, CheckpointUnusableError, ResumeRefusedError

    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):  # a stop signal, an exit: never restart
        return Failure(type(exc).__name__, False, _one_line(exc or type(exc).__name__))
    chain = _chain(exc)
    if any(isinstance(e, (CheckpointUnusableError, ResumeRefusedError, CheckpointSaveError)) for e in chain):
        return Failure(type(exc).__name__, False, _one_line(exc))  # a restart would meet the same checkpoint/disk
    node = next((m.group(1) for t in _texts(exc) for m in [_IP_RE.search(t)] if m), None)
    for e in chain:
        if isinstance(e, rex.NodeDiedError):
            return Failure(NODE_DIED, True, _one_line(e), node)
        if isinstance(e, rex.OutOfMemoryError):
            return Failure(OOM_KILLED, True, _one_line(e), node)
    died = [
        e
        for e in chain
        if isinstance(e, (rex.RayActorError, rex.WorkerCrashedError)) and not getattr(e, "actor_init_failed", False)
    ]
    if died:
        text = _one_line(str(died[0]))
        lowered = text.lower()
        if "node" in lowered and ("died" in lowered or "dead" in lowered) and "actor died" not in lowered:
            return Failure(NODE_DIED, True, text, node)
        if _MEMORY_KILL.search(lowered):
            return Failure(OOM_KILLED, True, text, node)
        return Failure(WORKER_DIED, True, text, node)
    if any(getattr(e, "timed_out", False) for e in chain):  # a worker-group call past its call_timeout_s
        return Failure(COLLECTIVE_TIMEOUT, True, _one_line(exc), node)
    lowered = " ".join(_texts(exc)).lower()
    if (
        any(k in lowered for k in _PEER_LOST)
        or ("collective" in lowered or "gloo" in lowered or "nccl" in lowered)
        and any(k in lowered for k in _TIMEOUT)
    ):
        return Failure(COLLECTIVE_TIMEOUT, True, _one_line(exc), node)
    return Failure(type(exc).__name__, False, _one_line(exc))


@dataclass
class Decision:
    restart: bool
    attempt: int  # this restart's number since training last made progress; 0 when not restarting
    reason: str = ""


@dataclass
class RestartPolicy:
    """When a failure is restarted. A restart resumes from the newest checkpoint and replays the steps since, so
    a deterministic failure (a bad batch, a kernel that always faults at one step) comes back at the same step:
    the same cause at a step no later than the one its last restart was for ends the run (no step was completed
    past it), whatever ``max_restarts`` says. Otherwise a failure restarts while fewer than ``max_restarts``
    (``trainer.max_restarts``; 0 = never) restarts were made since the failing step last advanced (another cause
    at the same step, or a worker lost while the rebuilt group starts, counts against it)."""

    max_restarts: int
    last_step: dict = field(default_factory=dict)  # cause -> the step its last restart was for
    streak: int = 0  # restarts since the failing step last advanced
    streak_step: Optional[int] = None  # the failing step of those restarts
    total: int = 0

    def decide(self, failure: Failure, step: int, replay: bool = True) -> Decision:
        """``replay=False``: a failure while the rebuilt run starts (no step replayed yet), counted against
        ``max_restarts`` only."""
        if not failure.recoverable:
            return Decision(False, 0, f"{failure.cause} is not recoverable by a restart: {failure.detail}")
        if self.max_restarts <= 0:
            return Decision(False, 0, "trainer.max_restarts=0: no automatic restart")
        step = int(step)
        last = self.last_step.get(failure.cause)
        if replay and last is not None and step <= last:
            return Decision(
                False,
                0,
                f"{failure.cause} at step {step} again after the restart for it at step {last} "
                f"(no step past it completed since, so it replays from the checkpoint; trainer."
                f"max_restarts={self.max_restarts} restarts a cause again only at a later "
                f"step): {failure.detail}",
            )
        if self.streak_step is None or step > self.streak_step:
            self.streak, self.streak_step = 0, step  # training progressed since the last restart
        if self.streak >= self.max_restarts:
            return Decision(
                False,
                0,
                f"{failure.cause} at step {step} after {self.streak} restart(s) there without "
                f"progress (trainer.max_restarts={self.max_restarts}): {failure.detail}",
            )
        if replay:
            self.last_step[failure.cause] = step
        self.streak += 1
        self.total += 1
        return Decision(True, self.streak)


def restart_resume_mode(original: str, in_root: bool) -> str:
    """``trainer.resume_mode`` of the rebuilt run: ``auto`` (the newest intact checkpoint under default_local_dir)
    once the run's checkpoint is there (``saved_in_root``), else the run's own mode (``disable`` trains from step 1
    again; a checkpoint named by path is named again)."""
    return "auto" if in_root else str(original)


def saved_in_root(ckpt) -> bool:
    """Whether the checkpoint this process last saved or resumed from is the one ``resume_mode=auto`` finds under
    ``default_local_dir`` (its tracker names it); a run resumed from a folder elsewhere and not saved since is not."""
    from verl.utils.checkpoint import layout

    if ckpt is None or ckpt.last_saved_step is None:
        return False
    try:
        return layout.read_tracker(ckpt.root) == int(ckpt.last_saved_step)
    except ValueError:  # an unreadable tracker: auto could not use it either
        return False


def world_shape(nnodes: int, per_node: int, use_gpu: bool) -> tuple[list, dict]:
    """(ranks per node group, one rank's bundle) as ``build_worker_group``'s resource pool asks for them."""
    bundle = {"CPU": 1.0, "GPU": 1.0} if use_gpu else {"CPU": 1.0}
    return [int(per_node)] * int(nnodes), bundle


def _place(free: list, groups: list, bundle: dict) -> bool:
    """Depth-first placement of ``groups`` = [(pool, ranks)] (largest first) onto ``free`` = [[resources, pools
    placed there]]: a group needs ``ranks x bundle`` free on a node no other group of its pool uses. Nodes with
    the same free resources and pools are tried once (a homogeneous cluster is a single path)."""
    if not groups:
        return True
    (pool, count), rest = groups[0], groups[1:]
    tried = set()
    for node in sorted(free, key=lambda n: tuple(n[0].get(k, 0.0) for k in sorted(bundle))):  # best fit first
        res, pools = node
        sig = (tuple(sorted(res.items())), tuple(sorted(pools)))
        if pool in pools or sig in tried or not all(res.get(k, 0.0) >= v * count for k, v in bundle.items()):
            continue
        tried.add(sig)
        for k, v in bundle.items():
            res[k] = res.get(k, 0.0) - v * count
        pools.append(pool)
        if _place(free, rest, bundle):
            return True
        pools.pop()
        for k, v in bundle.items():
            res[k] += v * count
    return False


def can_host(
    nodes: Iterable[dict], process_on_nodes: list, bundle: dict, rollout_groups: Optional[list] = None
) -> bool:
    """Whether alive nodes (``ray.nodes()`` rows) can hold every node group, each on a node of its own with the
    group's resources. ``rollout_groups``: the split rollout pool's node groups (same bundle), each on a node of
    its own too but free to share a node with an actor group, as two resource pools' placement groups are."""
    free = [[dict(n.get("Resources") or {}), []] for n in nodes if n.get("Alive")]
    groups = [(0, int(c)) for c in process_on_nodes] + [(1, int(c)) for c in (rollout_groups or [])]
    return _place(free, sorted(groups, key=lambda g: -g[1]), bundle)


class CapacityTimeout(TimeoutError):
    """The cluster could not host the world within ``trainer.restart_wait_s``."""


def wait_for_capacity(
    process_on_nodes: list,
    bundle: dict,
    wait_s: float,
    nodes_fn: Callable[[], list],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 2.0,
    should_stop: Callable[[], bool] = lambda: False,
    rollout_groups: Optional[list] = None,
) -> float:
    """Poll ``nodes_fn()`` until :func:`can_host` holds (the actor's node groups and, with split engines, the
    rollout pool's ``rollout_groups``); returns the seconds waited (0.0: it could at once). Raises
    :class:`CapacityTimeout` naming the keys after ``wait_s``; returns early (-1) when ``should_stop()``."""
    start, first = clock(), True
    while True:
        nodes = nodes_fn()
        if can_host(nodes, process_on_nodes, bundle, rollout_groups):
            return 0.0 if first else clock() - start
        first = False
        if should_stop():
            return -1.0
        waited = clock() - start
        if waited >= wait_s:
            alive = [
                {k: v for k, v in (n.get("Resources") or {}).items() if k in bundle} for n in nodes if n.get("Alive")
            ]
            world = f"{len(process_on_nodes)} node group(s) of {max(process_on_nodes)} rank(s)"
            keys = "trainer.nnodes / trainer.n_gpus_per_node"
            if rollout_groups:
                world += (
                    f" + {len(rollout_groups)} rollout node group(s) of {max(rollout_groups)} rank(s) "
                    f"(hybrid_engine=False)"
                )
                keys += " or actor_rollout_ref.rollout.nnodes / actor_rollout_ref.rollout.n_gpus_per_node"
            raise CapacityTimeout(
                f"the Ray cluster cannot host {world} x {bundle} (alive nodes: {alive}) after waiting "
                f"trainer.restart_wait_s={wait_s:g} s; add nodes, or lower {keys} and resume "
                f"(trainer.max_restarts gave up)"
            )
        sleep(min(poll_s, max(wait_s - waited, 0.0)))


def restart_line(failure: Failure, step: int, resume_step: int, attempt: int, max_restarts: int, total: int) -> str:
    """The one WARNING line of a restart."""
    where = f"node {failure.node}" if failure.node else "node unknown"
    return (
        f"restart {attempt} of {max_restarts} (trainer.max_restarts) for {failure.cause} at step {step} "
        f"({where}): {failure.detail}; resuming from step {resume_step}, {step - resume_step} step(s) lost; "
        f"{total} restart(s) in this run"
    )


class Recovery:
    """The launcher's half: ``restart(trainer, close, exc)`` -> ``(trainer, close)`` of the rebuilt run, or None
    when the failure ends the run (the caller re-raises it)."""

    def __init__(
        self,
        config,
        sections,
        rebuild: Callable,
        use_gpu: bool,
        nodes_fn: Optional[Callable] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_s: float = 2.0,
    ):
        t = sections.trainer
        self.config = copy.deepcopy(config)  # the run as it started; each rebuild starts from a copy
        self.original_resume_mode = str(t.resume_mode)
        self.policy = RestartPolicy(int(t.max_restarts))
        self.wait_s = float(t.restart_wait_s)
        self.nnodes, self.per_node = int(t.nnodes), int(t.n_gpus_per_node)
        self.rebuild = rebuild  # build_trainer(config, tracker=...)
        self.world = world_shape(self.nnodes, self.per_node, use_gpu)  # (node groups, bundle) a restart waits for
        w = sections.workers
        # Split engines (hybrid_engine=False) are a resource pool of their own (launcher.build_rollout_group),
        # with the actor's bundle: the rebuilt run places both, so the wait asks for both.
        self.rollout_groups = (
            None if w.hybrid_engine else world_shape(int(w.rollout.nnodes), int(w.rollout.n_gpus_per_node), use_gpu)[0]
        )
        self.nodes_fn = nodes_fn  # None: ray.nodes
        self.clock, self.sleep, self.poll_s = clock, sleep, poll_s

    def restart(self, trainer, close, exc: BaseException):
        from verl.utils.signals import AbortedBySignal, GracefulStop, exit_code

        if trainer.stop.requested:  # a stop signal came first: the run ends as the signal asked
            return None
        failure = classify_failure(exc)
        step = int(trainer.global_steps)
        decision = self.policy.decide(failure, step)
        if not decision.restart:
            if failure.recoverable and self.policy.max_restarts > 0:
                logger.error("no restart: %s", decision.reason)
            return None
        ckpt = trainer.checkpointer
        saved = ckpt.last_saved_step if ckpt is not None else None
        resume_step = int(saved or 0)
        logger.warning(
            "%s",
            restart_line(failure, step, resume_step, decision.attempt, self.policy.max_restarts, self.policy.total),
        )
        close(keep_tracker=True)  # kill the remaining workers, free their placement groups and the reward pool
        process_on_nodes, bundle = self.world
        if self.nodes_fn is None:
            import ray

            self.nodes_fn = ray.nodes
        config = copy.deepcopy(self.config)
        config.trainer.resume_mode = restart_resume_mode(self.original_resume_mode, saved_in_root(ckpt))

        def stopped(signum: int):
            message = (
                f"stopped by signal {signum} during a restart; the newest checkpoint is step {resume_step}; "
                f"exit code {exit_code(signum)}"
            )
            logger.warning("%s", message)
            return AbortedBySignal(signum, message)

        with GracefulStop(what="the restart") as stop:  # SIGTERM while waiting or rebuilding ends the run at once
            while True:
                waited = wait_for_capacity(
                    process_on_nodes,
                    bundle,
                    self.wait_s,
                    self.nodes_fn,
                    clock=self.clock,
                    sleep=self.sleep,
                    poll_s=self.poll_s,
                    should_stop=lambda: stop.requested,
                    rollout_groups=self.rollout_groups,
                )
                if stop.requested:
                    raise stopped(stop.signum)
                if waited > 0:
                    logger.warning("the Ray cluster can host the world again after %.0f s", waited)
                try:
                    new_trainer, new_close = self.rebuild(config, tracker=trainer.tracker)
                    break
                except Exception as again:  # noqa: BLE001 - e.g. a node lost while the new workers start
                    if stop.requested:
                        raise stopped(stop.signum) from again
                    failure = classify_failure(again)
                    decision = self.policy.decide(failure, step, replay=False)  # no step ran: not a replay
                    if not decision.restart:
                        if failure.recoverable:
                            logger.error("no restart: %s", decision.reason)
                        raise
                    logger.warning(
                        "%s",
                        restart_line(
                            failure, step, resume_step, decision.attempt, self.policy.max_restarts, self.policy.total
                        ),
                    )
            if stop.requested:
                new_close(keep_tracker=True)  # the caller's close() finishes the tracker
                raise stopped(stop.signum)
        new_trainer.pending_metrics = {RESTARTS_METRIC: self.policy.total, STEPS_LOST_METRIC: step - resume_step}
        return new_trainer, new_close
