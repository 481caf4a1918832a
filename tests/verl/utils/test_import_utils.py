"""``model.external_lib``: the worker imports it before loading, so a module that registers a custom
architecture makes a model of that type loadable (LUFFY's use of the key)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from verl.single_controller.base.worker import find_free_port
from verl.utils.import_utils import import_external_libs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

CUSTOM_MODULE = textwrap.dedent('''
    """Registers a custom architecture, as a LUFFY user's external_lib does."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM


    class LuffyExtTestConfig(Qwen2Config):
        model_type = "luffy_ext_test"


    class LuffyExtTestForCausalLM(Qwen2ForCausalLM):
        config_class = LuffyExtTestConfig


    AutoConfig.register("luffy_ext_test", LuffyExtTestConfig)
    AutoModelForCausalLM.register(LuffyExtTestConfig, LuffyExtTestForCausalLM)
''')

# One process, one rank: load without the lib (must fail), then through the worker with it.
WORKER_SCRIPT = textwrap.dedent('''
    import sys
    from omegaconf import OmegaConf
    from transformers import AutoConfig
    cfg = OmegaConf.load(sys.argv[1])
    try:
        AutoConfig.from_pretrained(cfg.model.path)
        print("WITHOUT_LIB: loaded")
    except Exception as exc:
        print("WITHOUT_LIB: refused", type(exc).__name__)
    from verl.workers.config_sections import WorkerSections
    from verl.workers.fsdp_workers import ActorRolloutRefWorker
    worker = ActorRolloutRefWorker(WorkerSections.from_config(cfg), role="actor", device="cpu")
    module = worker._build_module(worker.sections.actor.fsdp_config, trainable=False)
    print("BUILT:", " ".join(c.__name__ for c in type(module).__mro__))  # FSDP2 subclasses the model's class
''')


def test_none_imports_nothing():
    assert import_external_libs(None) == [] and import_external_libs("") == []


def test_a_missing_module_is_one_error_naming_the_key():
    with pytest.raises(ImportError, match=r"actor_rollout_ref.model.external_lib='no_such_luffy_module_xyz'"):
        import_external_libs("no_such_luffy_module_xyz")


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_worker_imports_external_lib_and_loads_the_custom_architecture(tmp_path, tiny_model_dir, compose_config):
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "luffy_ext_test_model.py").write_text(CUSTOM_MODULE)
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    with open(model_dir / "config.json") as f:
        hf = json.load(f)
    hf["model_type"], hf["architectures"] = "luffy_ext_test", ["LuffyExtTestForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(hf))
    cfg = compose_config(
        [
            "data.train_files=x",
            "data.val_files=null",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.external_lib=luffy_ext_test_model",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size=1",
        ]
    )
    path = tmp_path / "arr.yaml"
    OmegaConf.save(cfg.actor_rollout_ref, path, resolve=True)
    (tmp_path / "run.py").write_text(WORKER_SCRIPT)
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}{os.pathsep}{libs}",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(find_free_port("127.0.0.1")),
    )
    out = subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "WITHOUT_LIB: refused" in out.stdout
    built = [ln for ln in out.stdout.splitlines() if ln.startswith("BUILT:")]
    assert built and "LuffyExtTestForCausalLM" in built[0].split(), out.stdout
