"""GracefulStop: the first stop signal is recorded; the second exits at once with 128 + signal and no traceback."""

import signal
import subprocess
import sys
import textwrap

import pytest

from verl.utils.signals import AbortedBySignal, GracefulStop, exit_code

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from verl.utils.signals import GracefulStop
    with GracefulStop(what="the test step") as stop:
        os.kill(os.getpid(), signal.{sig})
        time.sleep(0.1)
        assert stop.requested
        print("first recorded", flush=True)
        os.kill(os.getpid(), signal.{sig})
        time.sleep(5)
    print("not reached", flush=True)
""")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_second_signal_exits_with_the_documented_code_and_no_traceback(sig):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_code(getattr(signal, sig)) == {"SIGTERM": 143, "SIGINT": 130}[sig]
    assert "first recorded" in proc.stdout and "not reached" not in proc.stdout
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert f"second stop signal ({sig})" in proc.stderr  # one warning line says why


def test_aborted_by_signal_is_a_system_exit_with_the_code():
    err = AbortedBySignal(signal.SIGTERM, "why")
    assert isinstance(err, SystemExit) and err.code == 143 and str(err) == "why"
    with GracefulStop() as stop:
        assert not stop.requested
    assert signal.getsignal(signal.SIGTERM) is not stop._handle  # previous handler restored
