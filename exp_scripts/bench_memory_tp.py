"""``bench_memory.py --tp N``: what one rank holds at actor tensor parallel N, measured on gloo ranks of this machine.

A Qwen2-shaped model (bench_memory.QWEN2_SHAPE: hidden 896, 14 / 2 heads, MLP 4864; an untied head as the recipes'
Qwen2.5 models, ``--vocab`` rows) is split as the actor splits it (verl/utils/tensor_parallel.py
``apply_tensor_parallel`` on the ``(dp, tp)`` mesh of ``build_tp_mesh``, then FSDP2 over dp when dp > 1,
verl/utils/fsdp_utils.py ``apply_fsdp2``), trained one step (forward, backward, AdamW), and each rank sums the local
shards of its parameters, gradients and AdamW moments; with ``--tp-pp P`` also split into P pipeline stages as the
actor splits it (verl/utils/pipeline_parallel.py; pp P alone, and pp P x dp 2 x tp N) and trained one step through
the 1F1B schedule. Printed per layout (tp N; dp 2 x tp N; pp P; pp P x dp 2 x tp N): those bytes as a
ratio to one unsplit rank's, next to the memory plan's ratio (``luffy_pool.memory_plan.layout.rank_params`` / dp;
1 / (tp x dp) up to the parts every tp rank keeps whole: the norms).

It also counts the collectives one forward + backward issues on the tp ranks (torch's ``CommDebugMode``, which sees
DTensor's collectives) at 1 and at 2 decoder layers: the difference is one decoder layer's. Megatron-LM's layout
(Shoeybi et al. 2019, "Megatron-LM", §3, Fig. 3) all-reduces twice per layer in forward (after the row-parallel
o_proj and down_proj) and once per column-parallel input in backward; with transformers' separate q/k/v and
gate/up projections (``base_model_tp_plan``), each of the five column-parallel modules reduces its input gradient.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for path in (HERE, REPO):
    if path not in sys.path:
        sys.path.insert(0, path)


def local_bytes(tensors) -> int:
    """Bytes of the local shards of ``tensors`` (a DTensor's ``to_local()``; FSDP2's parameters are DTensors)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def state_bytes(model, optimizer) -> dict:
    """``params``, ``grads`` and ``adam`` (both AdamW moments) bytes this rank holds."""
    params = list(model.parameters())
    moments = [v for state in optimizer.state.values() for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")]
    return {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params), "adam": local_bytes(moments)}


def count_collectives(fn) -> dict:
    """``{collective name: count}`` of the DTensor collectives ``fn()`` issues (torch's CommDebugMode)."""
    from torch.distributed.tensor.debug import CommDebugMode

    mode = CommDebugMode()
    with mode:
        fn()
    return {getattr(op, "__name__", str(op)).split(".")[-1]: int(n) for op, n in mode.get_comm_counts().items()}


def per_layer(one: dict, two: dict) -> dict:
    """One decoder layer's collectives: the counts at 2 layers minus those at 1 (every other module is the same)."""
    return {k: two.get(k, 0) - one.get(k, 0) for k in sorted(set(one) | set(two)) if two.get(k, 0) - one.get(k, 0)}


def build_model(layers: int, vocab: int, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench_memory import QWEN2_SHAPE

    torch.manual_seed(seed)
    cfg = Qwen2Config(**dict(QWEN2_SHAPE, vocab_size=vocab, tie_word_embeddings=False), num_hidden_layers=layers)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")


def _batch(vocab: int, rows: int = 2, width: int = 32):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (rows, width), generator=g)


def forward_backward_counts(model, ids) -> dict:
    """``{"forward": counts, "backward": counts}`` of one forward (logits, a scalar loss) and its backward."""
    loss = {}

    def forward():
        loss["value"] = model(input_ids=ids).logits.float().logsumexp(-1).mean()

    forward_counts = count_collectives(forward)
    return {"forward": forward_counts, "backward": count_collectives(lambda: loss["value"].backward())}


def _pipeline_step(rank: int, world: int, tp: int, pp: int, layers: int, vocab: int) -> dict:
    """The model split over the ``(pp, dp, tp)`` mesh as the actor splits it (verl/utils/pipeline_parallel.py: this
    rank's stages, TP, FSDP2 over dp per stage), one training step through the 1F1B schedule; its state bytes."""
    import torch

    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.pipeline_parallel import build_pipeline_model, build_pp_mesh

    mesh, _ = build_pp_mesh("cpu", world, pp, tp)
    dp_mesh = mesh["dp"]
    shard = (lambda m: apply_fsdp2(m, dp_mesh)) if dp_mesh.size() > 1 else None
    pipe = build_pipeline_model(build_model(layers, vocab), mesh["pp"], "1f1b", "cpu", shard, mesh["tp"])
    pipe.module.train()
    ids = _batch(vocab, rows=2 * pp)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(ids.size(1)).expand_as(ids),
        "responses": ids[:, -8:],
    }
    grad = torch.full((ids.size(0), 8), -1.0 / ids.numel())  # d loss / d log-prob of a mean NLL
    pipe.backward(batch, pp, 1.0, grad, torch.zeros_like(grad))
    optimizer = torch.optim.AdamW(pipe.module.parameters(), lr=1e-3)
    optimizer.step()
    return {"rank": rank, "state": state_bytes(pipe.module, optimizer), "counts": {}}


def measure_rank(rank: int, world: int, tp: int, layers: int, vocab: int, pp: int = 1) -> dict:
    """One rank: the model split over (dp, tp) (``pp`` > 1: over (pp, dp, tp)), one training step; its state bytes,
    and at pp 1 its collectives (forward + backward) at 1 and at ``layers`` decoder layers. ``world`` 1 is the
    unsplit reference."""
    import torch

    if pp > 1:
        return _pipeline_step(rank, world, tp, pp, layers, vocab)

    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.tensor_parallel import apply_tensor_parallel, build_tp_mesh

    ids = _batch(vocab)

    def split(model):
        if world == 1:
            return model
        mesh = build_tp_mesh("cpu", world, tp)
        model = apply_tensor_parallel(model, mesh["tp"])
        return apply_fsdp2(model, mesh["dp"]) if world // tp > 1 else model

    counts = {}
    for n in sorted({1, layers}):
        model = split(build_model(n, vocab))
        counts[n] = forward_backward_counts(model, ids)
        if n == layers:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            optimizer.step()
            state = state_bytes(model, optimizer)
    return {"rank": rank, "state": state, "counts": {str(k): v for k, v in counts.items()}}


def _gloo_rank(rank, world, port, tp, layers, vocab, pp=1):
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        return measure_rank(rank, world, tp, layers, vocab, pp)
    finally:
        dist.destroy_process_group()


def planned_ratio(tp: int, dp: int, layers: int, vocab: int, pp: int = 1) -> float:
    """The memory plan's share of one rank (layout.rank_params / dp over all parameters)."""
    from luffy_pool.memory_plan.layout import rank_params
    from luffy_pool.memory_plan.shapes import shape_from_dict

    from bench_memory import QWEN2_SHAPE

    cfg = dict(QWEN2_SHAPE, vocab_size=vocab, tie_word_embeddings=False, num_hidden_layers=layers, model_type="qwen2")
    s = shape_from_dict(cfg, "bench_memory_tp")
    return rank_params(s, tp, pp) / dp / s.params


def run(tp: int, layers: int = 2, vocab: int = 8192, dp2: bool = True, pp: int = 1) -> dict:
    """The reference rank, then tp ranks (dp 1) and, with ``dp2``, 2 x tp ranks (dp 2); with ``pp`` > 1 also pp
    ranks and pp x tp x 2 ranks (dp 2): ``{layout: result}``."""
    from luffy_pool_dev.gloo_ranks import run_gloo_ranks  # dev/: N gloo ranks of this machine, no Ray

    out = {"reference": measure_rank(0, 1, 1, layers, vocab)}
    layouts = [(1, 1, tp), *([(1, 2, tp)] if dp2 else [])]
    if pp > 1:
        layouts += [(pp, 1, 1), (pp, 2, tp)]
    for p, dp, t in layouts:
        ranks = run_gloo_ranks(_gloo_rank, p * dp * t, t, layers, vocab, p, timeout_s=1800)
        out[f"pp{p}_dp{dp}_tp{t}"] = {"pp": p, "dp": dp, "tp": t, "ranks": ranks}
    return out


def report(results: dict, layers: int, vocab: int) -> list[str]:
    ref = results["reference"]["state"]
    lines = [
        f"bench_memory --tp: Qwen2-shaped (hidden 896, 14/2 heads, MLP 4864, untied head, V={vocab}), {layers} layers,"
        " fp32, gloo ranks; bytes per rank / one unsplit rank's"
    ]
    for name, r in results.items():
        if name == "reference":
            continue
        worst = max(r["ranks"], key=lambda x: x["state"]["params"])["state"]
        ratios = {k: worst[k] / ref[k] for k in ("params", "grads", "adam")}
        plan = planned_ratio(r["tp"], r["dp"], layers, vocab, r["pp"])
        lines.append(
            f"  pp {r['pp']} x dp {r['dp']} x tp {r['tp']}: params {worst['params'] / 2**20:.1f} MiB "
            f"({ratios['params']:.3f}), grads {ratios['grads']:.3f}, AdamW {ratios['adam']:.3f}; plan {plan:.3f}; "
            f"1/(pp x tp x dp) = {1 / (r['pp'] * r['tp'] * r['dp']):.3f}"
        )
        if r["dp"] == 1 and r["pp"] == 1 and r["tp"] > 1:
            from luffy_pool.memory_plan.layout import tp_allreduces_per_layer

            expected = tp_allreduces_per_layer()
            counts = r["ranks"][0]["counts"]
            layer = {p: per_layer(counts["1"][p], counts[str(layers)][p]) for p in ("forward", "backward")}
            lines.append(
                f"  tp {r['tp']} collectives per decoder layer: forward {json.dumps(layer['forward'])}, backward "
                f"{json.dumps(layer['backward'])}; the plan: all_reduce {expected['forward']} forward, "
                f"{expected['backward']} backward"
            )
    return lines


def tp_main(args) -> int:
    layers = max(2, args.layers)  # one layer's collectives are the difference between 2 layers and 1
    results = run(args.tp, layers=layers, vocab=args.tp_vocab, dp2=not args.tp_no_dp2, pp=args.tp_pp)
    for line in report(results, layers, args.tp_vocab):
        print(line, flush=True)
    return 0
