"""Regenerate tests/data/verl_reference/rollout_corr_*.pt from verl's own rollout correction.

Runs verl's ``compute_rollout_correction_and_rejection_mask`` (verl/trainer/ppo/rollout_corr_helper.py) on
seeded random tensors and stores inputs, outputs and metrics. verl is NOT imported from this project: the
script builds a throwaway package tree under WORKDIR holding verl's real rollout_corr_helper.py and
torch_functional.py (read with ``git show COMMIT:path`` from a verl checkout), and stubs only the imports the
computation does not use (verl.utils.device, DataProto as a dict holder, two config classes used as type hints).

    python gen_rollout_corr.py --verl-git-dir /path/to/verl/.git --out tests/data/verl_reference [--workdir /tmp/verl_rc]

Needs torch, tensordict and transformers (torch_functional imports them at module level).
"""
import argparse
import os
import subprocess
import sys

STUBS = {
    "verl/__init__.py": "",
    "verl/utils/__init__.py": "",
    # torch_functional imports these at module level; the masked reductions used here never call them.
    "verl/utils/device.py": "import torch\n\ndef get_device_name():\n    return 'cpu'\n\n"
                            "def get_torch_device():\n    return torch.cuda\n",
    # The helper only wraps the weights in DataProto.from_dict(tensors=...); keep the dict.
    "verl/protocol.py": "class DataProto:\n    def __init__(self, batch):\n        self.batch = batch\n\n"
                        "    @classmethod\n    def from_dict(cls, tensors):\n        return cls(dict(tensors))\n",
    "verl/trainer/__init__.py": "",
    "verl/trainer/ppo/__init__.py": "",
    "verl/trainer/config/__init__.py": "",
    "verl/trainer/config/algorithm.py": "class RolloutCorrectionConfig(dict):\n    pass\n",  # type hint only
    "verl/workers/__init__.py": "",
    "verl/workers/config/__init__.py": "",
    "verl/workers/config/actor.py": "class PolicyLossConfig(dict):\n    pass\n",  # type hint only
}
REAL = ("verl/trainer/ppo/rollout_corr_helper.py", "verl/utils/torch_functional.py")

# (name, rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold, batch, length, log-ratio scale
#  [, rollout_is_batch_normalize]); a case's seed is 1000 + its index, so new cases go at the end.
CASES = [
    ("token_is", "token", 2.0, None, None, 6, 9, 0.8),
    ("sequence_is", "sequence", 1.5, None, None, 8, 9, 0.5),
    ("token_is_rs_token_k1", "token", 1.5, "token_k1", 2.0, 6, 9, 0.8),
    ("sequence_is_rs_seq", "sequence", 3.0, "seq_sum_k1,seq_mean_k3,seq_max_k2", "0.5_4.0,0.12,0.45", 8, 7, 0.6),
    ("rs_only_all", None, 2.0, "token_k2,token_k3,seq_sum_k2,seq_sum_k3,seq_mean_k1,seq_mean_k2,seq_max_k3",
     "0.5,0.4,2.0,2.5,1.5,0.2,0.6", 8, 10, 0.7),
    ("token_is_batch_norm", "token", 1.5, "token_k1", 2.0, 6, 9, 0.8, True),
    ("sequence_is_batch_norm", "sequence", 2.0, None, None, 8, 9, 0.5, True),
]


def build_tree(git_dir: str, commit: str, workdir: str) -> None:
    root = os.path.join(workdir, "stubroot")
    for rel, text in STUBS.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    for rel in REAL:
        src = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{rel}"], check=True,
                             capture_output=True, text=True).stdout
        with open(os.path.join(root, rel), "w") as f:
            f.write(src)
    sys.path.insert(0, root)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--verl-git-dir", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="/tmp/verl_rc")
    args = ap.parse_args()
    commit = subprocess.run(["git", f"--git-dir={args.verl_git_dir}", "rev-parse", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    build_tree(args.verl_git_dir, commit, args.workdir)
    import torch

    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask as verl_fn

    for i, (name, r_is, is_thr, r_rs, rs_thr, batch, length, scale, *normalize) in enumerate(CASES):
        g = torch.Generator().manual_seed(1000 + i)
        rollout_lp = -torch.rand(batch, length, generator=g, dtype=torch.float32) * 3.0
        old_lp = rollout_lp + torch.randn(batch, length, generator=g, dtype=torch.float32) * scale
        lengths = torch.randint(1, length + 1, (batch,), generator=g)
        lengths[-1] = 0  # one empty row: padding everywhere
        mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
        kwargs = {"rollout_is": r_is, "rollout_is_threshold": is_thr, "rollout_rs": r_rs,
                  "rollout_rs_threshold": rs_thr}
        if normalize:  # only where asked: the earlier cases' files predate the key
            kwargs["rollout_is_batch_normalize"] = normalize[0]
        weights, new_mask, metrics = verl_fn(old_log_prob=old_lp, rollout_log_prob=rollout_lp, response_mask=mask,
                                             **kwargs)
        record = {
            "verl_commit": commit, "verl_file": REAL[0], "verl_function": "compute_rollout_correction_and_rejection_mask",
            "kwargs": kwargs,
            "old_log_prob": old_lp, "rollout_log_prob": rollout_lp, "response_mask": mask,
            "weights": None if weights is None else weights.batch["rollout_is_weights"].clone(),
            "modified_response_mask": new_mask.clone(), "metrics": {k: float(v) for k, v in metrics.items()},
        }
        path = os.path.join(args.out, f"rollout_corr_{name}.pt")
        torch.save(record, path)
        print(path, len(metrics), "metrics")


if __name__ == "__main__":
    main()
