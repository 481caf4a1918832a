"""Golden generator for ExGRPO (test tooling; never imported by the package).

Extracts ExGRPO's own files from a LUFFY checkout (``git --git-dir=GIT_DIR show COMMIT:...``), stubs only
``verl.DataProto`` (a dict holder), ``verl.utils.model.compute_position_id_with_mask`` (its one-line body) and
the actor worker (seeded random per-position values), and runs ``WeightedBucketSampler``,
``sample_experience_uids``, ``ExperienceBucketManager``, ``compute_postcal_metrics``,
``replace_recorded_old_log_probs`` and ``compute_token_on_off_policy_loss`` on seeded random inputs.
``verl.utils.torch_functional`` is the authors' own file.

Usage: python exgrpo_gen.py GIT_DIR WORK_DIR OUT_DIR
"""
import os
import random
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _authors  # noqa: E402

git_dir, work, out_dir = sys.argv[1:4]
COMMIT = "01f4ae066249e6965ce0d5512ccdf99a12895c74"
SRC = "ExGRPO/exgrpo/verl/verl"


def extract(path, dest):
    _authors.write(dest, _authors.show(git_dir, COMMIT, f"{SRC}/{path}"))


pkg = os.path.join(work, "exgrpo_authors")
for name in ["weighted_bucket_sampler.py", "experience_bucket_manager.py", "experience_helpers.py",
             "experience_trainer_ops.py"]:
    extract(f"mix_src/experience/{name}", os.path.join(pkg, "experience", name))
extract("mix_src/mix_core_alg.py", os.path.join(pkg, "mix_core_alg.py"))
open(os.path.join(pkg, "__init__.py"), "w").close()
open(os.path.join(pkg, "experience", "__init__.py"), "w").close()
stub = os.path.join(work, "stub_verl", "verl")
extract("utils/torch_functional.py", os.path.join(stub, "utils", "torch_functional.py"))
with open(os.path.join(stub, "__init__.py"), "w") as f:
    f.write("class DataProto:\n    def __init__(self, batch):\n        self.batch = batch\n\n"
            "    @classmethod\n    def from_single_dict(cls, d):\n        return cls(dict(d))\n")
with open(os.path.join(stub, "utils", "__init__.py"), "w") as f:
    f.write("")
with open(os.path.join(stub, "utils", "model.py"), "w") as f:
    f.write("import torch\n\ndef compute_position_id_with_mask(mask):\n"
            "    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0, max=None)\n")
sys.path[:0] = [os.path.join(work, "stub_verl"), work]

from exgrpo_authors.experience import experience_helpers as helpers  # noqa: E402
from exgrpo_authors.experience import experience_trainer_ops as ops  # noqa: E402
from exgrpo_authors.experience.experience_bucket_manager import ExperienceBucketManager  # noqa: E402
from exgrpo_authors.experience.weighted_bucket_sampler import WeightedBucketSampler  # noqa: E402
from exgrpo_authors.mix_core_alg import compute_token_on_off_policy_loss  # noqa: E402

out = {"commit": COMMIT, "sampler": [], "sample_uids": [], "manager": [], "metric": [], "swap": [], "loss": []}

# 1. WeightedBucketSampler.sample
bucket_cases = [
    {k: list(range(100 * k, 100 * k + 20)) for k in range(1, 8)},
    {3: [30, 31], 1: [10, 11, 12, 13, 14, 15], 2: list(range(20, 40)), 5: [50]},
    {k: list(range(10 * k, 10 * k + (k % 3) + 1)) for k in range(0, 8)},
    {7: [70, 71, 72], 6: [60], 4: list(range(40, 49))},
]
for bi, buckets in enumerate(bucket_cases):
    for method in ["normal", "linear", "sqrt", "linear_clip"]:
        if method == "linear" and list(buckets) == [0]:
            continue
        for n, seed in [(5, 1), (12, 7), (64, 123)]:
            sampler = WeightedBucketSampler(buckets, n_rollout=8, weighting_method=method)
            try:
                samples, _ = sampler.sample(n, seed=seed)
                error = None
            except (ZeroDivisionError, ValueError) as exc:  # excess left only for zero-weight buckets (bucket 0)
                samples, error = [], type(exc).__name__
            out["sampler"].append({"buckets": buckets, "method": method, "n": n, "seed": seed, "error": error,
                                   "probabilities": dict(sampler.probabilities), "samples": list(samples)})

# 3. ExperienceBucketManager under a random sequence of operations (also feeds sample_experience_uids)
rng = random.Random(5)
manager = ExperienceBucketManager()
pool = {}
for op_i in range(300):
    r = rng.random()
    uid = rng.randrange(40)
    if r < 0.6:
        k = rng.randrange(0, 8)
        num = k if rng.random() < 0.5 else torch.tensor(k)
        manager.update_bucket(uid, num)
        pool[uid] = True
        op = ("update", uid, k)
    elif r < 0.8:
        manager.remove_from_bucket(uid)
        pool.pop(uid, None)
        op = ("remove", uid, None)
    else:
        for u in [u for u in pool if rng.random() < 0.2]:
            del pool[u]
        manager.cleanup_consistency(pool)
        op = ("cleanup", sorted(pool), None)
    out["manager"].append({"op": op, "buckets": [(k, list(v)) for k, v in manager.experience_bucket.items()],
                           "uid_to_bucket": dict(manager.uid_to_bucket), "stats": manager.get_bucket_stats()})
    if op_i % 50 == 49:
        # 2. sample_experience_uids on the manager's current buckets
        valid = sorted(u for u in manager.uid_to_bucket if u % 5 != 0)
        for method in ["normal", None]:
            for n_exp in [0, 3, min(len(valid), 9)]:
                trainer = types.SimpleNamespace(exp_bucket_manager=method, bucket_manager=manager, n_rollout=8)
                random.seed(op_i)
                np.random.seed(op_i)
                uids = helpers.sample_experience_uids(trainer, valid, n_exp)
                out["sample_uids"].append({"buckets": [(k, list(v)) for k, v in manager.experience_bucket.items()],
                                           "valid": valid, "method": method, "n_exp": n_exp, "seed": op_i,
                                           "uids": list(uids) if n_exp > 0 else []})

# 4. compute_postcal_metrics (Q1) with a char-level tokenizer and a seeded stand-in actor
class CharTokenizer:
    pad_token, eos_token = "#", "$"
    pad_token_id, eos_token_id = ord("#"), ord("$")

    def __call__(self, text, return_tensors="pt", add_special_tokens=False):
        ids = torch.tensor([[ord(c) for c in text]], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class Actor:
    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.calls = []

    def compute_log_prob_ents(self, batch):
        t = batch.batch["responses"].shape[1]
        ents = torch.rand(8, t, generator=self.gen) * 2.0
        logp = -torch.rand(8, t, generator=self.gen) * 3.0
        self.calls.append({"ents": ents, "old_log_probs": logp, "responses": batch.batch["responses"].clone()})
        return {"ents": types.SimpleNamespace(batch=ents), "old_log_probs": types.SimpleNamespace(batch=logp)}


for n_cand, seed, kind in [(5, 11, "ent"), (8, 12, "ent"), (13, 13, "ent"), (19, 14, "ppl"), (3, 15, "ppl")]:
    gen = random.Random(seed)
    inputs = ["Q" * gen.randint(2, 6) for _ in range(n_cand)]
    exps = ["abcdefghijklmnop"[: gen.randint(1, 11)] + "$" for _ in range(n_cand)]
    actor = Actor(seed)
    dataset = types.SimpleNamespace(tokenizer=CharTokenizer(), max_prompt_length=8, max_target_length=16,
                                    truncation="right")
    trainer = types.SimpleNamespace(dataset=dataset, actor_rollout_wg=actor, exp_metric=kind)
    metrics = helpers.compute_postcal_metrics(trainer, list(inputs), list(exps))
    key = "ents" if kind == "ent" else "old_log_probs"
    values = torch.cat([c[key] for c in actor.calls])[:n_cand]
    responses = torch.cat([c["responses"] for c in actor.calls])[:n_cand]
    out["metric"].append({"kind": kind, "values": values, "responses": responses, "pad_token_id": ord("#"),
                          "metrics": metrics, "argmin": int(np.argmin(metrics))})

# 5. replace_recorded_old_log_probs
torch.manual_seed(99)
rows, width = 6, 10
old = -torch.rand(rows, width)
recorded = torch.zeros(rows, width)
recorded[1, :6] = -torch.rand(6)
recorded[4, :9] = -torch.rand(9)
recorded[5, :3] = -torch.rand(3)  # an on-policy row carrying a vector: must stay
off_rows = torch.tensor([False, True, False, False, True, False])
prefix = torch.zeros(rows, width, dtype=torch.bool)
prefix[1, :6] = True
prefix[4, :9] = True
batch = types.SimpleNamespace(batch={"old_log_probs": old.clone(), "recorded_old_log_prob": recorded,
                                     "responses": torch.randint(0, 50, (rows, width)),
                                     "input_ids": torch.randint(0, 50, (rows, 14)),
                                     "attention_mask": torch.ones(rows, 14, dtype=torch.long)})
trainer = types.SimpleNamespace(train_collate_fn=types.SimpleNamespace(is_mixed_policy=True),
                                config=types.SimpleNamespace(trainer=types.SimpleNamespace(exp_is_correct=True)),
                                tokenizer=types.SimpleNamespace(pad_token_id=0))
ops.replace_recorded_old_log_probs(trainer, batch, off_rows, prefix)
out["swap"].append({"old": old, "recorded": recorded, "off_rows": off_rows, "swapped": batch.batch["old_log_probs"]})

# 6. compute_token_on_off_policy_loss (the ExGRPO copy)
torch.manual_seed(2026)
for remove_clip, remove_mean, reshape, max_clip, all_max in [
        (True, True, "p_div_p_0.1", None, None), (False, True, "p_div_p_0.1", None, None),
        (False, False, "no_reshape", None, None), (True, False, "p_div_p_0.5", 0.9, None),
        (True, True, "p_div_p_0.3", None, 0.8)]:
    rows, width = 8, 12
    log_prob = -torch.rand(rows, width) * 2.0
    old_log_prob = log_prob + torch.randn(rows, width) * 0.3
    mask = torch.ones(rows, width)
    for r in range(rows):
        mask[r, torch.randint(4, width + 1, ()).item():] = 0
    prefix = torch.zeros(rows, width, dtype=torch.bool)
    prefix[0] = mask[0].bool()
    prefix[5] = mask[5].bool()
    advantages = torch.randn(rows, 1).expand(rows, width).clone()
    lp = log_prob.clone().requires_grad_(True)
    ret = compute_token_on_off_policy_loss(
        old_log_prob=old_log_prob, log_prob=lp, advantages=advantages, eos_mask=mask, cliprange=0.2,
        clip_upper_bound=1.0, prefix_mask=prefix, off_cliprange=None, off_max_clip=max_clip,
        all_max_clip=all_max, off_policy_reshape=reshape, loss_remove_token_mean=remove_mean,
        loss_remove_clip=remove_clip)
    ret["pg_loss"].backward()
    out["loss"].append({"cfg": dict(loss_remove_clip=remove_clip, loss_remove_token_mean=remove_mean,
                                    off_policy_reshape=reshape, off_policy_max_clip=max_clip,
                                    all_max_clip=all_max),
                        "log_prob": log_prob, "old_log_prob": old_log_prob, "advantages": advantages,
                        "mask": mask, "prefix_mask": prefix, "grad": lp.grad.clone(),
                        "ret": {k: v.detach().clone() for k, v in ret.items()}})

torch.save(out, os.path.join(out_dir, "exgrpo_golden.pt"))
print("wrote", {k: len(v) for k, v in out.items() if isinstance(v, list)})
