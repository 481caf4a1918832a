"""Checkpoint tree rules: tracker file, atomic publish, retention, stale temp dirs, path resolution."""

import os

import pytest

from verl.utils.checkpoint import layout


def _fake_step(root, step, shards=True):
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / layout.META_FILE).write_text("{}")
    (actor / layout.extra_state_file(1, 0)).write_bytes(b"x")
    (root / f"global_step_{step}" / layout.DATA_FILE).write_bytes(b"x")
    if shards:
        for sub in (layout.MODEL_DIR, layout.OPTIM_DIR):
            (actor / sub).mkdir()
            (actor / sub / ".metadata").write_bytes(b"m")
    return actor


def test_tracker_round_trip_and_garbage_is_named(tmp_path):
    assert layout.read_tracker(str(tmp_path)) is None
    layout.write_tracker(str(tmp_path), 12)
    assert layout.read_tracker(str(tmp_path)) == 12
    assert [p.name for p in tmp_path.iterdir()] == [layout.TRACKER_FILE]  # no temp file left behind
    (tmp_path / layout.TRACKER_FILE).write_text("twelve")
    with pytest.raises(ValueError, match="twelve"):
        layout.read_tracker(str(tmp_path))


def test_publish_replaces_an_existing_step_dir_atomically(tmp_path):
    old = tmp_path / "global_step_4"
    old.mkdir()
    (old / "stale").write_text("old")
    new = tmp_path / ".tmp_global_step_4"
    new.mkdir()
    (new / "fresh").write_text("new")
    layout.publish_dir(str(new), str(old))
    assert sorted(os.listdir(old)) == ["fresh"] and sorted(os.listdir(tmp_path)) == ["global_step_4"]


def test_retention_keeps_newest_shards_up_to_current_step_only(tmp_path):
    for step in (2, 4, 6, 8):
        _fake_step(tmp_path, step)
    removed = layout.prune_sharded_states(str(tmp_path), keep=2, current_step=6)
    assert sorted(os.path.relpath(p, tmp_path) for p in removed) == [
        "global_step_2/actor/model",
        "global_step_2/actor/optim",
    ]
    assert [layout.has_sharded_model(str(tmp_path / f"global_step_{s}" / "actor")) for s in (2, 4, 6, 8)] == [
        False,
        True,
        True,
        True,
    ]
    assert (tmp_path / "global_step_2" / layout.DATA_FILE).exists()
    assert layout.prune_sharded_states(str(tmp_path), keep=None, current_step=8) == []


def test_stale_temp_and_trash_dirs_are_removed(tmp_path):
    (tmp_path / ".tmp_global_step_3").mkdir()
    (tmp_path / ".trash_global_step_2.99").mkdir()
    _fake_step(tmp_path, 2)
    removed = layout.remove_stale_temp_dirs(str(tmp_path))
    assert len(removed) == 2 and sorted(os.listdir(tmp_path)) == ["global_step_2"]
    assert [s for s, _ in layout.list_step_dirs(str(tmp_path))] == [2]


def test_resolve_actor_dir_accepts_root_step_and_actor_dirs(tmp_path):
    actor = _fake_step(tmp_path, 4)
    layout.write_tracker(str(tmp_path), 4)
    for path in (tmp_path, tmp_path / "global_step_4", actor):
        assert layout.resolve_actor_dir(str(path)) == str(actor)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        layout.resolve_actor_dir(str(tmp_path / "global_step_4" / "huggingface"))


def test_step_dir_names_parse_back():
    assert layout.parse_step_dir("/a/b/global_step_17/") == 17
    assert layout.parse_step_dir("/a/b/.tmp_global_step_17") is None
    assert layout.step_dir_name(3) == "global_step_3"
