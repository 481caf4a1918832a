"""H4: the trackers of ``trainer.logger`` are checked at pre-flight, before any model loads.

wandb without a login refuses to start in a job (no terminal to ask for a key) and, with a login, an
unreachable server hangs in retries: both used to surface only after every rank had loaded the model and
built vLLM. The server is a real local socket here (listening, or a port just closed) and the login sources
are real files in a temporary home (netrc, wandb's settings file), so nothing reaches the network.
"""

from __future__ import annotations

import socket

import pytest

from luffy_pool.run.preflight import PreflightError, check_trackers, preflight
from verl.utils.tracking import tracker_problems, wandb_problem


@pytest.fixture
def server():
    """A listening local TCP port: ``http://127.0.0.1:<port>``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def closed_url():
    """A local port nothing listens on (bound, then closed): connections are refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home: no ~/.netrc, no wandb settings; no wandb variable from the caller's environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _env(home, **kw):
    return {"HOME": str(home), **kw}


@pytest.mark.parametrize(
    "mode",
    [{"WANDB_MODE": "offline"}, {"WANDB_MODE": "disabled"}, {"WANDB_MODE": "Offline"}, {"WANDB_DISABLED": "true"}],
)
def test_offline_or_disabled_wandb_needs_no_login_and_no_server(home, closed_url, mode):
    assert wandb_problem(_env(home, WANDB_BASE_URL=closed_url, **mode)) is None


def test_wandb_without_a_login_is_one_line_with_the_fixes(home, server):
    problem = wandb_problem(_env(home, WANDB_BASE_URL=server))
    assert problem == (
        f"trainer.logger includes wandb, but wandb has no login for {server} here (no WANDB_API_KEY, no "
        f"api_key in wandb's settings, no {server[len('http://') :]} entry in ~/.netrc): run `wandb login`, "
        "or set WANDB_MODE=offline (sync later with `wandb sync`) or WANDB_MODE=disabled, or drop wandb "
        "from trainer.logger"
    )


def test_wandb_login_from_netrc_with_the_server_answering(home, server):
    host = server[len("http://") :]
    (home / ".netrc").write_text(f"machine {host}\n  login user\n  password abcdef0123456789\n")
    (home / ".netrc").chmod(0o600)
    assert wandb_problem(_env(home, WANDB_BASE_URL=server)) is None
    # a netrc entry for another server is no login for this one
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abcdef0123456789\n")
    assert "has no login" in wandb_problem(_env(home, WANDB_BASE_URL=server))


def test_wandb_login_and_server_from_the_settings_file(home, server, tmp_path):
    config_dir = tmp_path / "wandb_config"
    config_dir.mkdir()
    (config_dir / "settings").write_text(f"[default]\nbase_url = {server}\napi_key = abcdef0123456789\n")
    assert wandb_problem(_env(home, WANDB_CONFIG_DIR=str(config_dir))) is None


def test_an_unreachable_wandb_server_is_named(home, closed_url):
    problem = wandb_problem(_env(home, WANDB_API_KEY="abcdef0123456789", WANDB_BASE_URL=closed_url), timeout_s=1.0)
    assert problem == (
        f"trainer.logger includes wandb, but the wandb server {closed_url} is unreachable (offline?): set "
        "WANDB_MODE=offline (sync later with `wandb sync`) or WANDB_MODE=disabled, or drop wandb from "
        "trainer.logger"
    )


def test_only_the_configured_trackers_are_checked(home, closed_url, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", closed_url)
    assert tracker_problems(["console", "jsonl"]) == []
    assert tracker_problems("console") == []
    assert [p.split(",")[0] for p in tracker_problems(["console", "wandb"])] == ["trainer.logger includes wandb"]


def test_a_missing_tensorboard_package_is_found_at_preflight(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert tracker_problems(["tensorboard"]) == [
        "trainer.logger includes tensorboard, but the tensorboard package is not installed (pip install tensorboard, "
        "or drop tensorboard from trainer.logger)"
    ]


@pytest.fixture
def config(compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path / "out")))
    OmegaConf.update(cfg, "trainer.logger", ["console", "wandb"], merge=False)  # LUFFY's train.sh
    return cfg


def test_preflight_refuses_wandb_without_a_login_before_anything_loads(config, home, server, monkeypatch):
    from luffy_pool.config.sections import ConfigSections

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", server)
    with pytest.raises(PreflightError) as err:
        preflight(config)  # every other check of this config passes: the tracker is the one line
    assert len(err.value.errors) == 1 and err.value.errors[0].startswith(
        f"trainer.logger includes wandb, but wandb has no login for {server}"
    )
    assert check_trackers(ConfigSections.from_config(config)) == err.value.errors
    monkeypatch.setenv("WANDB_MODE", "offline")
    preflight(config)
