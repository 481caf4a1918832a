"""manifest.py: sizes and sha256 of every checkpoint file, hashed in shares by the ranks, verified on resume."""

from __future__ import annotations

import json
import os

from verl.utils.checkpoint import manifest


def _tree(root):
    files = {
        "data.pt": b"d" * 10,
        "actor/model/__0_0.distcp": b"a" * 300,
        "actor/model/__1_0.distcp": b"b" * 200,
        "actor/model/.metadata": b"m" * 5,
        "actor/extra_state_world_size_2_rank_0.pt": b"e" * 7,
    }
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return files


def test_rank_shares_cover_every_file_once_and_match_a_full_hash(tmp_path):
    _tree(tmp_path / "actor" / "..")
    actor = str(tmp_path / "actor")
    shares = [manifest.hash_share(actor, r, 3) for r in range(3)]
    merged = {k: v for s in shares for k, v in s.items()}
    assert sum(len(s) for s in shares) == len(merged) == 4
    assert [len(s) for s in shares] == [2, 1, 1]  # the largest files are dealt first
    full = manifest.write_manifest(str(tmp_path))["files"]
    assert all(full[os.path.join("actor", rel)] == entry for rel, entry in merged.items())


def test_known_entries_are_reused_only_while_the_size_matches(tmp_path):
    _tree(tmp_path)
    fake = {"data.pt": {"size": 10, "sha256": "f" * 64}, "actor/model/.metadata": {"size": 999, "sha256": "x"}}
    files = manifest.write_manifest(str(tmp_path), known=fake)["files"]
    assert files["data.pt"]["sha256"] == "f" * 64
    assert files["actor/model/.metadata"]["sha256"] == manifest.sha256_file(str(tmp_path / "actor/model/.metadata"))


def test_size_only_manifest_checks_sizes_but_not_contents(tmp_path):
    _tree(tmp_path)
    manifest.write_manifest(str(tmp_path), checksums=False)
    assert all(
        e["sha256"] is None for e in json.loads((tmp_path / manifest.MANIFEST_FILE).read_text())["files"].values()
    )
    (tmp_path / "data.pt").write_bytes(b"X" * 10)  # same size, other bytes: not detectable without checksums
    assert manifest.verify_step_dir(str(tmp_path), need_optim=False) is None
    (tmp_path / "data.pt").write_bytes(b"X" * 9)
    assert "data.pt has 9 bytes" in manifest.verify_step_dir(str(tmp_path), need_optim=False)


def test_pruned_shards_are_named_as_pruned(tmp_path):
    _tree(tmp_path)
    manifest.write_manifest(str(tmp_path))
    model = tmp_path / "actor" / "model"
    for p in model.iterdir():
        p.unlink()
    model.rmdir()
    manifest.drop_from_manifest(str(tmp_path), [str(model)])
    assert manifest.verify_step_dir(str(tmp_path), need_model=False, need_optim=False) is None
    assert "was pruned by trainer.max_optim_to_keep" in manifest.verify_step_dir(str(tmp_path), need_optim=False)
