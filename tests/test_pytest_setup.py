"""The suite's own rules: a per-test timeout, and slow / vllm tests outside the quick loop -m "not e2e"."""

import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

PROBE = '''
import time
import pytest

def test_unit():
    pass

@pytest.mark.slow
def test_gloo_ranks():
    pass

@pytest.mark.vllm
def test_engine():
    pass

@pytest.mark.timeout(1)
def test_hangs():
    time.sleep(30)
'''


def _pytest(tmp_path, *args):
    (tmp_path / "test_probe.py").write_text(PROBE)
    # the repo's pytest.ini and conftest.py, on a probe file outside the repo
    conftest = os.path.join(REPO, "tests", "conftest.py")
    (tmp_path / "conftest.py").write_text(open(conftest).read())
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            os.path.join(REPO, "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )


def test_quick_loop_leaves_out_slow_and_vllm_tests(tmp_path):
    out = _pytest(tmp_path, "-m", "not e2e", "--collect-only")
    assert "test_unit" in out.stdout and "test_hangs" in out.stdout
    assert "test_gloo_ranks" not in out.stdout and "test_engine" not in out.stdout


def test_a_hanging_test_fails_at_its_timeout(tmp_path):
    out = _pytest(tmp_path, "-k", "hangs")
    assert out.returncode == 1 and "Timeout" in out.stdout + out.stderr


def test_the_default_timeout_is_set():
    text = open(os.path.join(REPO, "pytest.ini")).read()
    assert "\ntimeout = 900\n" in text
