"""Memory benchmark: peak host memory of one actor update and one log-prob pass, ours vs full logits.

A Qwen2-shaped model with the real vocabulary (V = 151936; hidden 896, 14/2 heads, MLP 4864 as
Qwen2.5-0.5B, tied embeddings) but only ``--layers`` decoder layers (2 by default: the layers'
activations are the same for both paths, the LM head is what differs), random weights, fp32 on CPU.
The batch is ``--rows`` rows of ``--width`` positions (a quarter prompt, three quarters response) with
about ``--tokens`` real tokens each (a fifth in the prompt, left-padded; the rest response,
right-padded), distinct prompts. Each measurement runs in its own process:

  ours   the actor as configured (``model.logprob_chunk_size``, default 1024): only response tokens
         go through the LM head, ``--chunk`` of them at a time, recomputed in backward;
  naive  ``logprob_chunk_size=0``: the padded forward's full ``[rows, width, V]`` fp32 logits.

Peak = the process's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) during the phase minus
its RSS just before: the model, the batch and the optimizer state (created beforehand, as from the
second training step on) are resident in both and not counted; the update's gradients and everything
the forward/backward allocates are. glibc returns large blocks to the OS at once
(``MALLOC_MMAP_THRESHOLD_``), so RSS tracks tensor memory.

    .venv/bin/python exp_scripts/bench_memory.py [--rows 4 --width 1024 --tokens 256] [--chunk 1024]

SP-2 rows (``logprob-sp2``, ``update-sp2``): the same batch on 2 forked gloo ranks forming one Ulysses
SP group (``ulysses_forward.py``; each rank holds 1/2 of the positions, the model replicated) with
gradient checkpointing on, as ``train_16k.sh`` runs SP (the layers' activations, the same in both
modes, then do not hide the head's share). ``ours`` scores through the chunked head, ``naive``
through the dense head on the local slice (``[rows, width/2, V]`` fp32 logits per rank). The peak is
the larger rank's. ``--sp 1`` drops these rows.

Prints a table, the bytes per real token, and as its last line ``peak ours/naive=<r>`` (the larger of
the ratios of all rows). The defaults fit this 24 GB machine; a long-response shape
(``--width 4096 --tokens 1000``) needs ~40 GB for the naive update.

``--tp 2 [--tp-vocab 8192] [--tp-no-dp2] [--tp-pp 2]`` instead measures what one rank holds at actor tensor parallel 2
(and dp 2 x tp 2; with ``--tp-pp 2`` also pp 2 and pp 2 x dp 2 x tp 2) on gloo ranks, and the TP collectives per
decoder layer (bench_memory_tp.py).

``--predict [--sizes ROWSxWIDTHxTOKENSxLAYERS,...] [--checkpointing]`` instead measures ours at each size
and prints it next to ``luffy_pool.memory_plan``'s prediction of the same quantity (the plan's lines of
that phase minus the resident ones), and the largest relative error. ``--jobs 2`` runs the two phase
processes of a size at once (each still measures its own peak).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN2_SHAPE = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)
PHASES = ("logprob", "update")
SP_SUFFIX = "-sp"  # "logprob-sp2": the phase on an SP group of 2 ranks
MODES = ("ours", "naive")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--width", type=int, default=1024, help="positions per row (prompt + response)")
    p.add_argument("--tokens", type=int, default=256, help="real (non-pad) tokens per row")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the Qwen2-shaped model")
    p.add_argument("--chunk", type=int, default=1024, help="ours: model.logprob_chunk_size (tokens)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sp", type=int, default=2, help="also measure both phases at this Ulysses SP size (1: skip)")
    p.add_argument(
        "--modes", default="ours,naive", help="ours,naive (default) or one of them; the ratio line needs both"
    )
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in the update (non-reentrant)")
    p.add_argument(
        "--predict",
        action="store_true",
        help="predicted (luffy_pool.memory_plan) vs measured peak of ours at the sizes of --sizes",
    )
    p.add_argument(
        "--sizes",
        default="2x512x256x2,4x1024x512x2,4x2048x1024x4",
        help="--predict: ROWSxWIDTHxTOKENSxLAYERS,... (three or more)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="--predict: phase processes run at once (each measures its own peak; default 1)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        help="instead: per-rank params/grads/AdamW bytes at actor tensor parallel TP (and dp 2 x TP) on gloo ranks, "
        "their ratio to one rank's, and the TP all-reduces per decoder layer (bench_memory_tp.py)",
    )
    p.add_argument("--tp-vocab", type=int, default=8192, help="--tp: vocabulary rows of the model")
    p.add_argument("--tp-no-dp2", action="store_true", help="--tp: skip the dp 2 x tp layout")
    p.add_argument(
        "--tp-pp",
        type=int,
        default=1,
        help="--tp: also pipeline parallel PP alone and PP x dp 2 x TP (PP must divide --layers, at least 2)",
    )
    p.add_argument("--child", nargs=2, metavar=("MODE", "PHASE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    heads, kv = QWEN2_SHAPE["num_attention_heads"], QWEN2_SHAPE["num_key_value_heads"]
    if args.tp < 1 or heads % args.tp or kv % args.tp:
        p.error(f"--tp {args.tp} must divide the model's {heads} attention and {kv} kv heads")
    if args.tp_pp < 1 or max(2, args.layers) % args.tp_pp:
        p.error(f"--tp-pp {args.tp_pp} must divide the decoder layers (--layers {args.layers}, at least 2)")
    if args.rows < 1 or args.layers < 1 or args.chunk < 1 or args.sp < 1 or args.jobs < 1:
        p.error("--rows, --layers, --chunk, --sp and --jobs must be >= 1")
    if args.sp > 1 and QWEN2_SHAPE["num_attention_heads"] % args.sp:
        p.error(f"--sp {args.sp} must divide the model's {QWEN2_SHAPE['num_attention_heads']} attention heads")
    if not 8 <= args.width or not 2 <= args.tokens <= args.width:
        p.error("need --width >= 8 and 2 <= --tokens <= --width")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: choose from {','.join(MODES)}")
    return args


def make_batch(rows: int, width: int, tokens: int, vocab: int, seed: int = 0) -> dict:
    """Left-padded prompts (1/5 of the real tokens) in the first quarter, right-padded responses after."""
    import torch

    prompt_width = max(1, width // 4)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, width), generator=g)
    mask = torch.zeros(rows, width, dtype=torch.long)
    n_prompt = max(1, min(prompt_width, tokens // 5))
    n_resp = min(width - prompt_width, tokens - n_prompt)
    mask[:, prompt_width - n_prompt : prompt_width] = 1
    mask[:, prompt_width : prompt_width + n_resp] = 1
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": pos,
        "responses": ids[:, prompt_width:],
        "old_log_probs": torch.zeros(rows, width - prompt_width),
        "advantages": torch.randn(rows, width - prompt_width, generator=g),
    }


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def phases(args) -> list[str]:
    """The table's rows: the plain phases, then the same phases on an SP group when ``--sp`` > 1."""
    return list(PHASES) + ([f"{ph}{SP_SUFFIX}{args.sp}" for ph in PHASES] if args.sp > 1 else [])


def _sp_rank(rank, world, port, args, mode, phase):
    """One rank of the SP group (``luffy_pool_dev.gloo_ranks.run_gloo_ranks``): its own peak."""
    import torch.distributed as dist

    from verl.utils.fsdp_mesh import build_ulysses_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    args.threads = max(1, args.threads // world)  # this fork's copy: the ranks share --threads cores
    try:
        return run_child(args, mode, phase, ulysses_group=build_ulysses_mesh("cpu", world, world).get_group("sp"))
    finally:
        dist.destroy_process_group()


def run_sp_child(args, mode: str, phase: str) -> dict:
    """``phase`` on ``--sp`` forked gloo ranks; the result of the rank with the larger peak."""
    from luffy_pool_dev.gloo_ranks import run_gloo_ranks  # dev/: N gloo ranks of this machine, no Ray

    per_rank = run_gloo_ranks(_sp_rank, args.sp, args, mode, phase.split(SP_SUFFIX)[0], timeout_s=1800)
    worst = max(per_rank, key=lambda r: r["peak_bytes"])
    return dict(worst, phase=phase)


def run_child(args, mode: str, phase: str, ulysses_group=None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Qwen2Config(num_hidden_layers=args.layers, **QWEN2_SHAPE), dtype=torch.float32, attn_implementation="sdpa"
    )
    if ulysses_group is not None or args.checkpointing:  # SP runs as train_16k.sh: with checkpointing
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = make_batch(args.rows, args.width, args.tokens, model.config.vocab_size)
    rows = args.rows
    from luffy_pool.config.compose import actor_config

    cfg = actor_config(
        ppo_mini_batch_size=rows,
        ppo_micro_batch_size=rows,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=rows * args.width,
        ppo_epochs=1,
        clip_ratio=0.2,
        clip_upper_bound=1.0,
        entropy_coeff=0.001,
        grad_clip=1.0,
        use_kl_loss=False,
    )
    from verl.utils.optim import build_adamw

    # The worker's AdamW (fused kernel on CPU): the per-parameter loop would add two [V, H] temporaries.
    optimizer = build_adamw(model.parameters(), lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
    if phase == "update":  # optimizer state exists from the second step on: resident before the phase
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    actor = DataParallelPPOActor(
        cfg,
        model,
        optimizer,
        shared_prompt_forward=True,
        logprob_chunk_size=args.chunk if mode == "ours" else 0,
        ulysses_group=ulysses_group,
    )
    data = DataProto.from_dict(
        tensors=batch, meta_info={"temperature": 1.0, "micro_batch_size": rows, "use_dynamic_bsz": False}
    )
    base = _rss_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current RSS
    t0 = time.perf_counter()
    if phase == "update":
        actor.update_policy(data)
    else:
        actor.compute_log_prob(data, calculate_entropy=True)
    seconds = time.perf_counter() - t0
    peak = _rss_kb("VmHWM") - base
    real = int(batch["attention_mask"].sum())
    response = int(batch["attention_mask"][:, -batch["responses"].shape[1] :].sum())
    return {
        "mode": mode,
        "phase": phase,
        "peak_bytes": peak * 1024,
        "resident_bytes": base * 1024,
        "seconds": seconds,
        "real_tokens": real,
        "response_tokens": response,
    }


def _child_cmd(args, mode: str, phase: str) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        phase,
        "--rows",
        str(args.rows),
        "--width",
        str(args.width),
        "--tokens",
        str(args.tokens),
        "--layers",
        str(args.layers),
        "--chunk",
        str(args.chunk),
        "--threads",
        str(args.threads),
        "--sp",
        str(args.sp),
    ] + (["--checkpointing"] if args.checkpointing else [])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        mode, phase = args.child
        print(json.dumps(run_sp_child(args, mode, phase) if SP_SUFFIX in phase else run_child(args, mode, phase)))
        return 0
    if args.predict:
        return predict_main(args)
    if args.tp > 1:
        from bench_memory_tp import tp_main

        return tp_main(args)
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        OMP_NUM_THREADS=str(args.threads),
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    )
    gib = 2**30
    logits_bytes = args.rows * args.width * QWEN2_SHAPE["vocab_size"] * 4
    print(
        f"bench_memory: Qwen2-shaped, V={QWEN2_SHAPE['vocab_size']}, hidden {QWEN2_SHAPE['hidden_size']}, "
        f"{args.layers} layers (fp32, CPU); {args.rows} rows x {args.width} positions, ~{args.tokens} real tokens/row; "
        f"ours: logprob_chunk_size={args.chunk}; naive: full [rows, width, V] fp32 logits = {logits_bytes / gib:.2f} GiB",
        flush=True,
    )
    results = {}
    for phase in phases(args):
        for mode in args.modes:
            proc = subprocess.run(_child_cmd(args, mode, phase), env=env, capture_output=True, text=True, cwd=REPO)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{mode} {phase} failed (exit {proc.returncode})")
            results[mode, phase] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = results[mode, phase]
            print(
                f"  {phase:12s} {mode:5s} peak +{r['peak_bytes'] / gib:6.2f} GiB over {r['resident_bytes'] / gib:5.2f} GiB "
                f"resident  ({r['seconds']:.1f} s)",
                flush=True,
            )
    if len(args.modes) < 2:
        for (mode, phase), r in results.items():
            print(
                f"{phase}: {mode} bytes per real token {r['peak_bytes'] / r['real_tokens']:,.0f} "
                f"({r['real_tokens']} real tokens, {r['response_tokens']} response tokens)"
            )
        return 0
    ratios = {}
    for phase in phases(args):
        ours, naive = results["ours", phase], results["naive", phase]
        ratios[phase] = ours["peak_bytes"] / naive["peak_bytes"]
        print(
            f"{phase}: ours/naive={ratios[phase]:.3f}; bytes per real token: ours {ours['peak_bytes'] / ours['real_tokens']:,.0f}"
            f", naive {naive['peak_bytes'] / naive['real_tokens']:,.0f} ({ours['real_tokens']} real tokens, "
            f"{ours['response_tokens']} response tokens)"
        )
    print(f"peak ours/naive={max(ratios.values()):.3f}")
    return 0


# ---------------------------------------------------------------------- predicted vs measured
def predicted_bytes(args, phase: str) -> int:
    """luffy_pool.memory_plan's estimate of what ``run_child(args, "ours", phase)`` measures: the phase's
    lines minus those resident before it (parameters, AdamW moments), for this one-process fp32 CPU actor
    (no FSDP shards or gathers, no CUDA context), padded rows, response tokens scored."""
    import dataclasses

    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.sections import ConfigSections
    from luffy_pool.memory_plan.estimate import PlanInputs, build_plan
    from luffy_pool.memory_plan.shapes import shape_from_dict

    shape = shape_from_dict(dict(QWEN2_SHAPE, num_hidden_layers=args.layers), "bench_memory Qwen2 shape")
    batch = make_batch(args.rows, args.width, args.tokens, 8)
    scored = int(batch["attention_mask"][:, -batch["responses"].shape[1] :].sum())
    positions = args.rows * args.width
    yaml = PlanInputs.from_sections(
        ConfigSections.from_config(compose_config(["actor_rollout_ref.model.path=bench"])), "cpu"
    )
    # This process's actor: one rank, no SP, no reference, nothing offloaded; the rest as the bench measures it.
    inputs = dataclasses.replace(
        yaml,
        world=1,
        nodes=1,
        sp=1,
        use_ref=False,
        actor_param_offload=False,
        optimizer_offload=False,
        fsdp=False,
        device="cpu",
        param_dtype_bytes=4,
        gradient_checkpointing=args.checkpointing,
        logprob_chunk_size=args.chunk,
        update_tokens=positions,
        old_logprob_tokens=positions,
        ref_logprob_tokens=positions,
        # the bench's optimizer: build_adamw's default step_impl (auto: fused on CPU)
        update_scored_tokens=scored,
        logprob_scored_tokens=scored,
        step_impl="auto",
        response_positions=args.rows * batch["responses"].shape[1],
    )
    plan = build_plan(inputs, shape, None)
    names = ("update: forward/backward", "update: optimizer step") if phase == "update" else ("log-prob: old (actor)",)
    resident = ("actor fp32 params", "AdamW moments")
    # update_policy runs both update phases: its peak is the larger one
    return max(sum(line.bytes for line in plan.phase(n).lines if not line.what.startswith(resident)) for n in names)


def parse_sizes(text: str) -> list[tuple[int, int, int, int]]:
    sizes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--sizes: {item!r} is not ROWSxWIDTHxTOKENSxLAYERS")
        sizes.append(tuple(int(p) for p in parts))
    return sizes


def measure_vs_predict(args, env=None, jobs: int = 1) -> list[dict]:
    """One row per phase at ``args``' size: measured peak (its own process) and the plan's prediction.
    ``jobs`` > 1 runs that many phase processes at once: each measures its own peak RSS, so only the
    phases' seconds (not reported here) depend on it."""
    env = env or dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        OMP_NUM_THREADS=str(args.threads),
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    )
    procs: dict[str, subprocess.Popen] = {}
    rows = []
    pending = list(PHASES)
    while pending or procs:
        while pending and len(procs) < max(1, jobs):
            phase = pending.pop(0)
            procs[phase] = subprocess.Popen(
                _child_cmd(args, "ours", phase),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        phase = next(iter(procs))  # finish in start order: the rows keep PHASES' order
        proc = procs.pop(phase)
        out, err = proc.communicate()
        if proc.returncode != 0:
            for other in procs.values():
                other.kill()
            print(err[-3000:], file=sys.stderr)
            raise SystemExit(f"ours {phase} failed (exit {proc.returncode})")
        measured = json.loads(out.strip().splitlines()[-1])["peak_bytes"]
        rows.append({"phase": phase, "measured": measured, "predicted": predicted_bytes(args, phase)})
    return rows


def predict_main(args) -> int:
    sizes = parse_sizes(args.sizes)
    mib = 2**20
    print(
        f"bench_memory --predict: luffy_pool.memory_plan vs measured peak RSS above resident (ours, chunk {args.chunk}, "
        f"checkpointing {args.checkpointing})"
    )
    print(
        f"{'rows':>4} {'width':>5} {'tokens':>6} {'layers':>6}  {'phase':8} {'predicted MiB':>13} {'measured MiB':>12} "
        f"{'pred/meas':>9}"
    )
    worst = 0.0
    for rows, width, tokens, layers in sizes:
        sized = argparse.Namespace(**{**vars(args), "rows": rows, "width": width, "tokens": tokens, "layers": layers})
        for r in measure_vs_predict(sized, jobs=args.jobs):
            ratio = r["predicted"] / r["measured"]
            worst = max(worst, abs(ratio - 1))
            print(
                f"{rows:>4} {width:>5} {tokens:>6} {layers:>6}  {r['phase']:8} {r['predicted'] / mib:13.0f} "
                f"{r['measured'] / mib:12.0f} {ratio:9.2f}",
                flush=True,
            )
    print(f"max |predicted/measured - 1| = {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
