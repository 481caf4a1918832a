"""Validation: ``data.val_files`` scored with ``rollout.n_val`` samples per prompt at ``val_temperature``.

One push per validation (the engines hold the weights, awake, until the last chunk is generated), on whichever
engines the rollout source generates with (the actor's or the split ones). Metrics ``val/test_score/<data_source>``
(mean over rows, so replicated rows give avg@k) and ``val/avg_score`` (mean over sources; also logged under LUFFY's
name ``avg_score``, its best-checkpoint key).
"""

from __future__ import annotations

import numpy as np

from luffy_pool.trainer.outputs import validation_samples
from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.workers.sharding_manager.fsdp_sharding_manager import HOLD_WEIGHTS_KEY

GEN_KEYS = ("input_ids", "attention_mask", "position_ids")


def score_validation(rollout, sections, val_dataset, collate_fn, val_reward_fn, tokenizer) -> tuple[dict, list]:
    """-> (metrics, the generations to log: ``trainer.val_generations_to_log`` of them)."""
    n_val = int(sections.workers.rollout.n_val)
    gen_wg = rollout.gen_wg
    chunk = max(int(sections.data.val_batch_size or len(val_dataset)), gen_wg.world_size)
    scores_by_source: dict[str, list[float]] = {}
    n_log, samples = int(sections.trainer.val_generations_to_log or 0), []
    starts = list(range(0, len(val_dataset), chunk))
    for start in starts:
        rows = [val_dataset[i] for i in range(start, min(start + chunk, len(val_dataset)))]
        batch = DataProto.from_single_dict(collate_fn(rows))
        gen_batch = batch.pop(batch_keys=list(GEN_KEYS))
        gen_batch, pad = pad_dataproto_to_divisor(gen_batch, gen_wg.world_size)
        if start == 0:
            rollout.push()
        gen_batch.meta_info[HOLD_WEIGHTS_KEY] = start != starts[-1]
        gen_out = gen_wg.generate_validation(gen_batch)
        gen_out.meta_info.pop("rollout_stats", None)
        gen_out = unpad_dataproto(gen_out, pad * n_val)
        batch = batch.repeat(repeat_times=n_val, interleave=True).union(gen_out)
        scores, _ = val_reward_fn(batch)
        for ds, s in zip(batch.non_tensor_batch["data_source"], scores.sum(-1).tolist()):
            scores_by_source.setdefault(str(ds), []).append(s)
        samples += validation_samples(batch, scores, tokenizer, n_log - len(samples))
    out = {f"val/test_score/{ds}": float(np.mean(v)) for ds, v in sorted(scores_by_source.items())}
    out["val/avg_score"] = float(np.mean(list(out.values()))) if out else 0.0
    out["avg_score"] = out["val/avg_score"]  # LUFFY's name for the same mean (its best-checkpoint key)
    return out, samples
