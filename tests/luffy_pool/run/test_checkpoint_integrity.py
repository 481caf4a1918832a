"""Resume refuses planted pickles, verifies manifests, falls back past corrupt checkpoints, honours retention
and saves on SIGTERM/SIGINT; driven by the real ``fit`` loop with the in-process worker of test_checkpointing."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import signal
import sys

import numpy as np
import pytest
import torch

from luffy_pool.run.checkpointing import CheckpointUnusableError
from verl.utils.checkpoint import layout, manifest
from verl.utils.checkpoint.safe_io import UnsafeCheckpointError, load_state, save_state

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_checkpointing import _max_diff, base_config, make_trainer  # noqa: E402,F401 - base_config is a fixture

# Each test trains a tiny model for a few steps and writes real checkpoints (about 40 s for the file): the
# full suite runs them, the quick loop (-m "not e2e") leaves them to it.
pytestmark = pytest.mark.slow

ACTOR = layout.ACTOR_DIR


class Exploit:
    """Pickles to a call of os.system: loading it with plain pickle would create ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def four_steps(base_config, tiny_model_dir, tmp_path):
    """A run with checkpoints at steps 2 and 4 (tracker 4)."""
    trainer, worker = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4)
    trainer.fit()
    return tmp_path


def _resume(base_config, model_dir, out_dir, **kw):
    trainer, worker = make_trainer(base_config, model_dir, out_dir, steps=4, **kw)
    return trainer, worker, trainer.checkpointer.maybe_resume(trainer)


# ---------------------------------------------------------------------- safe loading
def test_state_files_round_trip_numpy_and_python_rng_as_plain_data(tmp_path):
    state = {
        "np": np.random.get_state(),
        "py": random.getstate(),
        "t": torch.arange(3),
        "gen": torch.Generator().get_state(),
        "nested": {"x": [1, 2.5, None, "s", (True, np.int64(7))]},
    }
    save_state(str(tmp_path / "s.pt"), state)
    # plain torch.load with weights_only=True accepts the file: no pickled globals besides tensors
    torch.load(tmp_path / "s.pt", weights_only=True)
    back = load_state(str(tmp_path / "s.pt"))
    assert (
        back["np"][0] == "MT19937"
        and np.array_equal(back["np"][1], state["np"][1])
        and back["np"][1].dtype == np.uint32
    )
    assert back["py"] == state["py"] and back["nested"]["x"] == [1, 2.5, None, "s", (True, 7)]
    assert torch.equal(back["gen"], state["gen"])


def test_saving_a_non_plain_object_fails_at_save_time_naming_the_entry(tmp_path):
    with pytest.raises(TypeError, match=r"s.pt\['extras'\]\['buf'\] is a .*Exploit"):
        save_state(str(tmp_path / "s.pt"), {"extras": {"buf": Exploit("x")}})


@pytest.mark.parametrize("target", ["data", "extra", "dcp_metadata"])
def test_planted_pickle_is_refused_with_one_line_naming_the_file(
    base_config, tiny_model_dir, four_steps, tmp_path, target
):
    marker = tmp_path / "pwned"
    step4 = four_steps / "global_step_4"
    path = {
        "data": step4 / layout.DATA_FILE,
        "extra": step4 / ACTOR / layout.extra_state_file(1, 0),
        "dcp_metadata": step4 / ACTOR / layout.MODEL_DIR / ".metadata",
    }[target]
    if target == "dcp_metadata":
        path.write_bytes(pickle.dumps(Exploit(str(marker))))
    else:
        torch.save({"global_step": 4, "x": Exploit(str(marker))}, path)
    manifest.write_manifest(str(step4))  # the attacker also rewrote the manifest: the loader itself must refuse
    explicit, _ = make_trainer(base_config, tiny_model_dir, four_steps, steps=4, resume_mode=str(step4))
    with pytest.raises(CheckpointUnusableError) as err:
        explicit.checkpointer.maybe_resume(explicit)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "system" in msg, msg
    assert not marker.exists(), "the planted pickle ran"
    # auto mode: logged and skipped; the previous checkpoint resumes
    _, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 2 and not marker.exists()


def test_checkpoint_written_before_safe_format_still_resumes(base_config, tiny_model_dir, four_steps, tmp_path):
    """Old data.pt/extra_state files pickled numpy RNG arrays with torch.save: numpy arrays only are admitted."""
    step4 = four_steps / "global_step_4"
    for path in (step4 / layout.DATA_FILE, step4 / ACTOR / layout.extra_state_file(1, 0)):
        state = load_state(str(path))
        state = _as_version_1(state) if path.name == layout.DATA_FILE else state
        torch.save(state, path)  # the old writer: numpy arrays pickled as such
        assert "numpy" in " ".join(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    os.remove(step4 / manifest.MANIFEST_FILE)  # old checkpoints had no manifest: structural checks instead
    ref, ref_worker = make_trainer(base_config, tiny_model_dir, tmp_path / "ref", steps=4)
    ref.fit()
    trainer, worker, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 4 and _max_diff(worker.weights(), ref_worker.weights()) <= 1e-6


def test_upgrade_rewrites_old_state_files_as_plain_data_and_adds_a_manifest(base_config, tiny_model_dir, four_steps):
    from verl.utils.checkpoint.upgrade import main as upgrade

    step4 = four_steps / "global_step_4"
    extra = step4 / ACTOR / layout.extra_state_file(1, 0)
    for path in (step4 / layout.DATA_FILE, extra):
        state = load_state(str(path))
        torch.save(_as_version_1(state) if path == step4 / layout.DATA_FILE else state, path)  # as the old writer did
    os.remove(step4 / manifest.MANIFEST_FILE)
    os.remove(four_steps / "global_step_2" / manifest.MANIFEST_FILE)  # version 2, manifest deleted: refused
    with pytest.raises(ValueError, match=r"global_step_2/manifest.json is missing.*--rehash"):
        upgrade([str(four_steps)])
    assert upgrade([str(four_steps / "global_step_4")]) == 0
    for path in (step4 / layout.DATA_FILE, extra):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    assert manifest.verify_step_dir(str(step4)) is None
    assert _resume(base_config, tiny_model_dir, four_steps)[2] == 4


def _as_version_1(state: dict) -> dict:
    """data.pt as written before manifests existed (version 1)."""
    return {**state, "version": 1}


def test_upgrade_refuses_a_corrupted_checkpoint_unless_told_to_rehash(four_steps, capsys):
    """G3: a flipped byte must not be re-blessed by rewriting the manifest."""
    from verl.utils.checkpoint.upgrade import main as upgrade

    step4 = four_steps / "global_step_4"
    _flip(_shard(step4, layout.MODEL_DIR))
    with pytest.raises(ValueError, match=r"model/__0_0.distcp: sha256 differs.*not upgraded \(pass --rehash"):
        upgrade([str(step4)])
    assert "sha256 differs" in manifest.verify_step_dir(str(step4))  # untouched: still fails verification
    assert upgrade([str(step4), "--rehash"]) == 0
    assert manifest.verify_step_dir(str(step4)) is None


def test_a_deleted_manifest_on_a_new_checkpoint_is_refused_an_old_one_warns_once(
    base_config, tiny_model_dir, four_steps, caplog
):
    step4, step2 = four_steps / "global_step_4", four_steps / "global_step_2"
    os.remove(step4 / manifest.MANIFEST_FILE)
    problem = manifest.verify_step_dir(str(step4))
    assert problem is not None and "manifest.json is missing" in problem and "deleted manifest?" in problem
    os.remove(step2 / manifest.MANIFEST_FILE)
    save_state(str(step2 / layout.DATA_FILE), _as_version_1(load_state(str(step2 / layout.DATA_FILE))))
    monkey_flag = manifest._warned_old
    manifest._warned_old = False
    try:
        with caplog.at_level(logging.WARNING, logger=manifest.__name__):
            assert manifest.verify_step_dir(str(step2)) is None and manifest.verify_step_dir(str(step2)) is None
        warnings = [r for r in caplog.records if "written before manifests" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        manifest._warned_old = monkey_flag
    _, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 2  # step 4 refused, the old-format step 2 resumes


def test_a_manifest_entry_outside_the_checkpoint_is_refused_without_reading_it(four_steps, monkeypatch):
    step4 = four_steps / "global_step_4"
    data = json.loads((step4 / manifest.MANIFEST_FILE).read_text())
    data["files"]["../../etc/hostname"] = {"size": 1, "sha256": None}
    (step4 / manifest.MANIFEST_FILE).write_text(json.dumps(data))
    seen = []
    real_getsize = os.path.getsize
    monkeypatch.setattr(os.path, "getsize", lambda p: seen.append(str(p)) or real_getsize(p))
    problem = manifest.verify_step_dir(str(step4))
    assert problem is not None and "'../../etc/hostname' points outside the checkpoint" in problem
    assert not any("hostname" in p for p in seen)
    for bad in ("/etc/hostname", "actor/../../x"):
        assert manifest.entry_path(str(step4), bad) is None
    os.symlink("/etc", step4 / "link")
    assert manifest.entry_path(str(step4), "link/hostname") is None
    assert manifest.entry_path(str(step4), "actor/" + layout.META_FILE) is not None


def test_upgrade_refuses_a_planted_pickle_and_rewrites_nothing(four_steps, tmp_path):
    from verl.utils.checkpoint.upgrade import upgrade_step_dir

    step4 = four_steps / "global_step_4"
    torch.save({"x": Exploit(str(tmp_path / "pwned"))}, step4 / ACTOR / layout.extra_state_file(1, 0))
    before = (step4 / layout.DATA_FILE).read_bytes()
    with pytest.raises(ValueError, match="extra_state_world_size_1_rank_0.pt has .* bytes"):
        upgrade_step_dir(str(step4))  # the manifest no longer verifies
    with pytest.raises(UnsafeCheckpointError, match="extra_state_world_size_1_rank_0.pt: refused to load"):
        upgrade_step_dir(str(step4), rehash=True)  # even told to rehash, a planted pickle is refused
    assert (step4 / layout.DATA_FILE).read_bytes() == before and not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------- integrity and fallback
def _truncate(p):
    p.write_bytes(p.read_bytes()[: max(1, p.stat().st_size // 2)])


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _shard(step_dir, sub):
    return next(p for p in (step_dir / ACTOR / sub).iterdir() if p.suffix == ".distcp")


CORRUPTIONS = {
    "truncated_model_shard": (lambda d: _truncate(_shard(d, layout.MODEL_DIR)), "model/__0_0.distcp has"),
    "flipped_byte_in_optim_shard": (lambda d: _flip(_shard(d, layout.OPTIM_DIR)), "sha256 differs"),
    "missing_data_pt": (lambda d: os.remove(d / layout.DATA_FILE), "data.pt is missing"),
    "missing_optimizer_metadata": (
        lambda d: os.remove(d / ACTOR / layout.OPTIM_DIR / ".metadata"),
        "optim/.metadata is missing",
    ),
    "missing_extra_state": (lambda d: os.remove(d / ACTOR / layout.extra_state_file(1, 0)), "extra_state_world_size_1"),
    "empty_actor_meta": (lambda d: (d / ACTOR / layout.META_FILE).write_text(""), "checkpoint_meta.json has 0 bytes"),
    "torn_manifest": (lambda d: (d / manifest.MANIFEST_FILE).write_text('{"files": {'), "manifest.json: not JSON"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_auto_resume_falls_back_to_newest_intact_checkpoint_naming_the_bad_file(
    base_config, tiny_model_dir, four_steps, kind, caplog
):
    corrupt, expected = CORRUPTIONS[kind]
    corrupt(four_steps / "global_step_4")
    with caplog.at_level(logging.ERROR, logger="luffy_pool.run.checkpointing"):
        trainer, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 2
    bad = [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]
    assert len(bad) == 1 and "global_step_4" in bad[0] and expected in bad[0], bad
    trainer.fit()  # trains steps 3 and 4 again and publishes a fresh, intact step 4
    assert layout.read_tracker(str(four_steps)) == 4
    assert manifest.verify_step_dir(str(four_steps / "global_step_4")) is None


def test_corrupt_checkpoint_without_manifest_fails_at_load_and_auto_falls_back(base_config, tiny_model_dir, four_steps):
    """A pre-manifest checkpoint whose shard is truncated is caught by the loader itself."""
    step4 = four_steps / "global_step_4"
    os.remove(step4 / manifest.MANIFEST_FILE)
    save_state(str(step4 / layout.DATA_FILE), _as_version_1(load_state(str(step4 / layout.DATA_FILE))))
    _truncate(_shard(step4, layout.MODEL_DIR))
    _, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 2


def test_every_checkpoint_bad_is_an_error_listing_each(base_config, tiny_model_dir, four_steps):
    for step in (2, 4):
        os.remove(four_steps / f"global_step_{step}" / layout.DATA_FILE)
    trainer, _ = make_trainer(base_config, tiny_model_dir, four_steps, steps=4)
    with pytest.raises(
        CheckpointUnusableError, match="global_step_4: .*data.pt is missing.*; global_step_2: .*data.pt"
    ):
        trainer.checkpointer.maybe_resume(trainer)


def test_tracker_pointing_at_a_missing_dir_or_garbage_falls_back(base_config, tiny_model_dir, four_steps):
    layout.write_tracker(str(four_steps), 6)
    assert _resume(base_config, tiny_model_dir, four_steps)[2] == 4
    (four_steps / layout.TRACKER_FILE).write_text("garbage")
    assert _resume(base_config, tiny_model_dir, four_steps)[2] == 4


def test_explicit_corrupt_checkpoint_is_an_error_not_a_fallback(base_config, tiny_model_dir, four_steps):
    _truncate(_shard(four_steps / "global_step_2", layout.MODEL_DIR))
    trainer, _ = make_trainer(
        base_config, tiny_model_dir, four_steps, steps=4, resume_mode=str(four_steps / "global_step_2")
    )
    with pytest.raises(
        CheckpointUnusableError, match=r"cannot resume from .*global_step_2: .*__0_0.distcp has \d+ bytes"
    ):
        trainer.checkpointer.maybe_resume(trainer)


def test_manifest_lists_every_file_with_size_and_checksum(four_steps):
    step2 = four_steps / "global_step_2"
    files = json.loads((step2 / manifest.MANIFEST_FILE).read_text())["files"]
    on_disk = sorted(
        str(p.relative_to(step2)) for p in step2.rglob("*") if p.is_file() and p.name != manifest.MANIFEST_FILE
    )
    assert sorted(files) == on_disk and layout.DATA_FILE in files
    assert all(files[f]["size"] == (step2 / f).stat().st_size and len(files[f]["sha256"]) == 64 for f in files)


def test_max_actor_ckpt_to_keep_keeps_the_newest_n(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6, max_actor_ckpt_to_keep=2)
    trainer.fit()
    assert [s for s, _ in layout.list_step_dirs(str(tmp_path))] == [4, 6]


def test_registered_driver_state_is_saved_and_restored(base_config, tiny_model_dir, tmp_path):
    class Buffer:
        def __init__(self):
            self.items = []

        def state_dict(self):
            return {"items": list(self.items), "t": torch.tensor(self.items, dtype=torch.float32)}

        def load_state_dict(self, state):
            self.items = list(state["items"])

    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    buf = Buffer()
    buf.items = [1, 2, 3]
    trainer.checkpointer.register_state("replay", buf)
    trainer.fit()
    again, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    restored = Buffer()
    again.checkpointer.register_state("replay", restored)
    assert again.checkpointer.maybe_resume(again) == 2 and restored.items == [1, 2, 3]


# ---------------------------------------------------------------------- SIGTERM / SIGINT
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_mid_step_saves_that_step_and_resume_continues(base_config, tiny_model_dir, tmp_path, signum):
    ref, ref_worker = make_trainer(base_config, tiny_model_dir, tmp_path / "ref", steps=6)
    ref.fit()
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path / "run", steps=6)
    real_step = trainer.rollout_step

    def step_with_signal(timing):
        if trainer.global_steps == 3:
            signal.raise_signal(signum)  # arrives in the middle of step 3
        return real_step(timing)

    previous = signal.getsignal(signum)
    trainer.rollout_step = step_with_signal
    trainer.fit()
    assert trainer.stop.signum == signum and trainer.global_steps == 3
    assert signal.getsignal(signum) is previous, "fit restores the previous handler"
    assert layout.read_tracker(str(tmp_path / "run")) == 3, "step 3 is saved although save_freq=2"
    resumed, worker = make_trainer(base_config, tiny_model_dir, tmp_path / "run", steps=6)
    resumed.fit()
    assert sorted(resumed.ratio_log) == [4, 5, 6] and resumed.stop.signum is None
    assert _max_diff(worker.weights(), ref_worker.weights()) <= 1e-6


def test_signal_between_two_steps_still_saves_the_last_finished_step(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6)
    real_log = trainer._log

    def log_then_signal(metrics, step):
        real_log(metrics, step)
        if step == 3:  # after step 3's save decision, before step 4 starts
            signal.raise_signal(signal.SIGTERM)

    trainer._log = log_then_signal
    trainer.fit()
    assert trainer.global_steps == 3 and layout.read_tracker(str(tmp_path)) == 3
    # Stopped right after resuming step 3: no step runs and step 3 is not written again.
    again, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6)
    real_resume = again.checkpointer.maybe_resume

    def resume_then_signal(tr):
        step = real_resume(tr)
        signal.raise_signal(signal.SIGTERM)
        return step

    def no_step(timing):
        raise AssertionError("no step may run after the stop signal")

    again.checkpointer.maybe_resume, again.rollout_step = resume_then_signal, no_step
    mtime = (tmp_path / "global_step_3" / layout.DATA_FILE).stat().st_mtime_ns
    again.fit()
    assert again.global_steps == 3 and (tmp_path / "global_step_3" / layout.DATA_FILE).stat().st_mtime_ns == mtime


def test_save_on_signal_false_stops_without_saving(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6, save_on_signal=False)
    real_step = trainer.rollout_step

    def step_with_signal(timing):
        if trainer.global_steps == 3:
            signal.raise_signal(signal.SIGTERM)
        return real_step(timing)

    trainer.rollout_step = step_with_signal
    trainer.fit()
    assert trainer.global_steps == 3 and layout.read_tracker(str(tmp_path)) == 2


def test_second_signal_aborts_at_once(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6)
    real_step = trainer.rollout_step

    def step_with_two_signals(timing):
        if trainer.global_steps == 3:
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
        return real_step(timing)

    trainer.rollout_step = step_with_two_signals
    from verl.utils.signals import AbortedBySignal

    with pytest.raises(AbortedBySignal, match="second stop signal") as err:
        trainer.fit()
    assert isinstance(err.value, SystemExit) and err.value.code == 143  # 128 + SIGTERM, no traceback printed
    assert layout.read_tracker(str(tmp_path)) == 2


def test_fit_and_close_releases_then_exits_143(base_config, tiny_model_dir, tmp_path):
    from luffy_pool.run.launcher import fit_and_close

    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6)
    real_step = trainer.rollout_step
    closed = []

    def step_with_signal(timing):
        if trainer.global_steps == 1:
            signal.raise_signal(signal.SIGTERM)
        return real_step(timing)

    trainer.rollout_step = step_with_signal
    with pytest.raises(SystemExit) as exit_info:
        fit_and_close(trainer, lambda: closed.append(True))
    assert exit_info.value.code == 143 and closed == [True] and layout.read_tracker(str(tmp_path)) == 1


# ---------------------------------------------------------------------- failed saves and failure messages
def test_disk_full_says_no_space_left_with_the_folder_and_leaves_no_partial_dir(
    base_config, tiny_model_dir, tmp_path, monkeypatch
):
    import errno

    from luffy_pool.run import checkpointing
    from luffy_pool.run.checkpointing import CheckpointSaveError

    trainer, worker = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    trainer.fit()  # step 2 published
    trainer.global_steps = 3
    tmp = tmp_path / (layout.TMP_PREFIX + "global_step_3")
    real_save = worker.save_checkpoint

    def fills_the_disk(local_path, **kw):
        real_save(local_path, **kw)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(worker, "save_checkpoint", fills_the_disk)
    with pytest.raises(CheckpointSaveError) as err:
        trainer.checkpointer.save(trainer)
    msg = str(err.value)
    assert "no space left on device" in msg and str(tmp) in msg and "step 3" in msg and "\n" not in msg, msg
    assert not tmp.exists() and layout.read_tracker(str(tmp_path)) == 2
    # torch's zip writer words a full disk differently; with little space left it is recognised too.
    monkeypatch.setattr(
        worker,
        "save_checkpoint",
        lambda *a, **k: (_ for _ in ()).throw(
            RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed; unexpected pos 704 vs 598")
        ),
    )
    monkeypatch.setattr(checkpointing, "_free_bytes", lambda path: 2**20)
    with pytest.raises(CheckpointSaveError, match="no space left on device: saving step 3 .*1 MiB free"):
        trainer.checkpointer.save(trainer)
    monkeypatch.setattr(checkpointing, "_free_bytes", lambda path: 50 * 2**30)  # plenty of space: not a full disk
    with pytest.raises(RuntimeError, match="unexpected pos") as other:
        trainer.checkpointer.save(trainer)
    assert not isinstance(other.value, CheckpointSaveError)


def test_leftovers_of_a_failed_save_never_block_resume(base_config, tiny_model_dir, four_steps, monkeypatch):
    leftover = four_steps / (layout.TMP_PREFIX + "global_step_6")
    (leftover / ACTOR).mkdir(parents=True)
    (leftover / ACTOR / "junk.distcp").write_bytes(b"\0" * 100)
    (four_steps / (layout.TMP_PREFIX + "stray")).write_text("x")
    _, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 4 and not leftover.exists() and not (four_steps / (layout.TMP_PREFIX + "stray")).exists()
    (leftover / ACTOR).mkdir(parents=True)  # one that cannot be removed (read-only disk) is ignored
    monkeypatch.setattr(layout.shutil, "rmtree", lambda *a, **k: None)
    assert layout.remove_stale_temp_dirs(str(four_steps)) == []
    _, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 4 and leftover.exists()


def test_a_step_refused_on_resume_is_never_named_the_last_good_checkpoint(base_config, tiny_model_dir, four_steps):
    step4 = four_steps / "global_step_4"
    torch.save(
        {"global_step": 4, "x": Exploit(str(four_steps / "pwned"))}, step4 / ACTOR / layout.extra_state_file(1, 0)
    )
    manifest.write_manifest(str(step4))  # sizes and hashes agree: only the loader refuses it
    trainer, _, step = _resume(base_config, tiny_model_dir, four_steps)
    assert step == 2
    assert trainer.checkpointer.last_good_checkpoint() == str(four_steps / "global_step_2")
    summary = trainer.checkpointer.refused_summary()
    assert summary.startswith("; refused on resume: global_step_4 (") and "extra_state_world_size_1_rank_0" in summary
