"""luffy_pool.memory_plan: launch-script overrides, model shapes, vLLM 0.32's budget rule, the per-phase
table of the shipped recipes, the suggested keys, and the start-of-run hook (device memory monkeypatched)."""

from __future__ import annotations

import json
import math
import os

import pytest

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.config.sections import ConfigSections
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.estimate import GiB, PlanInputs, build_plan, vllm_budget
from luffy_pool.memory_plan.launch_script import script_overrides
from luffy_pool.memory_plan.shapes import KNOWN_SHAPES, model_shape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, TRAIN_16K = (os.path.join(ROOT, "exp_scripts", n) for n in ("train.sh", "train_16k.sh"))
LUFFY_MODEL = "Elliott/Qwen2.5-Math-7B-16k-think"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    env.update(extra)
    return env


def _value(overrides, key):
    """The last value a key gets (Hydra: later overrides win)."""
    values = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == key]
    return values[-1] if values else None


def _plan(script, gpu_gb=80, *extra):
    cfg = compose_config(script_overrides(script, list(extra), env=_env()))
    return mp.plan_for_config(cfg, mp.parse_gpu_memory(str(gpu_gb)))


# ---------------------------------------------------------------------- launch scripts
def test_train_sh_overrides_take_model_and_data_from_env_then_the_scripts_defaults(tmp_path):
    o = script_overrides(TRAIN, env=_env())
    assert _value(o, "actor_rollout_ref.model.path") == LUFFY_MODEL
    assert _value(o, "data.train_files") == os.path.join(ROOT, "data", "openr1.parquet")
    assert _value(o, "trainer.logger") == "['console','wandb']" and _value(o, "trainer.val_before_train") == "False"
    # bash arrays spliced with "${NAME[@]}": LUFFY's trainer switches and the memory plan's utilisation
    assert _value(o, "trainer.stop_one_step_early") == "True"
    assert _value(o, "actor_rollout_ref.rollout.gpu_memory_utilization") == "0.73"
    assert _value(o, "trainer.memory_plan") == "error"
    o = script_overrides(TRAIN, ["trainer.nnodes=2", "--cfg", "job"], env=_env(MODEL_PATH=str(tmp_path), DATA_DIR="/d"))
    assert (
        _value(o, "actor_rollout_ref.model.path") == str(tmp_path) and _value(o, "data.val_files") == "/d/valid.parquet"
    )
    assert o[-1] == "trainer.nnodes=2" and "--cfg" not in o and "job" not in o


def test_train_16k_passes_its_overrides_after_train_sh_and_extra_ones_last():
    o = script_overrides(TRAIN_16K, ["data.max_response_length=1000"], env=_env())
    assert (
        _value(o, "actor_rollout_ref.actor.ulysses_sequence_parallel_size") == "2"
    )  # 16k's value wins over train.sh's 1
    assert _value(o, "trainer.experiment_name") == "LUFFY_16K"  # its EXP_NAME default reaches train.sh
    assert o.index("data.max_response_length=15360") < o.index("data.max_response_length=1000") == len(o) - 1


# ---------------------------------------------------------------------- shapes
def test_model_shape_from_a_folder_the_fallback_table_or_a_clear_error(tmp_path):
    cfg = dict(KNOWN_SHAPES["Qwen/Qwen2.5-Math-1.5B"], num_attention_heads=12)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    local = model_shape(str(tmp_path))
    assert local.source.endswith("config.json") and local.head_dim == 128
    # Qwen2.5-Math-1.5B has 1.54 B parameters (model card); 7B: 7.62 B
    assert abs(local.params / 1e9 - 1.54) < 0.01
    fallback = model_shape(LUFFY_MODEL)
    assert "FALLBACK" in fallback.source and abs(fallback.params / 1e9 - 7.62) < 0.01
    assert model_shape(LUFFY_MODEL, model_config=str(tmp_path)).hidden_size == 1536  # --model-config wins
    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.path=nobody/none.*--model-config"):
        model_shape("nobody/none")
    # a hub id in the HF cache (its snapshot layout), read offline; it wins over the fallback table
    snap = tmp_path / "hub" / "models--Qwen--Qwen2.5-Math-7B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(dict(KNOWN_SHAPES["Qwen/Qwen2.5-Math-1.5B"])))
    (tmp_path / "hub" / "models--Qwen--Qwen2.5-Math-7B" / "refs").mkdir()
    (tmp_path / "hub" / "models--Qwen--Qwen2.5-Math-7B" / "refs" / "main").write_text("abc123")
    cached = model_shape("Qwen/Qwen2.5-Math-7B", cache_dir=str(tmp_path / "hub"))
    assert cached.source.startswith("HF cache") and cached.hidden_size == 1536


# ---------------------------------------------------------------------- vLLM's rule
def _inputs(**changes) -> PlanInputs:
    """The YAML's plan inputs (every value from the composed config) with ``changes``."""
    import dataclasses

    sections = ConfigSections.from_config(compose_config(["actor_rollout_ref.model.path=m"]))
    return dataclasses.replace(PlanInputs.from_sections(sections, device="cuda"), **changes)


def test_vllm_takes_utilisation_times_total_memory_and_the_kv_cache_is_what_is_left():
    shape = model_shape(LUFFY_MODEL)
    inputs = _inputs(world=8, nodes=1, tp=2, gpu_memory_utilization=0.8, max_num_batched_tokens=8192)
    total = int(79.2 * GiB)
    vb = vllm_budget(inputs, shape, total)
    assert vb["requested"] == math.ceil(0.8 * total)  # vllm/v1/worker/utils.py request_memory
    assert vb["weights"] == shape.params * 2 // 2  # bf16, one TP shard of two
    assert vb["kv"] == vb["requested"] - vb["weights"] - vb["activation"] - vb["non_torch"]
    # whole 16-token blocks of K and V, 28 layers, 4 KV heads split over TP 2, head_dim 128, bf16
    assert vb["kv_tokens"] == vb["kv"] // (16 * 2 * 28 * 2 * 128 * 2) * 16
    plan = build_plan(inputs, shape, total)
    engine = [ln for ln in plan.phase("rollout (vLLM awake)").lines if ln.what.startswith("vLLM")]
    assert sum(ln.bytes for ln in engine) == vb["requested"]  # the engine's lines add up to util x total


def test_an_engine_that_cannot_hold_one_sequence_is_reported():
    plan = build_plan(
        _inputs(world=8, nodes=1, tp=1, gpu_memory_utilization=0.2, max_prompt_length=1024, max_response_length=15360),
        model_shape(LUFFY_MODEL),
        int(79.2 * GiB),
    )
    assert any("refuses to start" in n for n in plan.notes)
    assert any("gpu_memory_utilization=" in s for s in mp.suggestions(plan))


# ---------------------------------------------------------------------- the recipes
@pytest.mark.parametrize("script", [TRAIN, TRAIN_16K])
@pytest.mark.parametrize("gpu_gb,nnodes", [(80, 1), (80, 2), (141, 1), (141, 2)])
def test_shipped_recipes_fit_with_five_percent_headroom_in_every_phase(script, gpu_gb, nnodes):
    plan = _plan(script, gpu_gb, f"trainer.nnodes={nnodes}")
    for phase in plan.phases:
        assert phase.total <= 0.95 * plan.device_bytes, (phase.name, phase.total / GiB)
    assert not plan.notes


def test_cli_prints_every_phase_with_keys_then_peak_device_and_headroom(capsys):
    assert cli([TRAIN, "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    for name in ("rollout (vLLM awake)", "log-prob: old (actor)", "update: forward/backward", "update: optimizer step"):
        assert f"\n{name} " in out
    body = [ln for ln in out.splitlines() if ln.startswith("  ")]
    assert body and all(ln.split()[-1] == "-" or "." in ln.split()[-1] for ln in body)  # every line names its key
    tail = out.strip().splitlines()[-3:]
    assert tail[0].startswith("peak: ") and tail[1] == "device memory: 79.20 GiB" and tail[2].startswith("headroom: ")


def test_cli_from_the_composed_config_with_overrides_both_spellings(capsys):
    base = [
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B",
        "trainer.n_gpus_per_node=4",
        "data.train_files=x",
        "data.val_files=y",
    ]
    assert cli(["--gpu-memory", "141", "--config-overrides", *base]) == 0
    first = capsys.readouterr().out
    assert cli(["--gpu-memory", "141", "--", *base]) == 0
    assert capsys.readouterr().out == first and "4 ranks" in first and "1.54 B params" in first


def test_d5_luffys_utilisation_does_not_fit_and_the_fix_is_named(capsys):
    # LUFFY's 0.80 (written for vLLM 0.6) on an 80 GB card (docs/DESIGN.md §2 item 8): 0.80 x 79.2 GiB for the
    # engine, 10.6 GiB of actor shards and moments, 1 GiB CUDA context, 2 x 1.5 GiB of the trainer's NCCL, vLLM's own
    # TP communicator 1.5 GiB + 64 MiB outside the fraction, 0.5 GiB of push buckets, 0.33 GiB margin: ~80.4 GiB.
    rc = cli([TRAIN, "--gpu-memory", "80", "--", "actor_rollout_ref.rollout.gpu_memory_utilization=0.80"])
    out = capsys.readouterr().out
    assert rc == 1 and "DOES NOT FIT" in out
    rollout = float(next(ln for ln in out.splitlines() if ln.startswith("rollout (vLLM awake)")).split()[-1])
    assert 80.3 <= rollout <= 80.5
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.70" in out


def test_d3_full_logits_under_sp_do_not_fit_the_log_prob_pass():
    plan = _plan(TRAIN_16K, 80, "actor_rollout_ref.model.logprob_chunk_size=0")
    phase = plan.phase("log-prob: old (actor)")
    assert phase.total > plan.device_bytes  # the dense head's ~87 GiB (docs/DESIGN.md §2 item 6)
    fixes = mp.suggestions(plan)
    assert "actor_rollout_ref.model.logprob_chunk_size=1024" in fixes
    for fix in fixes:  # each suggestion, applied, really brings the plan under
        fixed = _plan(TRAIN_16K, 80, "actor_rollout_ref.model.logprob_chunk_size=0", fix)
        assert fixed.phase("log-prob: old (actor)").total <= 0.95 * fixed.device_bytes, fix


def test_plan_follows_the_keys_it_names():
    base = _plan(TRAIN, 80)
    off = _plan(TRAIN, 80, "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True")
    saved = base.phase("rollout (vLLM awake)").total - off.phase("rollout (vLLM awake)").total
    frag = [ln.bytes for p in (base, off) for ln in p.phase("rollout (vLLM awake)").lines if "fragmentation" in ln.what]
    assert saved == 8 * base.shape.params // 8 + frag[0] - frag[1]  # two fp32 moments of a 1/8 shard, and their margin
    hsdp = _plan(TRAIN, 80, "trainer.nnodes=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=8")
    assert hsdp.inputs.shard_group == 8 and hsdp.inputs.world == 16
    no_ckpt = _plan(TRAIN, 80, "actor_rollout_ref.model.enable_gradient_checkpointing=False")
    assert no_ckpt.phase("update: forward/backward").total > base.phase("update: forward/backward").total + 20 * GiB


def test_relift_plans_its_sft_optimizer_and_its_stage():
    plan = _plan(os.path.join(ROOT, "exp_scripts", "train_relift.sh"), 80)
    assert all(p.total <= 0.95 * plan.device_bytes for p in plan.phases) and not plan.notes
    sft = lambda phase: [ln.bytes for ln in plan.phase(phase).lines if ln.what.startswith("ReLIFT SFT AdamW")]  # noqa: E731
    moments = 8 * plan.shape.params // 8  # two fp32 moments of a 1/8 shard
    # the script offloads both optimizers: the SFT one is on the device in its own stage only
    assert sft("ReLIFT SFT stage: optimizer step") == [moments] and sft("rollout (vLLM awake)") == []
    assert sft("update: forward/backward") == []
    plan = _plan(
        os.path.join(ROOT, "exp_scripts", "train_relift.sh"),
        80,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    )
    assert sft("rollout (vLLM awake)") == [moments] and sft("update: optimizer step") == [moments]
    assert not [p for p in _plan(TRAIN, 80).phases if p.name.startswith("ReLIFT")]


def test_gpu_memory_argument():
    assert mp.parse_gpu_memory("80") == int(79.2 * GiB) and mp.parse_gpu_memory("141") == int(140.4 * GiB)
    assert mp.parse_gpu_memory("79.2GiB") == int(79.2 * GiB) and mp.parse_gpu_memory("85GB") == 85 * 10**9
    with pytest.raises(ValueError, match="--gpu-memory"):
        mp.parse_gpu_memory("lots")


# ---------------------------------------------------------------------- the start-of-run hook
def _run_config(*extra):
    """The run's sections, as the launcher builds them before calling the hook."""
    return ConfigSections.from_config(compose_config(script_overrides(TRAIN, list(extra), env=_env())))


def test_hook_error_mode_stops_naming_phase_estimate_and_keys(monkeypatch, capsys):
    monkeypatch.setattr(mp, "device_memory_bytes", lambda: int(79.2 * GiB))
    cfg = _run_config("actor_rollout_ref.rollout.gpu_memory_utilization=0.95", "trainer.memory_plan=error")
    with pytest.raises(mp.MemoryPlanError) as err:
        mp.check_run(cfg, "cuda")
    text = str(err.value)
    assert "phase 'rollout (vLLM awake)' needs" in text and "79.2 GiB" in text
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0." in text
    assert capsys.readouterr().out.count("memory plan (luffy_pool.memory_plan") == 1  # printed once


def test_hook_warn_mode_goes_on_and_off_or_cpu_does_not_ask_the_device(monkeypatch, caplog):
    monkeypatch.setattr(mp, "device_memory_bytes", lambda: int(79.2 * GiB))
    cfg = _run_config("actor_rollout_ref.rollout.gpu_memory_utilization=0.95", "trainer.memory_plan=warn")
    assert mp.check_run(cfg, "cuda").over(0.0)
    assert "gpu_memory_utilization" in caplog.text

    def no_device():
        raise AssertionError("device memory queried")

    monkeypatch.setattr(mp, "device_memory_bytes", no_device)
    assert mp.check_run(_run_config("trainer.memory_plan=off"), "cuda") is None
    assert mp.check_run(_run_config("trainer.memory_plan=error"), "cpu") is None


def test_hook_without_a_model_shape_warns_or_stops_by_mode(monkeypatch, caplog):
    monkeypatch.setattr(mp, "device_memory_bytes", lambda: int(79.2 * GiB))
    cfg = _run_config("actor_rollout_ref.model.path=nobody/none", "trainer.memory_plan=warn")
    assert mp.check_run(cfg, "cuda") is None and "memory plan skipped" in caplog.text
    cfg = _run_config("actor_rollout_ref.model.path=nobody/none", "trainer.memory_plan=error")
    with pytest.raises(mp.MemoryPlanError, match="nobody/none"):
        mp.check_run(cfg, "cuda")


def test_memory_plan_key_is_checked():
    from luffy_pool.config.check import ConfigError, check_config

    cfg = compose_config(script_overrides(TRAIN, ["trainer.memory_plan=sometimes"], env=_env()))
    with pytest.raises(ConfigError, match="trainer.memory_plan"):
        check_config(cfg)
    assert compose_config(["actor_rollout_ref.model.path=m"]).trainer.memory_plan == "warn"


def test_documented_table_is_the_plans_output():
    from luffy_pool.memory_plan.__main__ import readme_table

    with open(os.path.join(ROOT, "docs", "memory.md")) as f:  # the Memory page's table of the shipped recipes
        assert readme_table(_env()) in f.read()  # regenerate: python -m luffy_pool.memory_plan --readme-table
