"""Hub model names (docs/DESIGN.md §2 item 12): an id resolves through a hub-layout HF cache folder built here
(``models--org--name/snapshots/<rev>/...`` + ``refs/main``) with huggingface_hub's own resolution, offline;
the shard loader and the pre-flight then read it; an id that cannot resolve is one line naming the id, the
cache folder and the variables that move it."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

REV = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root, model_dir, repo="org/tiny-math"):
    """A cache as ``snapshot_download`` leaves it (files copied instead of blob symlinks: both are read)."""
    entry = root / ("models--" + repo.replace("/", "--"))
    snap = entry / "snapshots" / REV
    shutil.copytree(model_dir, snap)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(REV)
    return repo, str(snap)


@pytest.fixture
def offline_cache(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return _hub_cache(tmp_path / "hub", tiny_model_dir)


def test_hub_id_resolves_offline_to_the_cache_snapshot(offline_cache):
    from verl.utils.meta_init import checkpoint_entries
    from verl.utils.model_source import resolve_model_dir

    repo, snap = offline_cache
    assert resolve_model_dir(repo) == snap
    assert "model.embed_tokens.weight" in checkpoint_entries(resolve_model_dir(repo))  # the loader reads it
    assert resolve_model_dir(snap) == snap  # a local folder stays what it is


def test_preflight_and_head_check_accept_a_cached_hub_id(offline_cache):
    from luffy_pool.run.preflight import check_model_source
    from verl.utils.parallel_check import local_model_heads as _local_model_heads

    repo, _ = offline_cache
    assert check_model_source(repo, "actor_rollout_ref.model.path") is None
    assert _local_model_heads(repo, {}) == (4, 2)  # the tiny model's heads, read from the cached config.json


def test_unresolvable_id_names_id_cache_folder_and_variables(offline_cache, tmp_path):
    from verl.utils.model_source import resolve_model_dir

    with pytest.raises(FileNotFoundError) as err:
        resolve_model_dir("org/not-there")
    msg = str(err.value)
    assert msg.startswith("org/not-there: not in the HuggingFace cache and HF_HUB_OFFLINE is set")
    assert str(tmp_path / "hub" / "models--org--not-there") in msg and "HF_HUB_CACHE" in msg and "HF_HOME" in msg


def test_online_ranks_of_a_node_download_one_after_another(tmp_path, tiny_model_dir, monkeypatch):
    """The first rank downloads under the cache's lock; the others wait and find the snapshot (no second
    fetch of any file). huggingface_hub's download is replaced by one that fills the cache like it."""
    import huggingface_hub

    from verl.utils import model_source

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    fetched, inside, overlap = [], [0], []
    real = huggingface_hub.snapshot_download

    def fake(repo_id, revision=None, cache_dir=None, local_files_only=False, **kw):
        if local_files_only:
            return real(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True)
        inside[0] += 1
        overlap.append(inside[0])
        try:
            snap = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"), "snapshots", REV)
            if not os.path.isdir(snap):  # what the hub client does: fetch only files that are missing
                time.sleep(0.2)
                _hub_cache(tmp_path / "hub", tiny_model_dir, repo_id)
                fetched.append(repo_id)
            return snap
        finally:
            inside[0] -= 1

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    out = []
    threads = [
        threading.Thread(target=lambda: out.append(model_source.resolve_model_dir("org/tiny-math"))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fetched == ["org/tiny-math"] and max(overlap) == 1 and len(set(out)) == 1 and len(out) == 4
