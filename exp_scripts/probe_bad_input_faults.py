"""Probe cases for faults and the new user's path (docs/DESIGN.md §3: G3, "Weak", "User", "Load").

Checkpoints (the upgrade tool, manifests), signals, secret masking, the README's eval path, the quickstart's
console and load-independent grading. Registered into ``probe_bad_input_cases.CASES`` when that module loads.
"""

from __future__ import annotations

import json
import os

from exp_scripts.probe_bad_input import Context, Outcome, judge_exception
from exp_scripts.probe_bad_input_cases import case


# ------------------------------------------------------------------------------------ checkpoints (G3, Weak)
def _step_dir(ctx: Context) -> str:
    """A small global_step_N folder in this version's layout (state, meta, model shard, manifest)."""
    from verl.utils.checkpoint import layout, manifest
    from verl.utils.checkpoint.safe_io import save_state

    step = os.path.join(ctx.tmp("ckpt"), "global_step_2")
    actor = os.path.join(step, layout.ACTOR_DIR)
    os.makedirs(os.path.join(actor, layout.MODEL_DIR))
    save_state(os.path.join(step, layout.DATA_FILE), {"global_step": 2})
    with open(os.path.join(actor, layout.META_FILE), "w") as f:
        json.dump({"world_size": 1, "contents": ["model"]}, f)
    with open(os.path.join(actor, layout.MODEL_DIR, ".metadata"), "wb") as f:
        f.write(b"\x01" * 64)
    with open(os.path.join(actor, layout.MODEL_DIR, "__0_0.distcp"), "wb") as f:
        f.write(bytes(range(256)) * 16)
    manifest.write_manifest(step)
    problem = manifest.verify_step_dir(step, need_optim=False)
    if problem:
        raise RuntimeError(f"the probe's own checkpoint does not verify: {problem}")
    return step


@case("upgrade_reblesses_flipped_byte", "G3", "checkpoint upgrade tool on a shard with a flipped byte")
def _(ctx: Context) -> Outcome:
    import contextlib
    import io

    from verl.utils.checkpoint import manifest, upgrade

    step = _step_dir(ctx)
    shard = os.path.join(step, "actor", "model", "__0_0.distcp")
    data = bytearray(open(shard, "rb").read())
    data[100] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = upgrade.main([step])
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:  # noqa: BLE001
        return judge_exception(exc, ("__0_0.distcp",))
    problem = manifest.verify_step_dir(step, need_optim=False)
    if problem is None:
        return Outcome("bad", f"exit {code}; the corrupted checkpoint now verifies clean")
    return Outcome("good" if code else "weak", f"exit {code}; still refused: {problem[:100]}")


@case("manifest_deleted", "Weak", "checkpoint of this version with manifest.json deleted")
def _(ctx: Context) -> Outcome:
    from verl.utils.checkpoint import manifest

    step = _step_dir(ctx)
    os.remove(os.path.join(step, manifest.MANIFEST_FILE))
    problem = manifest.verify_step_dir(step, need_optim=False)
    return (
        Outcome("bad", "verifies without its manifest (integrity check skipped)")
        if problem is None
        else Outcome("good", problem[:150])
    )


@case("manifest_entry_outside", "Weak", "manifest entry ../../etc/hostname")
def _(ctx: Context) -> Outcome:
    from verl.utils.checkpoint import manifest

    step = _step_dir(ctx)
    path = os.path.join(step, manifest.MANIFEST_FILE)
    data = json.load(open(path))
    data["files"]["../../etc/hostname"] = {"size": 1, "sha256": "0" * 64}
    json.dump(data, open(path, "w"))
    problem = manifest.verify_step_dir(step, need_optim=False)
    if problem is None:
        return Outcome("bad", "accepted")
    return Outcome("good" if "outside" in problem or "escapes" in problem else "weak", problem[:150])


@case("truncated_shard", "extra", "checkpoint shard truncated after the save")
def _(ctx: Context) -> Outcome:
    from verl.utils.checkpoint import manifest

    step = _step_dir(ctx)
    shard = os.path.join(step, "actor", "model", "__0_0.distcp")
    open(shard, "r+b").truncate(100)
    problem = manifest.verify_step_dir(step, need_optim=False)
    return Outcome("bad", "accepted") if problem is None else Outcome("good", problem[:150])


# ------------------------------------------------------------------------------------ lost workers
_DEAD_RANK = "The actor died unexpectedly before finishing this task.\n\tip: 10.0.0.7\nkilled by SIGKILL"


@case("restart_cluster_too_small", "extra", "a restart whose cluster stays too small gives up naming the keys")
def _(ctx: Context) -> Outcome:
    from luffy_pool.run.recovery import wait_for_capacity, world_shape

    clock = [0.0]
    groups, bundle = world_shape(nnodes=2, per_node=8, use_gpu=True)
    one_node = [{"Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}}]
    try:
        wait_for_capacity(
            groups,
            bundle,
            30,
            lambda: one_node,
            clock=lambda: clock[0],
            sleep=lambda s: clock.__setitem__(0, clock[0] + s),
        )
    except Exception as exc:  # noqa: BLE001
        return judge_exception(exc, ("trainer.restart_wait_s", "trainer.nnodes", "trainer.n_gpus_per_node"))
    return Outcome("bad", "returned although one node cannot host two node groups")


@case("restart_same_failure_twice", "extra", "the same lost worker at the same step ends the run with its cause")
def _(ctx: Context) -> Outcome:
    import ray.exceptions as rex

    from luffy_pool.run.recovery import RestartPolicy, classify_failure

    policy = RestartPolicy(max_restarts=1)
    failure = classify_failure(rex.RayActorError(None, _DEAD_RANK))
    first, second = policy.decide(failure, 7), policy.decide(failure, 7)
    if not first.restart or second.restart:
        return Outcome("bad", f"restart decisions {first.restart}, {second.restart} (want True, False)")
    missing = [n for n in ("worker_died", "step 7", "trainer.max_restarts=1") if n not in second.reason]
    return Outcome(
        "weak" if missing else "good", f"{second.reason[:150]}" + (f"; missing {missing}" if missing else "")
    )


@case("restart_not_for_config_error", "extra", "a config error in a worker is not restarted")
def _(ctx: Context) -> Outcome:
    from luffy_pool.run.recovery import classify_failure
    from verl.utils.ray_utils import WorkerGroupError

    exc = WorkerGroupError("actor_rollout", "update_actor", {0: ValueError("ppo_micro_batch_size must divide")})
    failure = classify_failure(exc)
    return Outcome("bad" if failure.recoverable else "good", f"{failure.cause}: recoverable={failure.recoverable}")


# ------------------------------------------------------------------------------------ signals, secrets (Weak)
@case("second_sigterm", "Weak", "a second SIGTERM while stopping: documented exit code, no traceback", timeout_s=90)
def _(ctx: Context) -> Outcome:
    import subprocess
    import sys

    code = (
        "import os, signal, time\nfrom verl.utils.signals import GracefulStop\n"
        "with GracefulStop():\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(0.3)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(3)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=80, env=env)
    if "Traceback" in proc.stderr:
        return Outcome("weak", f"exit {proc.returncode} with a traceback ({proc.stderr.strip().splitlines()[-1][:80]})")
    return Outcome("good" if proc.returncode == 143 else "weak", f"exit {proc.returncode}")


@case("api_key_in_url", "Weak", "an API key inside reward.orm.base_url is masked in the logged config")
def _(ctx: Context) -> Outcome:
    from verl.utils.tracking import mask_secrets

    shown = json.dumps(
        mask_secrets(
            {"reward": {"orm": {"base_url": "https://judge.example/v1?api_key=sk-abcdef123456", "model": "m"}}}
        )
    )
    return Outcome("bad", "key printed") if "sk-abcdef123456" in shown else Outcome("good", "masked")


@case("pad_token_not_a_secret", "Weak", "pad_token / eos_token are not masked as secrets")
def _(ctx: Context) -> Outcome:
    from verl.utils.tracking import mask_secrets

    shown = mask_secrets({"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>", "hf_token": "hf_abcdefghijkl"})
    if shown["hf_token"] != "***":
        return Outcome("bad", "a real token field is printed")
    masked = [k for k in ("pad_token", "eos_token") if shown[k] == "***"]
    return Outcome("weak", f"{masked} masked (not secrets)") if masked else Outcome("good", "only hf_token masked")


# ------------------------------------------------------------------------------------ the new user's path
def _readme() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return open(os.path.join(root, "README.md"), encoding="utf-8").read()


@case("readme_merge_command", "User", "README says how to turn a checkpoint into a HF model")
def _(ctx: Context) -> Outcome:
    return (
        Outcome("good", "verl.model_merger shown")
        if "verl.model_merger" in _readme()
        else Outcome("bad", "not in README")
    )


@case("readme_eval_keeps_system_prompt", "User", "README's eval of the quickstart model keeps its system prompt")
def _(ctx: Context) -> Outcome:
    text = _readme()
    return (
        Outcome("good", "--remove_system False shown")
        if "--remove_system False" in text.split("## Evaluation")[-1]
        else Outcome("bad", "the README's eval drops the trained system prompt (score 0.0)")
    )


@case("readme_end_to_end", "User", "README shows train -> merge -> eval -> collect_results")
def _(ctx: Context) -> Outcome:
    text = _readme().split("## Evaluation")[-1]
    steps = [s for s in ("quickstart", "verl.model_merger", "generate_vllm.py", "collect_results.py") if s in text]
    return Outcome("good", "all four steps") if len(steps) == 4 else Outcome("weak", f"only {steps}")


@case("resolved_config_to_file", "User", "the trainer writes the resolved config to a file and prints its path")
def _(ctx: Context) -> Outcome:
    from luffy_pool.run import main_mix_ppo
    from luffy_pool.config.compose import compose_config

    if not hasattr(main_mix_ppo, "write_resolved_config"):
        return Outcome("weak", "the resolved config is printed to the console (~300 lines)")
    cfg = compose_config(
        [
            "actor_rollout_ref.model.path=/m",
            "data.train_files=/t.parquet",
            "data.val_files=null",
            f"trainer.default_local_dir={ctx.tmp('out')}",
        ],
        "tiny_cpu_luffy",
    )
    path = main_mix_ppo.write_resolved_config(cfg)
    return (
        Outcome("good", path) if path and os.path.getsize(path) > 1000 else Outcome("bad", f"nothing written ({path})")
    )


def _console(ctx: Context):
    if not ctx.quickstart_log or not os.path.exists(ctx.quickstart_log):
        return None
    return open(ctx.quickstart_log, encoding="utf-8", errors="replace").read().replace("\r", "\n\r").split("\n")


@case(
    "console_longest_line", "User", "quickstart console: no runaway line (<= 600 chars; a step's metrics line is ~320)"
)
def _(ctx: Context) -> Outcome:
    lines = _console(ctx)
    if lines is None:
        return Outcome("n/a", "pass --quickstart-log")
    raw = open(ctx.quickstart_log, encoding="utf-8", errors="replace").read().split("\n")
    longest = max(len(x) for x in raw)
    return Outcome("good" if longest <= 600 else "weak", f"longest line {longest} chars")


@case("console_line_count", "User", "quickstart console fits a screen or two (<= 150 lines, no config dump)")
def _(ctx: Context) -> Outcome:
    if _console(ctx) is None:
        return Outcome("n/a", "pass --quickstart-log")
    raw = open(ctx.quickstart_log, encoding="utf-8", errors="replace").read().splitlines()
    dump = sum(1 for x in raw if x.startswith("  ") and x.rstrip().endswith(":"))
    return Outcome(
        "good" if len(raw) <= 150 and dump < 10 else "weak", f"{len(raw)} lines, {dump} config-section lines"
    )


# ------------------------------------------------------------------------------------ load
@case("first_grade_equals_later", "Load", "a fresh process's first grade equals its later ones", timeout_s=120)
def _(ctx: Context) -> Outcome:
    import subprocess
    import sys

    code = (
        "import json\nfrom eval_scripts.grading import grade_text\n"
        "r = [grade_text('x</think>\\\\boxed{\\\\frac{1}{2}}', '0.5', 'math_verify', True, timeout_s=3.0).correct "
        "for _ in range(3)]\nprint(json.dumps(r))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110, env=env)
    try:
        verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Outcome("weak", f"exit {proc.returncode}: {proc.stderr.strip()[-100:]}")
    return Outcome("good", str(verdicts)) if all(verdicts) else Outcome("bad", f"verdicts {verdicts} (load-dependent)")
