"""exp_scripts/reproduce/task.py: the splits and the model are staged, then published file by file, so a second
reproduce_tiny.py on the same --out (--reuse with other --methods) never reads a half-written file."""

from __future__ import annotations

import os
import sys

EXP = os.path.join(os.path.dirname(__file__), "..", "..", "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

from reproduce.task import publish  # noqa: E402


def test_publish_renames_new_or_changed_files_and_leaves_identical_ones(tmp_path):
    dest, staged = tmp_path / "out", tmp_path / "out" / ".task-x"
    (dest / "data").mkdir(parents=True)
    (staged / "data").mkdir(parents=True)
    (dest / "data" / "same.parquet").write_bytes(b"abc")
    (dest / "data" / "changed.parquet").write_bytes(b"old")
    (staged / "data" / "same.parquet").write_bytes(b"abc")
    (staged / "data" / "changed.parquet").write_bytes(b"new")
    (staged / "data" / "added.parquet").write_bytes(b"xyz")
    same_inode = os.stat(dest / "data" / "same.parquet").st_ino
    publish(str(staged), str(dest))
    assert os.stat(dest / "data" / "same.parquet").st_ino == same_inode  # a reader holding it sees no change
    assert (dest / "data" / "changed.parquet").read_bytes() == b"new"
    assert (dest / "data" / "added.parquet").read_bytes() == b"xyz"
    assert not staged.exists()
