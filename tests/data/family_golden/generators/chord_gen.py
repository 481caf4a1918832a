"""Golden generator for CHORD (test tooling; never imported by the package).

Runs Trinity-RFT's own ``mu_schedule_function``, ``SFTPhiLossFn``, ``SFTISLossFn`` and ``MIXCHORDPolicyLossFn``
(chord_policy_loss.py @ b458e2c2, with sft_loss.py, the dual-clip ppo_policy_loss.py and utils.py; the
registry decorator / base class stubbed) on seeded random inputs and saves inputs, outputs and gradients.

Usage: python chord_gen.py AUTHORS_DIR OUT_DIR   (AUTHORS_DIR holds the ``trinity/`` package copy; see README).
"""
import itertools
import sys

import torch

authors_dir, out_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, authors_dir)
from trinity.algorithm.policy_loss_fn.chord_policy_loss import (  # noqa: E402
    MIXCHORDPolicyLossFn, SFTISLossFn, SFTPhiLossFn, mu_schedule_function)

torch.manual_seed(20261203)
out = {"mu": [], "sft": [], "mixed": []}

for warmup, decay, peak, valley in [(0, 200, 0.9, 0.05), (200, 400, 0.5, 0.02), (0, 0, 0.1, 0.1), (7, 13, 0.3, 0.01)]:
    steps = list(range(0, warmup + decay + 5)) if warmup + decay < 50 else list(range(0, warmup + decay + 10, 7))
    out["mu"].append({"args": (warmup, decay, peak, valley), "steps": steps,
                      "mu": [mu_schedule_function(s, warmup, decay, peak, valley) for s in steps]})


def batch(rows, width):
    log_prob = -torch.rand(rows, width) * 4.0  # p in (e^-4, 1]
    mask = (torch.rand(rows, width) > 0.25).float()
    mask[:, 0] = 1.0
    return log_prob, mask


for kind, token_level, cutoff in itertools.product(("phi", "is"), (True, False), (1.0, 0.6)):
    if kind == "is" and cutoff != 1.0:
        continue
    log_prob, mask = batch(5, 11)
    lp = log_prob.clone().requires_grad_(True)
    fn = SFTPhiLossFn(use_token_level_loss=token_level, cutoff_prob=cutoff) if kind == "phi" \
        else SFTISLossFn(use_token_level_loss=token_level)
    loss, _ = fn(lp, mask)
    loss.backward()
    out["sft"].append({"kind": kind, "token_level": token_level, "cutoff_prob": cutoff, "log_prob": log_prob,
                       "mask": mask, "loss": loss.detach(), "grad": lp.grad.clone()})

for dyn, phi_on, n_expert, step in [(False, True, 2, 0), (True, True, 3, 57), (False, False, 1, 250),
                                    (True, False, 0, 10), (False, True, 6, 120)]:
    rows, width = 6, 9
    log_prob, mask = batch(rows, width)
    old_log_prob = log_prob + torch.randn(rows, width) * 0.4  # ratios both sides of the clip, some beyond c
    advantages = torch.randn(rows, 1).expand(rows, width).clone()
    expert = torch.zeros(rows, dtype=torch.bool)
    expert[torch.randperm(rows)[:n_expert]] = True
    kwargs = dict(mu_warmup_steps=20, mu_decay_steps=200, mu_peak=0.5, mu_valley=0.02, enable_phi_function=phi_on,
                  clip_range=0.2, use_dynamic_bsz=dyn, ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=4,
                  ngpus_trainer=2, train_batch_size_usual=32, train_batch_size_expert=8)
    lp = log_prob.clone().requires_grad_(True)
    loss, metrics = MIXCHORDPolicyLossFn(**kwargs)(lp, old_log_prob, mask, advantages, expert,
                                                  torch.full((rows,), step))
    loss.backward()
    out["mixed"].append({"kwargs": kwargs, "step": step, "log_prob": log_prob, "old_log_prob": old_log_prob,
                         "mask": mask, "advantages": advantages, "expert_mask": expert, "loss": loss.detach(),
                         "grad": lp.grad.clone(), "metrics": metrics})

torch.save(out, f"{out_dir}/chord_golden.pt")
print("wrote", f"{out_dir}/chord_golden.pt", {k: len(v) for k, v in out.items()})
