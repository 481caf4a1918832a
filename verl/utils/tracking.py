"""Experiment tracking: one ``log(metrics, step)`` call fans out to every configured backend.

Backends (``trainer.logger``): ``console`` (one compact line per step), ``jsonl`` (a local metrics file,
``<default_local_dir>/metrics.jsonl``, append-only so a resumed run continues it), ``wandb`` (offline
mode works without network) and ``tensorboard``. Secrets (API keys) are never part of the logged
config: keys whose name contains ``api_key``/``token``/``secret`` are masked.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

_SECRET_WORDS = ("api_key", "apikey", "token", "secret", "password")
SUPPORTED_BACKENDS = ("console", "jsonl", "wandb", "tensorboard")


def mask_secrets(obj):
    """Copy of a nested dict/list with secret-looking values replaced by '***'."""
    if isinstance(obj, dict):
        return {k: ("***" if any(w in str(k).lower() for w in _SECRET_WORDS) and v else mask_secrets(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_secrets(v) for v in obj]
    return obj


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


class Tracking:
    """Fan-out logger. ``config`` is a plain dict (already resolved) stored with wandb / jsonl."""

    CONSOLE_KEYS = ("critic/score/mean", "on_off_metrics/on_score", "on_off_metrics/off_score", "actor/pg_loss",
                    "actor/entropy_loss", "actor/off_policy_prob", "actor/grad_norm", "response_length/mean",
                    "val/avg_score", "timing_s/step", "perf/throughput")

    def __init__(self, project_name: str, experiment_name: str, backends, config: dict | None = None,
                 log_dir: str | None = None, console_all: bool = False):
        backends = [backends] if isinstance(backends, str) else list(backends or [])
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; supported: {list(SUPPORTED_BACKENDS)}")
        self.backends = backends
        self.console_all = console_all
        config = mask_secrets(config or {})
        self._jsonl = self._wandb = self._tb = None
        if "jsonl" in backends:
            log_dir = log_dir or "."
            os.makedirs(log_dir, exist_ok=True)
            self._jsonl = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1)
        if "wandb" in backends:
            import wandb

            self._wandb = wandb.init(project=project_name, name=experiment_name, config=config)
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            tb_dir = os.environ.get("TENSORBOARD_DIR", os.path.join(log_dir or ".", "tensorboard"))
            self._tb = SummaryWriter(tb_dir)

    def log(self, data: dict, step: int) -> None:
        data = {k: (float(v) if hasattr(v, "item") or isinstance(v, (int, float)) else v) for k, v in data.items()}
        if "console" in self.backends:
            keys = sorted(data) if self.console_all else [k for k in self.CONSOLE_KEYS if k in data]
            print(f"step:{step} - " + " - ".join(f"{k}:{_fmt(data[k])}" for k in keys), file=sys.stdout, flush=True)
        if self._jsonl is not None:
            clean = {k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k, v in data.items()}
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        if self._wandb is not None:
            self._wandb.log(data, step=step)
        if self._tb is not None:
            for k, v in data.items():
                if isinstance(v, float):
                    self._tb.add_scalar(k, v, step)

    def finish(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()
