"""Preemption-safe stop: SIGTERM/SIGINT ask the driver loop to stop at the next step boundary.

Slurm and Kubernetes send SIGTERM some time before they kill a job; Ctrl-C sends SIGINT. Inside
``GracefulStop`` the first such signal only records itself (the current step finishes, the trainer
saves a checkpoint and returns); a second one aborts at once with ``AbortedBySignal``, a
``SystemExit`` carrying ``exit_code(signum)``: the process ends with that code and no traceback (the
launcher's ``finally`` blocks still release Ray and the trackers). Handlers are installed only in the
main thread and the previous ones (Ray's driver installs its own) are restored on exit.
``exit_code(signum)`` is the shell convention 128 + signal number (143 for SIGTERM, 130 for SIGINT),
for the first signal (after the save) and the second alike.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from typing import Optional

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    return 128 + int(signum)


class AbortedBySignal(SystemExit):
    """A second stop signal: exit now with ``exit_code(signum)``; ``str()`` says why (no traceback is printed
    for a SystemExit)."""

    def __init__(self, signum: int, message: str):
        super().__init__(exit_code(signum))
        self.signum = int(signum)
        self.message = message

    def __str__(self) -> str:
        return self.message


class GracefulStop:
    """Context manager; ``requested`` turns True (and ``signum`` is set) after the first stop signal."""

    def __init__(self, enabled: bool = True, signals=STOP_SIGNALS, what: str = "the current step"):
        self.enabled = enabled
        self.signals = tuple(signals)
        self.what = what
        self.signum: Optional[int] = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def save_requested(self, save_on_signal: bool) -> bool:
        """A stop signal arrived and the run saves on a stop signal (``trainer.save_on_signal``)."""
        return self.requested and bool(save_on_signal)

    def _handle(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self._restore()
            message = (
                f"second stop signal ({name}): aborting without waiting for {self.what}; exit code {exit_code(signum)}"
            )
            logger.warning("%s", message)
            raise AbortedBySignal(signum, message)
        self.signum = signum
        logger.warning(
            "received %s: finishing %s, then saving and exiting (send it again to abort now)", name, self.what
        )

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> "GracefulStop":
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()


def stop_on_signal(what: str = "the current step", attr: str = "stop"):
    """Decorate a method so it runs inside a ``GracefulStop`` stored as ``self.<attr>`` (kept after return)."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            with GracefulStop(what=what) as stop:
                setattr(self, attr, stop)
                return method(self, *args, **kwargs)

        return wrapper

    return decorate
