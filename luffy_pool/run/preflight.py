"""Pre-flight checks of a run's files, before any tokenizer, model or Ray worker is loaded.

A run that cannot write its checkpoints, load its model or read its data should fail in its first
second, not after initialisation, validation and a training step. ``preflight(config)`` checks the
output folders (created and written to; the checkpoint mirror ``trainer.default_hdfs_dir`` too), the model and tokenizer folders (``config.json`` and
tokenizer files; a bare hub name must be in the local cache or the hub reachable, so an offline
machine fails at once instead of waiting on retries), and every data file (readable as parquet, the
expected columns present, at least one row, no blank prompt, valid UTF-8), and that an explicit
flash-attention kernel has its package installed. All problems are reported
together, one line each naming the key, path, row and column; ``PreflightError`` is a ``ConfigError``
so ``main_mix_ppo`` prints them like config errors (exit code 2).
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Optional
from urllib.parse import urlparse

from luffy_pool.config.check import ConfigError
from verl.utils.dataset.value_checks import prompt_is_blank

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
HUB_PROBE_TIMEOUT_S = 3.0


class PreflightError(ConfigError):
    """One line per problem found before start-up."""


class InputError(PreflightError):
    """A data file refused while it is loaded (names the file, row and column); printed like config errors."""


# A CPU run may put a few ranks on one core (the tests run 4 on 2); beyond this many per core the run
# makes no progress (64 ranks on 2 cores once started 56+ Ray workers and printed nothing).
MAX_CPU_RANKS_PER_CORE = 4


def _files(value) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, (str, os.PathLike)) else [str(v) for v in value]


# ---------------------------------------------------------------------- output folders
def check_writable_dir(path: str, key: str) -> Optional[str]:
    """Create ``path`` if needed and write/remove a probe file in it."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write_probe_{uuid.uuid4().hex[:8]}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        return f"{key}={path}: not writable ({exc.strerror or type(exc).__name__})"
    return None


def check_mirror_dir(target: str, key: str = "trainer.default_hdfs_dir") -> Optional[str]:
    """The checkpoint mirror: a local path must be writable; a URL needs its fsspec backend and a
    successful probe write (so a wrong bucket or missing package fails now, not after the first save)."""
    from verl.utils.checkpoint.mirror import is_url

    if not is_url(target):
        return check_writable_dir(target, key)
    try:
        import fsspec

        fs, root = fsspec.core.url_to_fs(target)
    except (ImportError, ValueError) as exc:
        return f"{key}={target}: no fsspec backend for this scheme ({type(exc).__name__}: {exc})"
    probe = f"{root.rstrip('/')}/.write_probe_{uuid.uuid4().hex[:8]}"
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(probe, "wb") as f:
            f.write(b"ok")
        fs.rm(probe)
    except Exception as exc:  # noqa: BLE001 - every backend has its own errors; the line names it
        return f"{key}={target}: not writable ({type(exc).__name__}: {str(exc)[:200]})"
    return None


# ---------------------------------------------------------------------- model folders
def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or os.sep in name.replace("/", "")


def _hub_reachable() -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "huggingface.co", port), timeout=HUB_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _in_hub_cache(repo_id: str) -> bool:
    """The id's snapshot is in the cache the workers will read (HF_HUB_CACHE / HF_HOME as set now)."""
    from verl.utils.model_source import cached_snapshot

    snap = cached_snapshot(repo_id)
    return snap is not None and os.path.isfile(os.path.join(snap, "config.json"))


def check_model_source(name: str, key: str, need_config: bool = True) -> Optional[str]:
    """A local folder with config + tokenizer, or a hub name that is cached or can be downloaded now."""
    path = os.path.expanduser(name)
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{key}={name}: is a file; expected a model folder (config.json and tokenizer files)"
        present = set(os.listdir(path))
        if need_config and "config.json" not in present:
            return f"{key}={name}: the folder has no config.json (not a HuggingFace model folder)"
        if not present.intersection(TOKENIZER_FILES):
            return f"{key}={name}: the folder has no tokenizer ({' / '.join(TOKENIZER_FILES)})"
        return None
    if _looks_like_path(name):
        return f"{key}={name}: the folder does not exist"
    if _in_hub_cache(name):
        return None
    from verl.utils.model_source import unresolved_message

    offline = [
        v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(v, "").lower() in ("1", "true", "yes")
    ]
    if offline:
        return f"{key}=" + unresolved_message(
            name, f"not a local folder and not in the HuggingFace cache, and {offline[0]} is set"
        )
    if not _hub_reachable():
        return f"{key}=" + unresolved_message(
            name,
            f"not a local folder, not in the HuggingFace cache, and "
            f"{os.environ.get('HF_ENDPOINT', 'https://huggingface.co')} is unreachable (offline?)",
        )
    return None


def check_model_architecture(name: str, key: str) -> Optional[str]:
    """A model the workers cannot train, named before Ray starts (mixture of experts: why in
    luffy_pool.tiny.model_config.refusal); None when it trains or its config is not readable here yet."""
    import json

    from luffy_pool.tiny.model_config import refusal

    path = os.path.expanduser(name)
    config = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if config is None and not _looks_like_path(name):
        from verl.utils.model_source import cached_snapshot

        snapshot = cached_snapshot(name)
        config = os.path.join(snapshot, "config.json") if snapshot else None
    if not config or not os.path.isfile(config):
        return None
    try:
        with open(config) as f:
            real = json.load(f)
    except (OSError, ValueError):
        return None  # the workers' own load names a config that does not parse
    why = refusal(real, config) if isinstance(real, dict) else None
    return f"{key}={name}: {why}" if why else None


# ---------------------------------------------------------------------- data files
def check_parquet(path: str, key: str, columns: tuple[str, ...], prompt_key: Optional[str] = None) -> list[str]:
    """Readable parquet with ``columns``, at least one row, and (with ``prompt_key``) no blank prompt."""
    import pyarrow.parquet as pq

    where = f"{key}: {path}"
    if not os.path.exists(path):
        return [f"{where}: file not found"]
    if not os.path.isfile(path):
        return [f"{where}: not a file"]
    try:
        meta = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors vary; the file and the gist are what help
        return [
            f"{where}: not a readable parquet file ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
        ]
    names = meta.schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        return [f"{where}: missing column {c!r} (columns: {names})" for c in missing]
    if meta.metadata.num_rows == 0:
        return [f"{where}: the file has 0 rows"]
    if prompt_key is None:
        return []
    try:
        column = meta.read(columns=[prompt_key]).column(prompt_key)
    except Exception as exc:  # noqa: BLE001
        return [f"{where}: column {prompt_key!r} cannot be read ({str(exc).strip().splitlines()[0]})"]
    try:
        prompts = column.to_pylist()
    except Exception:  # noqa: BLE001 - find the row that fails (invalid UTF-8 and the like)
        for row in range(len(column)):
            try:
                column[row].as_py()
            except Exception as exc:  # noqa: BLE001
                return [f"{where}: row {row}: column {prompt_key!r}: unreadable value ({type(exc).__name__}: {exc})"]
        raise
    problems = []
    for row, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            blank = not prompt.strip()
        elif isinstance(prompt, (list, tuple)):
            blank = len(prompt) == 0 or prompt_is_blank(prompt)
        else:
            blank = prompt is None
        if blank:
            problems.append(f"{where}: row {row}: column {prompt_key!r}: the prompt is empty")
            if len(problems) >= 5:
                problems.append(f"{where}: (more empty prompts not listed)")
                break
    return problems


def check_attn_implementation(name: str, key: str = "actor_rollout_ref.model.attn_implementation") -> Optional[str]:
    """An explicit flash-attention kernel needs its package here (``auto`` falls back to sdpa instead)."""
    from verl.utils.attn_impl import missing_kernel_package

    dist = missing_kernel_package(name)
    if dist is None:
        return None
    return (
        f"'{key}'={name} needs the {dist} package, which is not installed here "
        f"(pip install {dist}, or set {key}=auto to fall back to sdpa)"
    )


def check_trackers(sections) -> list[str]:
    """The trackers of ``trainer.logger`` can start here (wandb: a login or WANDB_MODE=offline/disabled, and its
    server answers): otherwise the run would fail only after every rank has loaded the model."""
    from verl.utils.tracking import tracker_problems

    return tracker_problems(sections.trainer.logger)


def check_demonstrations(path: str, target_key: str, method_name: str) -> Optional[str]:
    """A method that trains on every prompt's demonstration (``Method.needs_demonstration``)
    refuses a train row whose ``target_key`` is null (LUFFY allows it: that prompt gets no off-policy slot); the
    first such row, naming file, row and column. Missing files and columns are ``check_parquet``'s."""
    import pyarrow.parquet as pq

    from luffy_pool.methods import get_method

    method = get_method(method_name)
    if not method.needs_demonstration or not os.path.isfile(path):
        return None
    try:
        column = pq.ParquetFile(path).read(columns=[target_key]).column(target_key)
    except Exception:  # noqa: BLE001 - unreadable file or missing column: check_parquet says so
        return None
    nulls = column.is_null()
    if not nulls.to_pylist().count(True):
        return None
    row = nulls.to_pylist().index(True)
    return (
        f"data.train_files: {path}: row {row}: column {target_key!r} is null, but algorithm.method={method.name} "
        f"trains on every prompt's demonstration"
    )


def check_method_inputs(path: str, sections) -> Optional[str]:
    """The method's own input check of a train file (``Method.check_train_file``), if any."""
    from luffy_pool.methods import get_method

    check = get_method(sections.algorithm.method).check_train_file
    return None if check is None else check(path, sections)


def check_question_ids(paths: list[str], method_name: str) -> Optional[str]:
    """A method that keeps state per question (``Method.needs_question_ids``) needs one id per train row:
    ``extra_info.index`` on every row, unique over all train files, or on none (then the row position is the id,
    as the authors' ``dataframe_uid``). The first row without one, or repeating one, naming file, row and column."""
    import pyarrow.parquet as pq

    from luffy_pool.methods import get_method

    method = get_method(method_name)
    if not method.needs_question_ids:
        return None
    ids: list[tuple[str, int, object]] = []  # (file, row, index or None)
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            schema = pq.ParquetFile(path).schema_arrow
            if "extra_info" not in schema.names:
                ids += [(path, row, None) for row in range(pq.ParquetFile(path).metadata.num_rows)]
                continue
            infos = pq.ParquetFile(path).read(columns=["extra_info"]).column("extra_info").to_pylist()
        except Exception:  # noqa: BLE001 - unreadable file: check_parquet says so
            return None
        ids += [(path, row, info.get("index") if isinstance(info, dict) else None) for row, info in enumerate(infos)]
    with_id = [i for i in ids if i[2] is not None]
    if not with_id:
        return None
    need = f"algorithm.method={method.name} keys its experience by question id"
    if len(with_id) != len(ids):
        path, row, _ = next(i for i in ids if i[2] is None)
        first = with_id[0]
        return (
            f"data.train_files: {path}: row {row}: column 'extra_info.index' is missing, but {first[0]} row "
            f"{first[1]} has one; {need}: give every row an index or none (the row position is used then)"
        )
    seen: dict = {}
    for path, row, value in with_id:
        value = value if isinstance(value, (int, str)) else repr(value)
        if value in seen:
            return (
                f"data.train_files: {path}: row {row}: column 'extra_info.index' repeats {value!r} of "
                f"{seen[value][0]} row {seen[value][1]}; {need}, so the ids must be unique"
            )
        seen[value] = (path, row)
    return None


# ---------------------------------------------------------------------- all of it
def preflight(config, sections=None) -> None:
    """Raise ``PreflightError`` listing every problem with the run's folders and files; ``sections``: the run's
    ``ConfigSections`` (built from ``config`` when a caller checks a config on its own)."""
    from luffy_pool.config.sections import ConfigSections

    errors: list[str] = []
    sections = sections or ConfigSections.from_config(config)
    t, d = sections.trainer, sections.data
    for key, value in (
        ("trainer.default_local_dir", t.default_local_dir),
        ("trainer.rollout_data_dir", t.rollout_data_dir),
    ):
        if value:
            errors.append(check_writable_dir(str(value), key))
    if t.default_hdfs_dir:  # the checkpoint mirror is written after every save
        errors.append(check_mirror_dir(str(t.default_hdfs_dir)))
    orm, model = sections.reward.orm, sections.workers.model
    if orm.enable and orm.cache_path:
        errors.append(
            check_writable_dir(os.path.dirname(os.path.abspath(str(orm.cache_path))), "reward.orm.cache_path")
        )
    errors.append(
        check_model_source(str(model.path), "actor_rollout_ref.model.path")
        or check_model_architecture(str(model.path), "actor_rollout_ref.model.path")
    )
    errors.append(check_attn_implementation(str(model.attn_implementation)))
    if d.tokenizer:
        errors.append(check_model_source(str(d.tokenizer), "data.tokenizer", need_config=False))
    base = (d.prompt_key, "data_source", "reward_model")
    for path in _files(d.train_files):
        errors += check_parquet(path, "data.train_files", base + (d.target_key,), d.prompt_key)
        errors.append(check_demonstrations(path, d.target_key, sections.algorithm.method))
        errors.append(check_method_inputs(path, sections))
    errors.append(check_question_ids(list(_files(d.train_files)), sections.algorithm.method))
    for path in _files(d.val_files):
        errors += check_parquet(path, "data.val_files", base, d.prompt_key)
    for path in _files(d.off_policy_files):
        errors += check_parquet(path, "data.off_policy_files", (d.off_policy_id_key, "trace"))
    errors += check_trackers(sections)
    errors = [e for e in errors if e]
    if errors:
        raise PreflightError(errors)


# ---------------------------------------------------------------------- the Ray cluster (after init_ray)
def cluster_capacity_problem(
    nnodes: int,
    per_node: int,
    use_gpu: bool,
    resources: dict,
    num_nodes: int,
    cores: float,
    rollout_shape: Optional[tuple] = None,
) -> Optional[str]:
    """Whether ``nnodes x per_node`` rank bundles (plus, on split resources, the rollout engines' own
    ``rollout_shape = (nnodes, per_node)``) fit the cluster; ``cores`` = the CPUs that really exist."""
    world = nnodes * per_node
    gpus, cpus = resources.get("GPU", 0.0), resources.get("CPU", 0.0)
    has = f"the Ray cluster has {gpus:g} GPU(s) and {cores:g} CPU(s) on {num_nodes} node(s)"
    shape = f"trainer.nnodes x trainer.n_gpus_per_node = {nnodes} x {per_node} = {world} ranks"
    lower = "trainer.n_gpus_per_node / trainer.nnodes"
    if rollout_shape is not None:  # hybrid_engine=False: the engines' ranks are bundles of their own
        r_nodes, r_per_node = rollout_shape
        world += r_nodes * r_per_node
        shape += (
            f" + actor_rollout_ref.rollout.nnodes x actor_rollout_ref.rollout.n_gpus_per_node = {r_nodes} x "
            f"{r_per_node} rollout ranks = {world} ranks"
        )
        lower += " or actor_rollout_ref.rollout.n_gpus_per_node / actor_rollout_ref.rollout.nnodes"
    if use_gpu and gpus < world:
        return f"{shape} need {world} GPUs, but {has}; lower {lower}"
    if cpus < world:
        return f"{shape} need {world} CPU bundles, but {has}"
    if not use_gpu and world > MAX_CPU_RANKS_PER_CORE * max(cores, 1):
        return (
            f"{shape} on CPU, but {has} (at most {MAX_CPU_RANKS_PER_CORE} ranks per core make progress); lower {lower}"
        )
    return None


def check_cluster_capacity(sections, use_gpu: bool, started_locally: bool) -> None:
    """Raise ``PreflightError`` when the run's ranks cannot all be placed on the joined/started cluster
    (``sections``: the run's ``ConfigSections``)."""
    import ray

    t = sections.trainer
    resources = ray.cluster_resources()
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001 - the node count only words the message; the totals decide
        alive = []
    # A local instance is started with num_cpus >= the world size, so its CPU count says nothing: use the cores.
    cores = float(os.cpu_count() or 1) if started_locally else resources.get("CPU", 0.0)
    r = sections.workers.rollout
    split = None if sections.workers.hybrid_engine else (int(r.nnodes), int(r.n_gpus_per_node))
    problem = cluster_capacity_problem(
        int(t.nnodes), int(t.n_gpus_per_node), use_gpu, resources, len(alive) or 1, cores, rollout_shape=split
    )
    if problem:
        raise PreflightError([problem])
