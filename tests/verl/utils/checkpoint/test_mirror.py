"""trainer.default_hdfs_dir: each published checkpoint and the tracker are copied to a local folder or a URL."""

import os

import fsspec

from verl.utils.checkpoint import layout
from verl.utils.checkpoint.mirror import mirror_checkpoint


def _checkpoint(root, step, payload):
    step_dir = root / layout.step_dir_name(step)
    (step_dir / "actor" / "model").mkdir(parents=True)
    (step_dir / "data.pt").write_bytes(payload)
    (step_dir / "actor" / "model" / "__0_0.distcp").write_bytes(payload * 2)
    layout.write_tracker(str(root), step)
    return step_dir


def _tree(root):
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, files in os.walk(root)
        for f in files
    }


def test_local_mirror_copies_the_step_folder_and_the_tracker(tmp_path):
    local, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    step2 = _checkpoint(local, 2, b"two")
    out = mirror_checkpoint(str(local), str(step2), str(mirror))
    assert out == str(mirror / "global_step_2")
    assert _tree(out) == _tree(step2)
    assert layout.read_tracker(str(mirror)) == 2
    step4 = _checkpoint(local, 4, b"four")
    mirror_checkpoint(str(local), str(step4), str(mirror))
    assert layout.read_tracker(str(mirror)) == 4 and _tree(mirror / "global_step_2") == _tree(step2)
    (step4 / "data.pt").write_bytes(b"rewritten")  # a re-save of the same step replaces the mirrored copy
    mirror_checkpoint(str(local), str(step4), str(mirror))
    assert (mirror / "global_step_4" / "data.pt").read_bytes() == b"rewritten"
    assert not [p for p in os.listdir(mirror) if p.startswith(layout.TMP_PREFIX)]


def test_url_mirror_goes_through_fsspec(tmp_path):
    local = tmp_path / "ckpt"
    step3 = _checkpoint(local, 3, b"three")
    out = mirror_checkpoint(str(local), str(step3), "memory://luffy-mirror/run1")
    fs = fsspec.filesystem("memory")
    assert out.startswith("memory://") and out.endswith("/global_step_3")
    assert fs.cat_file("/luffy-mirror/run1/global_step_3/data.pt") == b"three"
    assert fs.cat_file("/luffy-mirror/run1/global_step_3/actor/model/__0_0.distcp") == b"threethree"
    assert fs.cat_file(f"/luffy-mirror/run1/{layout.TRACKER_FILE}").strip() == b"3"
