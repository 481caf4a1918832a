"""Golden generator for ReLIFT (test tooling; never imported by the package).

Extracts ``relift/verl/verl/relift/core_algos.py`` (``compute_sft_loss``) and ``relift/verl/verl/utils/
torch_functional.py`` (their ``masked_mean``) from a TheRoadQaQ/ReLIFT checkout and runs them with the loss
lines of ``actor.py`` ``sft_update_policy`` restated (``loss = sft_loss − entropy_loss · entropy_coeff``).

Usage: python relift_gen.py GIT_DIR WORK_DIR OUT_DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _authors  # noqa: E402

git_dir, work, out_dir = sys.argv[1:4]
COMMIT = "eb95454f45eb84bf8f8efa3728f4839548426f5f"
V = "relift/verl/verl"


def show(path):
    return _authors.show(git_dir, COMMIT, path)


write = _authors.write


root = os.path.join(work, "relift_verl")
write(os.path.join(root, "verl", "__init__.py"), "")
write(os.path.join(root, "verl", "utils", "__init__.py"), "")
write(os.path.join(root, "verl", "utils", "torch_functional.py"), show(f"{V}/utils/torch_functional.py"))
write(os.path.join(root, "relift_core_algos.py"), show(f"{V}/relift/core_algos.py"))
sys.path.insert(0, root)
import verl.utils.torch_functional as verl_F  # noqa: E402
from relift_core_algos import compute_sft_loss  # noqa: E402

out = {"commit": COMMIT, "sft": []}
g = torch.Generator().manual_seed(77)
for rows, width, coeff in [(4, 9, 0.001), (2, 16, 0.01), (6, 5, 0.0)]:
    log_prob = -torch.rand(rows, width, generator=g) * 5.0
    entropy = torch.rand(rows, width, generator=g) * 3.0
    mask = torch.ones(rows, width)
    for r in range(rows):
        mask[r, int(torch.randint(1, width + 1, (1,), generator=g)):] = 0
    lp = log_prob.clone().requires_grad_(True)
    sft_loss = compute_sft_loss(log_prob=lp, eos_mask=mask)["sft_loss"]
    entropy_loss = verl_F.masked_mean(entropy, mask)
    loss = sft_loss - entropy_loss * coeff
    loss.backward()
    out["sft"].append({"entropy_coeff": coeff, "log_prob": log_prob, "entropy": entropy, "mask": mask,
                       "sft_loss": sft_loss.detach(), "loss": loss.detach(), "grad": lp.grad.clone()})
torch.save(out, os.path.join(out_dir, "relift_golden.pt"))
print("wrote", len(out["sft"]))
