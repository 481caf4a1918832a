"""Shared by the golden generators: read a file of the authors' checkout at a commit, write a file."""
import os
import subprocess


def show(git_dir: str, commit: str, path: str) -> str:
    """``git --git-dir=GIT_DIR show COMMIT:PATH``."""
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
