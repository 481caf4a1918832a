"""Golden generator for HPT and SRFT (test tooling; never imported by the package).

Extracts from a TsinghuaC3I/Unify-Post-Training checkout: ``hpt/verl/verl/mix_src/mix_core_alg.py``
(``compute_sft_pure_loss``, ``compute_token_on_off_policy_srft_loss``), ``hpt/verl/verl/trainer/ppo/core_algos.py``
(``compute_policy_loss``), ``hpt/verl/verl/utils/torch_functional.py`` (their ``masked_mean``) and, by AST,
``select_on_off_ada_balance`` from ``mix_src/mix_trainer.py``. The few lines of ``mix_actor.update_policy`` that
combine those functions (the ``offline_loss_type`` "sft" and "srft" branches) are restated below line by line.

Usage: python hpt_srft_gen.py GIT_DIR WORK_DIR OUT_DIR
"""
import ast
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _authors  # noqa: E402

git_dir, work, out_dir = sys.argv[1:4]
COMMIT = "ae332f5fa4dc8b4c3d3cd77ebc9cff3a3abab2d0"
V = "hpt/verl/verl"


def show(path):
    return _authors.show(git_dir, COMMIT, path)


write = _authors.write


root = os.path.join(work, "hpt_verl")
write(os.path.join(root, "verl", "__init__.py"), "")
write(os.path.join(root, "verl", "utils", "__init__.py"), "")
write(os.path.join(root, "verl", "utils", "torch_functional.py"), show(f"{V}/utils/torch_functional.py"))
write(os.path.join(root, "verl", "trainer", "__init__.py"), "")
write(os.path.join(root, "verl", "trainer", "ppo", "__init__.py"), "")
write(os.path.join(root, "verl", "trainer", "ppo", "core_algos.py"), show(f"{V}/trainer/ppo/core_algos.py"))
write(os.path.join(root, "hpt_mix_core_alg.py"), show(f"{V}/mix_src/mix_core_alg.py"))
sys.path.insert(0, root)

import verl.utils.torch_functional as verl_F  # noqa: E402
from hpt_mix_core_alg import compute_sft_pure_loss, compute_token_on_off_policy_srft_loss  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

tree = ast.parse(show(f"{V}/mix_src/mix_trainer.py"))
gate_src = next(ast.get_source_segment(show(f"{V}/mix_src/mix_trainer.py"), node) for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == "select_on_off_ada_balance")
namespace = {}
exec(compile("\n".join(line[4:] if line.startswith("    ") else line for line in gate_src.splitlines()),
             "select_on_off_ada_balance", "exec"), namespace)
select_on_off_ada_balance = namespace["select_on_off_ada_balance"]

out = {"commit": COMMIT, "gate": [], "hpt_sft": [], "srft": []}
for strategy, gate, gate_off in [("switch", 0, 0), ("switch", 2, 2), ("switch", 1, 3), ("soft", 0, 0)]:
    trainer = types.SimpleNamespace(config=types.SimpleNamespace(trainer=types.SimpleNamespace(
        unify_strategy=strategy, switch_gate=gate, switch_gate_off=gate_off)))
    out["gate"].append({"cfg": dict(unify_strategy=strategy, switch_gate=gate, switch_gate_off=gate_off),
                        "decisions": [select_on_off_ada_balance(trainer, c) for c in range(9)]})


def batch(seed, rows=7, width=10, demo_rows=(0,)):
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(rows, width, generator=g) * 2.0
    old = log_prob + torch.randn(rows, width, generator=g) * 0.3
    mask = torch.ones(rows, width)
    for r in range(rows):
        mask[r, int(torch.randint(3, width + 1, (1,), generator=g)):] = 0
    prefix = torch.zeros(rows, width, dtype=torch.bool)
    for r in demo_rows:
        prefix[r] = mask[r].bool()
    adv = torch.randn(rows, 1, generator=g).expand(rows, width).clone()
    entropy = torch.rand(rows, width, generator=g) * 2.0
    scores = torch.zeros(rows, width)
    for r in range(rows):
        last = int(mask[r].sum()) - 1
        scores[r, last] = float(torch.randint(0, 2, (1,), generator=g))
    return log_prob, old, mask, prefix, adv, entropy, scores


for seed, demo_rows, coef, remove_clip, remove_mean in [(1, (0,), 1.0, True, True), (2, (2, 5), 0.3, False, True),
                                                        (3, (), 1.0, True, True), (4, (1,), 1.0, False, False)]:
    log_prob, old, mask, prefix, adv, _, _ = batch(seed, demo_rows=demo_rows)
    lp = log_prob.clone().requires_grad_(True)
    # mix_actor.update_policy, offline_loss_type == "sft"
    off_policy_mask = prefix.any(-1)
    sft_loss = compute_sft_pure_loss(log_prob=lp[off_policy_mask], eos_mask=mask[off_policy_mask])
    on_policy_mask = ~off_policy_mask
    pg_loss, pg_clipfrac, ppo_kl = core_algos.compute_policy_loss(
        old_log_prob=old[on_policy_mask], log_prob=lp[on_policy_mask], advantages=adv[on_policy_mask],
        eos_mask=mask[on_policy_mask], cliprange=0.2, loss_remove_token_mean=remove_mean,
        loss_remove_clip=remove_clip)
    if not torch.isnan(sft_loss):
        pg_loss = sft_loss * coef + pg_loss
    pg_loss.backward()
    out["hpt_sft"].append({"cfg": dict(sft_loss_coef=coef, loss_remove_clip=remove_clip,
                                       loss_remove_token_mean=remove_mean),
                           "log_prob": log_prob, "old_log_prob": old, "mask": mask, "prefix_mask": prefix,
                           "advantages": adv, "loss": pg_loss.detach(), "grad": lp.grad.clone(),
                           "sft_loss": sft_loss.detach(), "pg_clipfrac": pg_clipfrac, "ppo_kl": ppo_kl})

for seed, demo_rows, srft_type, remove_clip, remove_mean in [
        (11, (0,), "paper", True, True), (12, (3,), "exp", True, False), (13, (0, 4), "classic_rl", True, True),
        (14, (), "minus_old", True, True), (15, (2,), "paper", False, True)]:
    log_prob, old, mask, prefix, adv, entropy, scores = batch(seed, demo_rows=demo_rows)
    lp = log_prob.clone().requires_grad_(True)
    # mix_actor.update_policy, offline_loss_type == "srft"
    H_coef = verl_F.masked_mean(entropy, mask, axis=-1)
    H_coef = H_coef.detach()
    sft_coef = 0.5 * torch.exp(-1 * H_coef)
    on_coef = 0.1 * torch.exp(H_coef)
    off_policy_mask = prefix.any(-1)
    off_policy_logprob = lp * (sft_coef.view(-1, 1))
    off_policy_logprob = off_policy_logprob[off_policy_mask]
    sft_loss = compute_sft_pure_loss(log_prob=off_policy_logprob, eos_mask=mask[off_policy_mask])
    correct_answer_mask = scores.sum(-1) == 1
    ret = compute_token_on_off_policy_srft_loss(
        old_log_prob=old, log_prob=lp, advantages=adv, eos_mask=mask, cliprange=0.2, clip_upper_bound=1.0,
        prefix_mask=prefix, off_cliprange=None, on_coef=on_coef, correct_answer_mask=correct_answer_mask,
        srft_type=srft_type, off_policy_reshape="p_div_p_0.1", loss_remove_token_mean=remove_mean,
        loss_remove_clip=remove_clip)
    pg_loss = ret["pg_loss"]
    if not torch.isnan(sft_loss):
        pg_loss = sft_loss + pg_loss
    pg_loss.backward()
    out["srft"].append({"cfg": dict(srft_type=srft_type, loss_remove_clip=remove_clip,
                                    loss_remove_token_mean=remove_mean),
                        "log_prob": log_prob, "old_log_prob": old, "mask": mask, "prefix_mask": prefix,
                        "advantages": adv, "entropy": entropy, "correct_mask": correct_answer_mask,
                        "loss": pg_loss.detach(), "grad": lp.grad.clone(), "sft_loss": sft_loss.detach(),
                        "ret": {k: v.detach().clone() for k, v in ret.items()}})

torch.save(out, os.path.join(out_dir, "hpt_srft_golden.pt"))
print("wrote", {k: len(v) for k, v in out.items() if isinstance(v, list)})
