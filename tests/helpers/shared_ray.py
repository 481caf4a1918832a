"""One local Ray instance that several driver processes join (RAY_ADDRESS), as drivers join a cluster.

Starting Ray costs a driver several seconds and CPU-seconds (GCS, raylet, agents); tests that run many
short drivers whose Ray start-up is not what they check share one instance through this keeper. The
keeper is a child process that runs ``ray.init(address="local")`` (no ``ray start``: nothing is written to
/tmp/ray/ray_current_cluster, so no other process on the machine attaches to it by accident) and stops
its own instance when ``close()`` closes its stdin; ``ray stop`` would stop every Ray on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

_KEEPER = """
import sys
import ray
ray.init(address="local", num_cpus={num_cpus}, include_dashboard=False, log_to_driver=False)
print("RAY_GCS_ADDRESS", ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


class SharedRay:
    """``address``: what drivers pass as RAY_ADDRESS. Workers inherit the keeper's environment (``env``)."""

    def __init__(self, num_cpus: int = 8, env: dict | None = None, cwd: str | None = None, timeout_s: float = 300):
        env = dict(os.environ if env is None else env)
        env.pop("RAY_ADDRESS", None)
        env.setdefault("RAY_AUTH_MODE", "disabled")
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray would start num_cpus idle task workers for the keeper (its first driver): nobody runs tasks
        # on them, and each costs a Python start-up. The drivers' actors get workers of their own.
        env["RAY_prestart_worker_first_driver"] = "0"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _KEEPER.format(num_cpus=int(num_cpus))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        watchdog = threading.Timer(timeout_s, self.proc.kill)  # a keeper that never comes up fails the fixture
        watchdog.start()
        try:
            self.address = None
            for line in self.proc.stdout:
                if line.startswith("RAY_GCS_ADDRESS "):
                    self.address = line.split()[1]
                    break
        finally:
            watchdog.cancel()
        if self.address is None:
            self.close()
            raise RuntimeError(f"the shared Ray keeper did not start (exit {self.proc.poll()})")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)

    def __enter__(self) -> "SharedRay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
