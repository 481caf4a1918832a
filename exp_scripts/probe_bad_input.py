"""Probe of bad input, faults and the new user's path: each case is judged by what the user sees.

``python exp_scripts/probe_bad_input.py`` runs every case of ``exp_scripts/probe_bad_input_cases.py`` and
``probe_bad_input_faults.py`` (91, covering the input classes of docs/DESIGN.md §3: G3-G15, "Weak", "New user", "Load"; G1/G2
need a multi-rank resume and are left to tests/luffy_pool/run/test_resume_e2e.py) and prints a table and the totals:

- good: refused (or handled) with one line naming the key / file / row, exit code 2 for a CLI;
- weak: refused, but late, with a traceback, a generic exception or a message that does not name the culprit;
- bad: accepted silently (garbage in, no word), or the case hangs past its time limit.
- n/a: the case cannot run here (e.g. no quickstart console log given); not counted.

Each case is small and bounded: in-process checks run under a SIGALRM limit, the few subprocesses under a
``timeout``; the whole probe takes a few minutes on a quiet 2-core machine. Options: ``-k WORD`` runs the cases
whose id or reference contains WORD, ``--json PATH`` writes the results, ``--quickstart-log PATH`` judges a
quickstart console capture (line count, longest line, config dump), ``--list`` prints the case list.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

VERDICTS = ("good", "weak", "bad", "n/a")
# Exception types that say "something broke inside", not "your input is wrong".
GENERIC_ERRORS = (TypeError, IndexError, KeyError, AttributeError, AssertionError, ZeroDivisionError, RuntimeError)
DEFAULT_TIMEOUT_S = 60.0


@dataclasses.dataclass
class Outcome:
    verdict: str
    seen: str


@dataclasses.dataclass
class Case:
    cid: str
    # the input class (docs/DESIGN.md §3: G1..G15, Weak, User, Load; real models' tokens and sizes: Tokens, Lengths,
    # Memory, Restart, Fork) or "extra"
    ref: str
    title: str
    fn: Callable[["Context"], Outcome]
    timeout_s: float = DEFAULT_TIMEOUT_S


class CaseTimeout(BaseException):
    """Raised by the alarm in the probe's main thread (a BaseException: the code under test cannot swallow it)."""


class Context:
    """Shared, lazily built inputs: a tiny model + tokenizer and the tiny task's parquets, and a scratch folder."""

    def __init__(self, root: str, quickstart_log: Optional[str] = None):
        self.root = root
        self.quickstart_log = quickstart_log
        self._tokenizer = None
        self._model_dir = None
        self._task_dir = None
        self._n = 0

    def tmp(self, name: str = "case") -> str:
        self._n += 1
        path = os.path.join(self.root, f"{self._n:03d}_{name}")
        os.makedirs(path, exist_ok=True)
        return path

    @property
    def model_dir(self) -> str:
        if self._model_dir is None:
            from luffy_pool.tiny import build_tiny_model

            self._model_dir = build_tiny_model(os.path.join(self.root, "tiny_model"))
        return self._model_dir

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    @property
    def task_dir(self) -> str:
        if self._task_dir is None:
            from luffy_pool.tiny import write_task_parquets

            self._task_dir = os.path.join(self.root, "tiny_task")
            write_task_parquets(self._task_dir, n_train=16, n_test=8, level=2, seed=0)
        return self._task_dir


# ------------------------------------------------------------------------------------------ judging
def _one_line(text: str) -> bool:
    return "\n" not in text.strip()


def judge_exception(exc: BaseException, names: tuple[str, ...]) -> Outcome:
    """A refusal: good when it is one line naming every expected token and not a generic internal error."""
    msg = " ".join(str(exc).split()) if _one_line(str(exc)) else str(exc).strip().splitlines()[0]
    shown = f"{type(exc).__name__}: {msg[:150]}"
    missing = [n for n in names if n not in str(exc)]
    if isinstance(exc, GENERIC_ERRORS) and not getattr(exc, "errors", None):
        return Outcome("weak", f"generic error, {shown}")
    if missing:
        return Outcome("weak", f"does not name {missing}: {shown}")
    if not _one_line(str(exc)):
        return Outcome("weak", f"multi-line: {shown}")
    return Outcome("good", shown)


def expect_refusal(fn: Callable[[], object], *names: str) -> Outcome:
    """``fn()`` must raise a one-line error naming ``names``; returning means the bad input was accepted."""
    try:
        fn()
    except CaseTimeout:
        raise
    except SystemExit as exc:
        return Outcome("good" if exc.code == 2 else "weak", f"SystemExit({exc.code})")
    except BaseException as exc:  # noqa: BLE001 - what the user would see is the point
        return judge_exception(exc, names)
    return Outcome("bad", "accepted silently")


def expect_cli_refusal(main: Callable, argv: list[str], *names: str, use_run_cli: bool = True) -> Outcome:
    """A script's main as its ``__main__`` runs it: exit 2 with one stderr line naming ``names`` is good."""
    from verl.utils.data_format import run_cli

    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = run_cli(main, argv) if use_run_cli else main(argv)
    except CaseTimeout:
        raise
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - a traceback escapes to the user
        return Outcome("weak", f"traceback: {type(exc).__name__}: {str(exc).strip()[:120]}")
    text = err.getvalue().strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if code in (0, None):
        return Outcome("bad", f"exit 0 (accepted); stderr: {text[-120:]!r}")
    last = lines[-1] if lines else ""
    missing = [n for n in names if n not in text]
    if code != 2 or missing or "Traceback" in text:
        return Outcome("weak", f"exit {code}; {'missing ' + str(missing) + '; ' if missing else ''}{last[:140]}")
    return Outcome("good", f"exit 2: {last[:150]}")


def expect_config_error(overrides: list[str], token: str, config_name: str = "tiny_cpu_luffy") -> Outcome:
    from luffy_pool.config.check import validate_config
    from luffy_pool.config.compose import compose_config

    paths = ["actor_rollout_ref.model.path=/m", "data.train_files=/t.parquet", "data.val_files=null"]
    errors = validate_config(compose_config(paths + overrides, config_name))
    hits = [e for e in errors if token in e]
    if hits:
        return Outcome("good", hits[0][:150])
    return Outcome("bad" if not errors else "weak", f"config check: {errors[:1] or 'no error'}")


def expect_accepted(fn: Callable[[], Optional[str]]) -> Outcome:
    """Legitimate input that must keep working: ``fn`` returns None (fine) or a problem description."""
    try:
        problem = fn()
    except CaseTimeout:
        raise
    except BaseException as exc:  # noqa: BLE001
        return Outcome("bad", f"refused: {type(exc).__name__}: {str(exc)[:140]}")
    return Outcome("good", "accepted") if problem is None else Outcome("bad", problem)


def run_trainer(ctx: Context, overrides: list[str], timeout_s: float, config_name: str = "tiny_cpu_luffy"):
    """``python -m luffy_pool.main_mix_ppo`` on the tiny model/task (a subprocess); returns (rc or None, stderr)."""
    import subprocess

    out = ctx.tmp("run")
    base = [
        f"actor_rollout_ref.model.path={ctx.model_dir}",
        f"data.train_files={ctx.task_dir}/train.parquet",
        "data.val_files=null",
        f"trainer.default_local_dir={out}/ckpt",
        f"hydra.run.dir={out}",
        "trainer.total_training_steps=1",
    ]
    cmd = [sys.executable, "-m", "luffy_pool.main_mix_ppo", "--config-name", config_name, *base, *overrides]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        cmd, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the trainer and any workers it started
        proc.communicate()
        return None, ""
    return proc.returncode, stderr


def judge_trainer(rc: Optional[int], stderr: str, *names: str) -> Outcome:
    if rc is None:
        return Outcome("bad", "no exit within the limit (hang or late failure)")
    errors = [line for line in stderr.splitlines() if line.startswith("Config error: ")]
    if rc == 0:
        return Outcome("bad", "exit 0 (accepted)")
    hit = [e for e in errors if all(n in e for n in names)]
    if rc == 2 and hit and "Traceback" not in stderr:
        return Outcome("good", hit[0][:150])
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or [""]
    return Outcome("weak", f"exit {rc}: {tail[0][:150]}")


# ------------------------------------------------------------------------------------------ running
def run_case(case: Case, ctx: Context) -> tuple[Outcome, float]:
    start = time.perf_counter()
    use_alarm = hasattr(signal, "setitimer")

    def on_alarm(signum, frame):
        raise CaseTimeout()

    previous = signal.signal(signal.SIGALRM, on_alarm) if use_alarm else None
    if use_alarm:
        signal.setitimer(signal.ITIMER_REAL, case.timeout_s)
    try:
        outcome = case.fn(ctx)
    except CaseTimeout:
        outcome = Outcome("bad", f"no answer within {case.timeout_s:g} s (hang)")
    except Exception as exc:  # noqa: BLE001 - a broken case is reported, never fatal to the probe
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        outcome = Outcome(
            "weak",
            f"probe case raised {type(exc).__name__}: {str(exc)[:100]} "
            f"({os.path.basename(frame.filename)}:{frame.lineno})",
        )
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if outcome.verdict not in VERDICTS:
        outcome = Outcome("weak", f"unknown verdict {outcome.verdict!r}: {outcome.seen}")
    return outcome, time.perf_counter() - start


def select(cases: list[Case], words: list[str]) -> list[Case]:
    if not words:
        return cases
    return [c for c in cases if any(w.lower() in f"{c.cid} {c.ref}".lower() for w in words)]


def main(argv: Optional[list[str]] = None) -> int:
    from exp_scripts.probe_bad_input_cases import CASES

    ap = argparse.ArgumentParser(prog="python exp_scripts/probe_bad_input.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", action="append", default=[], help="only cases whose id or reference contains this")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--quickstart-log", default=None, help="a captured quickstart console (for the console cases)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    cases = select(CASES, args.k)
    if args.list:
        for c in cases:
            print(f"{c.cid:28s} {c.ref:6s} {c.title}")
        print(f"{len(cases)} cases")
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="probe_bad_input_") as root:
        ctx = Context(root, args.quickstart_log)
        for case in cases:
            outcome, seconds = run_case(case, ctx)
            results.append(
                {
                    "id": case.cid,
                    "ref": case.ref,
                    "title": case.title,
                    "verdict": outcome.verdict,
                    "seen": outcome.seen,
                    "seconds": round(seconds, 2),
                }
            )
            print(
                f"{outcome.verdict:5s} {case.cid:28s} {case.ref:6s} {seconds:6.1f}s  {outcome.seen[:110]}", flush=True
            )
    totals = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    print(f"\n{len(results)} cases: " + ", ".join(f"{v} {n}" for v, n in totals.items()))
    by_ref: dict[str, dict[str, int]] = {}
    for r in results:
        by_ref.setdefault(r["ref"], {v: 0 for v in VERDICTS})[r["verdict"]] += 1
    for ref, counts in sorted(by_ref.items()):
        print(f"  {ref:6s} " + ", ".join(f"{v} {n}" for v, n in counts.items() if n))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"totals": totals, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
