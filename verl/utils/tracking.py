"""Experiment tracking: one ``log(metrics, step)`` call fans out to every configured backend.

Backends (``trainer.logger``): ``console`` (one compact line per step), ``jsonl`` (a local metrics file,
``<default_local_dir>/metrics.jsonl``, append-only so a resumed run continues it; readers keep the last
record of a step that was logged twice around a crash, see ``read_metrics_jsonl``), ``wandb`` (runs
under ``<log_dir>/wandb``; ``WANDB_MODE=offline`` works without network) and ``tensorboard`` (event
files under ``<log_dir>/tensorboard`` or ``$TENSORBOARD_DIR``). Secrets (API keys) are never part of
the logged config: string fields named like a secret (``api_key``, ``hf_token``, ``password``) and values
equal to a key/token environment variable are masked, and so is a key inside a URL (``https://key@host``,
``https://user:pass@host``, ``?api_key=...``); ordinary keys (``ppo_max_token_len_per_gpu``) and a
tokenizer's special tokens (``pad_token``, ``eos_token``) are not. ``masked_yaml(config)`` is the form
to print. ``tracker_problems(backends)`` says before start-up why a backend could not start (wandb: no package,
no login, an unreachable server, unless ``WANDB_MODE`` is offline or disabled).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
from typing import Any, Optional

from deepscaler.secret_text import _words, is_secret_name, mask_url  # noqa: F401 - re-exported

_SECRET_ENV_WORDS = {"key", "token", "secret", "password", "passwd", "apikey"}
_MIN_SECRET_LEN = 8
SUPPORTED_BACKENDS = ("console", "jsonl", "wandb", "tensorboard")
METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "val_generations.jsonl"


def _env_secret_values() -> set[str]:
    """Values of environment variables named like keys/tokens (OPENAI_API_KEY, HF_TOKEN, WANDB_API_KEY ...)."""
    return {v for k, v in os.environ.items() if len(v) >= _MIN_SECRET_LEN and _SECRET_ENV_WORDS.intersection(_words(k))}


def mask_secrets(obj, _env_values: Optional[set] = None):
    """Copy of a nested dict/list with secrets replaced by '***': string values of fields named like a
    secret (``api_key``, ``hf_token``, ``password`` ...) and any value equal to a key/token environment
    variable's value. Numbers and ordinary keys (``ppo_max_token_len_per_gpu``) are left alone."""
    env_values = _env_secret_values() if _env_values is None else _env_values
    if isinstance(obj, dict):
        return {
            k: ("***" if isinstance(v, str) and v and is_secret_name(k) else mask_secrets(v, env_values))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [mask_secrets(v, env_values) for v in obj]
    if isinstance(obj, str) and obj in env_values:
        return "***"
    if isinstance(obj, str):
        return mask_url(obj)
    return obj


def masked_yaml(config) -> str:
    """The config (an OmegaConf object or a dict) as YAML with every secret masked, for printing/logging."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    plain = OmegaConf.to_container(config, resolve=True) if isinstance(config, (DictConfig, ListConfig)) else config
    return OmegaConf.to_yaml(OmegaConf.create(mask_secrets(plain)))


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


def _as_scalar(v) -> Optional[float]:
    """A Python float for numbers and one-element tensors/arrays; None for anything else."""
    if isinstance(v, numbers.Real):
        return float(v)
    numel = v.numel() if hasattr(v, "numel") else getattr(v, "size", None)
    if hasattr(v, "item") and numel == 1:
        return float(v.item())
    return None


def _jsonable(v):
    """Scalars as floats (non-finite as strings, JSON has no NaN), sequences as lists, the rest as str."""
    scalar = _as_scalar(v)
    if scalar is not None:
        return scalar if math.isfinite(scalar) else str(scalar)
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, (list, tuple, str, dict)) or v is None:
        return v
    return str(v)


class Tracking:
    """Fan-out logger. ``config`` is a plain dict (already resolved) stored with wandb / jsonl."""

    CONSOLE_KEYS = (
        "critic/score/mean",
        "on_off_metrics/on_score",
        "on_off_metrics/off_score",
        "actor/pg_loss",
        "actor/entropy_loss",
        "actor/off_policy_prob",
        "actor/grad_norm",
        "actor/nonfinite_skips",
        "actor/moe_aux_loss",  # MoE models only (verl/workers/actor/moe_router.py)
        "actor/moe_load_max_over_mean",
        "response_length/mean",
        "val/avg_score",
        "timing_s/step",
        "perf/throughput",
    )

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        backends,
        config: dict | None = None,
        log_dir: str | None = None,
        console_all: bool = False,
    ):
        backends = [backends] if isinstance(backends, str) else list(backends or [])
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; supported: {list(SUPPORTED_BACKENDS)}")
        self.backends = backends
        self.console_all = console_all
        config = mask_secrets(config or {})
        log_dir = log_dir or "."
        self._jsonl = self._wandb = self._tb = None
        if "jsonl" in backends:
            os.makedirs(log_dir, exist_ok=True)
            self._jsonl = open(os.path.join(log_dir, METRICS_FILE), "a", buffering=1)
        if "wandb" in backends:
            import wandb

            wandb_dir = os.path.join(log_dir, "wandb")
            os.makedirs(wandb_dir, exist_ok=True)
            self._wandb = wandb.init(project=project_name, name=experiment_name, config=config, dir=wandb_dir)
        if "tensorboard" in backends:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError(
                    "trainer.logger includes 'tensorboard' but the tensorboard package is not installed "
                    "(pip install tensorboard)"
                ) from err

            self._tb = SummaryWriter(os.environ.get("TENSORBOARD_DIR", os.path.join(log_dir, "tensorboard")))

    def log(self, data: dict, step: int) -> None:
        scalars = {k: s for k, s in ((k, _as_scalar(v)) for k, v in data.items()) if s is not None}
        if "console" in self.backends:
            keys = sorted(scalars) if self.console_all else [k for k in self.CONSOLE_KEYS if k in scalars]
            print(f"step:{step} - " + " - ".join(f"{k}:{_fmt(scalars[k])}" for k in keys), file=sys.stdout, flush=True)
        if self._jsonl is not None:
            record = {"step": step, "time": time.time(), **{k: _jsonable(v) for k, v in data.items()}}
            self._jsonl.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        """Validation samples (``input``, ``output``, ``score`` each) to every backend that can show them:
        a table on the console, a ``val/generations`` wandb Table, and lines of ``val_generations.jsonl``
        next to the jsonl metrics file."""
        if not samples:
            return
        if "console" in self.backends:
            print(format_generations_table(samples, step), file=sys.stdout, flush=True)
        if self._jsonl is not None:
            path = os.path.join(os.path.dirname(self._jsonl.name), GENERATIONS_FILE)
            with open(path, "a") as f:
                for i, s in enumerate(samples):
                    f.write(json.dumps({"step": step, "sample": i, **{k: _jsonable(v) for k, v in s.items()}}) + "\n")
        if self._wandb is not None:
            import wandb

            columns = ["step", "input", "output", "score"]
            table = wandb.Table(columns=columns, data=[[step, s["input"], s["output"], s["score"]] for s in samples])
            self._wandb.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


# ---------------------------------------------------------------------- pre-flight (before any model loads)
WANDB_DEFAULT_URL = "https://api.wandb.ai"
TRACKER_PROBE_TIMEOUT_S = 3.0
_WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")


def _truthy(value: Optional[str]) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def _wandb_settings(env) -> dict:
    """The ``[default]`` section of wandb's user settings file (``wandb login --host`` writes base_url there)."""
    import configparser

    folder = env.get("WANDB_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "wandb")
    parser = configparser.ConfigParser()
    try:
        parser.read(os.path.join(folder, "settings"))
    except configparser.Error:
        return {}
    return dict(parser["default"]) if parser.has_section("default") else {}


def _netrc_has_key(host: str, env) -> Optional[str]:
    """The netrc file that holds a password for ``host`` (where ``wandb login`` stores the key), else None."""
    import netrc

    paths = (
        [env["NETRC"]] if env.get("NETRC") else [os.path.join(os.path.expanduser("~"), n) for n in (".netrc", "_netrc")]
    )
    for path in paths:
        try:
            creds = netrc.netrc(path).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            continue
        if creds and creds[2]:
            return path
    return None


def _reachable(url: str, timeout_s: float) -> bool:
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def wandb_problem(env=None, timeout_s: float = TRACKER_PROBE_TIMEOUT_S) -> Optional[str]:
    """Why ``wandb.init`` would fail here, or None: the package, then (unless ``WANDB_MODE`` is offline/disabled)
    a login (``WANDB_API_KEY``, the settings file's api_key or a netrc entry for the server) and a server that
    answers. Without a login wandb refuses to start in a job (no terminal to ask on), after every rank has loaded."""
    import importlib.util

    env = os.environ if env is None else env
    fix = "set WANDB_MODE=offline (sync later with `wandb sync`) or WANDB_MODE=disabled, or drop wandb from trainer.logger"
    if importlib.util.find_spec("wandb") is None:
        return "trainer.logger includes wandb, but the wandb package is not installed (pip install wandb, or drop wandb from trainer.logger)"
    mode = str(env.get("WANDB_MODE", "")).strip().lower()
    if mode in _WANDB_LOCAL_MODES or _truthy(env.get("WANDB_DISABLED")) or _truthy(env.get("WANDB_OFFLINE")):
        return None
    wandb_settings = _wandb_settings(env)
    url = (env.get("WANDB_BASE_URL") or wandb_settings.get("base_url") or WANDB_DEFAULT_URL).rstrip("/")
    from urllib.parse import urlparse

    host = urlparse(url).netloc
    if not (env.get("WANDB_API_KEY") or wandb_settings.get("api_key") or _netrc_has_key(host, env)):
        return (
            f"trainer.logger includes wandb, but wandb has no login for {url} here (no WANDB_API_KEY, no api_key in "
            f"wandb's settings, no {host} entry in ~/.netrc): run `wandb login`, or {fix}"
        )
    if not _reachable(url, timeout_s):
        return f"trainer.logger includes wandb, but the wandb server {url} is unreachable (offline?): {fix}"
    return None


def tracker_problems(backends, env=None) -> list[str]:
    """One line per configured tracker that cannot start here (checked at pre-flight, before any model loads)."""
    backends = [backends] if isinstance(backends, str) else list(backends or [])
    problems = []  # an unknown name is refused by the config check already
    if "wandb" in backends:
        problems.append(wandb_problem(env))
    if "tensorboard" in backends:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            problems.append(
                "trainer.logger includes tensorboard, but the tensorboard package is not installed "
                "(pip install tensorboard, or drop tensorboard from trainer.logger)"
            )
    return [p for p in problems if p]


def format_generations_table(samples: list[dict], step: int, width: int = 60) -> str:
    """A plain-text table of validation samples (newlines shown as spaces, long texts cut to ``width``)."""

    def cut(text) -> str:
        text = " ".join(str(text).split())
        return text if len(text) <= width else text[: width - 3] + "..."

    lines = [f"val generations at step {step}:", f"{'#':>3} | {'score':>6} | {'input':<{width}} | output"]
    for i, s in enumerate(samples):
        lines.append(f"{i:>3} | {float(s['score']):>6.3f} | {cut(s['input']):<{width}} | {cut(s['output'])}")
    return "\n".join(lines)


def read_metrics_jsonl(path: str) -> dict[int, dict[str, Any]]:
    """``{step: record}`` from a metrics file, steps ascending.

    A step logged twice (the run crashed after logging it and resumed from an earlier checkpoint)
    keeps its last record; a torn final line (killed mid-write) is ignored. ``"nan"``/``"inf"``
    strings come back as floats.
    """
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    records: dict[int, dict[str, Any]] = {}
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
        if "step" not in rec:
            raise ValueError(f"{path}: line {i + 1} has no 'step' field")
        records[int(rec["step"])] = {k: (float(v) if v in ("nan", "inf", "-inf") else v) for k, v in rec.items()}
    return dict(sorted(records.items()))
