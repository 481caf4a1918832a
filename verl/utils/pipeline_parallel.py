"""Pipeline parallelism (``torch.distributed.pipelining``) of the actor and reference: stage split, mesh, schedules.

``actor_rollout_ref.actor.pipeline_model_parallel_size`` = pp splits the decoder's layers into pp (interleaved
schedule: 2 x pp) stages of equal layer counts, torchtitan style (``pytorch/torchtitan@b5bcd76``,
``torchtitan/distributed/pipeline_parallel.py`` ``_pipeline_module_split``): no tracing, each rank keeps the one HF
causal LM it was built as, pruned to the layers of its stages (``model.model.layers`` becomes a ``ModuleDict`` keyed
by the ORIGINAL layer index, so every parameter keeps its original FQN: DCP checkpoints reshard between layouts and the
shard loader reads the HF names), the embedding on the first stage, the final norm and LM head on the last, the
rotary embedding (no parameters) everywhere. A stage is a thin module over that model's parts
(``PipelineStageModule``): hidden states and the int side inputs (padding mask, position ids, response tokens, the
index of each response token's predicting state) travel between stages; each stage rebuilds the causal mask and RoPE
locally; the last scores the response tokens (per-token log-prob and entropy at the sampling temperature). Rows run
padded, or packed with ``use_remove_padding`` where the attention has varlen kernels (verl/utils/pipeline_packing.py).

The mesh is one ``(pp, dp, tp)`` ``init_device_mesh`` (``build_pp_mesh``): TP over ``tp`` (consecutive ranks,
verl/utils/tensor_parallel.py), FSDP2 over ``dp`` per stage (each stage module is an FSDP root with its layers as
units), stages over ``pp``. The ranks of one dp index (all its pp x tp ranks) hold the same rows (``row_group``).

Schedules (``actor_rollout_ref.actor.pipeline_schedule``): ``gpipe``, ``1f1b`` (default) and ``interleaved_1f1b``
(2 stages per rank, loop placement: rank r holds stages r and r + pp). torch's pipelining runs a metadata pass on
``torch.empty`` inputs, so the stage clamps its index inputs (a no-op on real ones).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

PP_KEY = "actor_rollout_ref.actor.pipeline_model_parallel_size"
SCHEDULE_KEY = "actor_rollout_ref.actor.pipeline_schedule"
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def stages_per_rank(schedule: str) -> int:
    return 2 if schedule == "interleaved_1f1b" else 1


def pp_layout_errors(
    pp: int,
    schedule: str,
    world: int,
    tp: int = 1,
    sp: int = 1,
    num_layers: Optional[int] = None,
    tied: Optional[bool] = None,
) -> list[str]:
    """One line per layout pipeline parallel does not support (pp 1: none). ``num_layers``/``tied`` come from the
    model's config (None: not known yet)."""
    if pp <= 1:
        return []
    errors = []
    if world % (pp * tp):
        errors.append(
            f"'{PP_KEY}'={pp} x 'actor_rollout_ref.actor.tensor_model_parallel_size'={tp} must divide the world "
            f"size {world}"
        )
    if sp > 1:
        errors.append(
            f"'{PP_KEY}'={pp} with 'actor_rollout_ref.actor.ulysses_sequence_parallel_size'={sp}: pipeline parallel "
            "x Ulysses SP is not supported; set one of them to 1"
        )
    n_stages = pp * stages_per_rank(schedule)
    if num_layers is not None and num_layers % n_stages:
        errors.append(
            f"'{PP_KEY}'={pp} with '{SCHEDULE_KEY}'={schedule}: {n_stages} stages must divide the model's "
            f"num_hidden_layers={num_layers}"
        )
    if tied:
        errors.append(
            f"'{PP_KEY}'={pp}: the model ties its LM head to the input embeddings (tie_word_embeddings), which "
            "would sit on the first and the last stage; not supported with pipeline parallel"
        )
    return errors


def check_model(model: nn.Module, pp: int, schedule: str) -> None:
    """``pp_layout_errors`` of a built model's config, as a ValueError."""
    cfg = model.config
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    errors = pp_layout_errors(pp, schedule, pp, num_layers=cfg.num_hidden_layers, tied=tied)
    if errors:
        raise ValueError("; ".join(errors))


def stage_layers(num_layers: int, n_stages: int, stage: int) -> range:
    """The original indices of the decoder layers of ``stage`` (equal contiguous slices)."""
    per = num_layers // n_stages
    return range(stage * per, (stage + 1) * per)


def rank_stages(pp_rank: int, pp: int, schedule: str) -> list[int]:
    """Stage indices a pp rank holds: its own, and with the interleaved schedule also ``pp_rank + pp`` (torch's
    loop placement)."""
    return [pp_rank + k * pp for k in range(stages_per_rank(schedule))]


def build_pp_mesh(device: str, world_size: int, pp: int, tp: int):
    """The ``(pp, dp, tp)`` mesh (tp innermost: consecutive ranks, as ``build_tp_mesh``) and the row group: the
    ranks of one dp index (pp x tp of them) hold the same rows."""
    from torch.distributed.device_mesh import init_device_mesh

    if pp < 1 or tp < 1 or world_size % (pp * tp):
        raise ValueError(pp_layout_errors(pp, "1f1b", world_size, tp)[0])
    dp = world_size // (pp * tp)
    mesh = init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    row_group = None
    rank = dist.get_rank()
    for d in range(dp):  # every rank creates every group, in the same order
        ranks = [p * dp * tp + d * tp + t for p in range(pp) for t in range(tp)]
        group = dist.new_group(ranks)
        if rank in ranks:
            row_group = group
    return mesh, row_group


def prune_to_stages(model: nn.Module, stages: list[int], n_stages: int) -> nn.Module:
    """Keep in ``model`` (meta or materialised HF causal LM) only what ``stages`` need; original FQNs stay."""
    base = model.get_decoder()
    n = model.config.num_hidden_layers
    keep = sorted(i for s in stages for i in stage_layers(n, n_stages, s))
    base.layers = nn.ModuleDict({str(i): base.layers[i] for i in keep})
    if 0 not in stages:
        base.embed_tokens = None
    if n_stages - 1 not in stages:
        base.norm = None
        model.lm_head = None
    return model


class PipelineStageModule(nn.Module):
    """One stage's forward over parts of the (pruned) causal LM: ``(x, attention_mask, position_ids, responses,
    score_index)`` -> the same with x the hidden states, or on the last stage ``(log_probs, entropy)`` of the
    responses. ``packed``: x is one packed row per micro-batch and the attention mask a placeholder."""

    def __init__(self, model: nn.Module, stage: int, n_stages: int):
        super().__init__()
        base = model.get_decoder()
        self.config = model.config
        self._no_split_modules = getattr(model, "_no_split_modules", None)
        ids = stage_layers(self.config.num_hidden_layers, n_stages, stage)
        self.layers = nn.ModuleDict({str(i): base.layers[str(i)] for i in ids})
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        self.embed_tokens = base.embed_tokens if self.is_first else None
        self.norm = base.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.rotary_emb = base.rotary_emb
        self.temperature = 1.0
        self.packed = False  # set per pass by PipelineModel (pipeline_packing.py)
        self.chunk_size = 0  # > 0: score the responses this many tokens at a time (no [rows, R, V] logits)
        from verl.utils.sequence_parallel_norms import sequence_parallel_of

        # sequence-parallel norms: hidden states travel as the tp rank's slice of the sequence
        self.sequence_parallel = sequence_parallel_of(model)
        types = getattr(self.config, "layer_types", None)
        self.layer_types = {str(i): (types[i] if types else "full_attention") for i in ids}

    def _masks(self, hidden, attention_mask, position_ids) -> dict:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        if hidden.size(1) != position_ids.size(1):  # a sequence-parallel slice: the mask spans the whole sequence
            hidden = hidden.new_empty(hidden.size(0), position_ids.size(1), 1)
        kwargs = dict(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            past_key_values=None,
            position_ids=position_ids,
        )
        makers = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
        return {t: makers[t](**kwargs) for t in set(self.layer_types.values())}

    def forward(self, x, attention_mask, position_ids, responses, score_index):
        from verl.utils.torch_functional import logprobs_and_entropy_from_logits

        cfg = self.config
        # the metadata pass feeds torch.empty: keep indices in range (real inputs are unchanged)
        attention_mask = attention_mask.clamp(0, 1)
        position_ids = position_ids.clamp(0, cfg.max_position_embeddings - 1)
        responses = responses.clamp(0, cfg.vocab_size - 1)
        hidden = self.embed_tokens(x.clamp(0, cfg.vocab_size - 1)) if self.is_first else x
        score_index = score_index.clamp(0, hidden.size(0) * position_ids.size(1) - 1)
        masks = self._masks(hidden, None if self.packed else attention_mask, position_ids)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for key, layer in self.layers.items():
            hidden = layer(
                hidden,
                attention_mask=masks[self.layer_types[key]],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                past_key_values=None,
                use_cache=False,
            )
        if not self.is_last:
            return hidden, attention_mask, position_ids, responses, score_index
        if self.sequence_parallel is not None:
            hidden = self.sequence_parallel.gather(hidden, position_ids.size(1))
        # the states that predict the response tokens, [rows, R, hidden]
        hidden = self.norm(hidden.reshape(-1, hidden.size(-1))[score_index])
        if self.chunk_size > 0:
            return self._chunked_scores(hidden, responses)
        logits = self.lm_head(hidden).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        log_probs, entropy = logprobs_and_entropy_from_logits(logits, responses)
        return log_probs, entropy

    def _chunked_scores(self, hidden, responses):
        """(log-probs, entropy) through the actor's token-chunked head (verl/utils/chunked_logprobs.py; under TP
        the vocab-parallel one, verl/utils/vocab_parallel.py): logits of ``chunk_size`` tokens at a time."""
        from verl.utils.chunked_logprobs import chunked_logprobs_entropy
        from verl.utils.tensor_parallel import vocab_shard
        from verl.utils.vocab_parallel import vocab_parallel_logprobs_entropy

        rows, width = responses.shape
        flat, labels = hidden.reshape(rows * width, -1), responses.reshape(-1)
        kw = dict(temperature=self.temperature, chunk_size=self.chunk_size, with_entropy=True)
        head = self.lm_head
        split = vocab_shard(head.weight)
        if split is None:
            log_probs, entropy = chunked_logprobs_entropy(flat, head.weight, labels, bias=head.bias, **kw)
        else:
            weight, vocab_start, group = split
            bias = head.bias.to_local() if head.bias is not None else None
            log_probs, entropy = vocab_parallel_logprobs_entropy(
                flat, weight, labels, vocab_start=vocab_start, group=group, bias=bias, **kw
            )
        return log_probs.float().view(rows, width), entropy.float().view(rows, width)


def _build_schedule(name: str, stages: list, n_microbatches: int, loss_fn):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn, scale_grads=False)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)


class PipelineModel:
    """The stages of one rank over its pruned causal LM (``module``, what the optimizer, checkpoints and the weight
    push see) and the two passes the actor runs: ``forward`` (no grad, per-token outputs on every pp rank) and
    ``backward`` (gradients of a linear loss in the per-token outputs)."""

    def __init__(self, module: nn.Module, stage_modules: list, pp_group, schedule: str, device, chunk_size: int = 0):
        from torch.distributed.pipelining import PipelineStage

        self.module, self.stage_modules, self.pp_group, self.schedule = module, stage_modules, pp_group, schedule
        for m in stage_modules:
            m.chunk_size = int(chunk_size)
        self.pp = dist.get_world_size(pp_group)
        self.n_stages = self.pp * stages_per_rank(schedule)
        self.pp_rank = dist.get_rank(pp_group)
        self.device = torch.device(device)
        self.stages = [
            PipelineStage(m, idx, self.n_stages, self.device, group=pp_group)
            for idx, m in zip(rank_stages(self.pp_rank, self.pp, schedule), stage_modules)
        ]
        self.is_last = any(s.is_last for s in self.stages)
        # the last stage sits on pp rank pp - 1 in both placements
        self.last_rank = dist.get_global_rank(pp_group, self.pp - 1)

    def n_chunks(self, rows: int, rows_per_chunk: int) -> int:
        """Pipeline micro-batches of ``rows``: at least pp (the 1F1B schedules need as many), a multiple of pp."""
        n = max(-(-rows // max(1, rows_per_chunk)), self.pp)
        return -(-n // self.pp) * self.pp

    def _inputs(self, batch: dict, n_chunks: int, temperature: float, packed: bool):
        """(first-stage args in n_chunks equal chunks, padded row count); ``packed``: remove padding."""
        from verl.utils.pipeline_packing import pack_stage_inputs, pad_stage_inputs

        for m in self.stage_modules:
            m.temperature, m.packed = float(temperature), bool(packed)
        rows = batch["input_ids"].size(0)
        padded = -(-rows // n_chunks) * n_chunks
        tensors = {}
        for k in ("input_ids", "attention_mask", "position_ids", "responses"):
            t = batch[k].to(self.device)
            if padded > rows:  # copies of the last row; their outputs are dropped, their loss weight is 0
                t = torch.cat([t, t[-1:].expand(padded - rows, *t.shape[1:])])
            tensors[k] = t
        return (pack_stage_inputs if packed else pad_stage_inputs)(tensors, n_chunks), padded

    def forward(self, batch: dict, n_chunks: int, temperature: float, packed: bool = False):
        """``(log_probs, entropy)`` ``[rows, R]`` (fp32, on the device) of ``batch`` on every pp rank: the pipeline's
        forward-only schedule, then a broadcast from the last stage."""
        args, padded = self._inputs(batch, n_chunks, temperature, packed)
        rows, width = batch["input_ids"].size(0), batch["responses"].size(-1)
        sched = _build_schedule(self.schedule, self.stages, n_chunks, None)
        with torch.no_grad():
            out = sched.eval(*args) if self.stages[0].is_first else sched.eval()
        if self.is_last:
            lp, ent = (t.float().contiguous() for t in out)
        else:
            lp = torch.empty(padded, width, dtype=torch.float32, device=self.device)
            ent = torch.empty_like(lp)
        packed = torch.stack([lp, ent])
        dist.broadcast(packed, src=self.last_rank, group=self.pp_group)
        return packed[0, :rows], packed[1, :rows]

    def backward(self, batch: dict, n_chunks: int, temperature: float, grad_lp, grad_ent, packed: bool = False) -> None:
        """Accumulate into the stages' parameters the gradient of ``sum(grad_lp * log_probs + grad_ent * entropy)``
        (``grad_*`` ``[rows, R]``: the loss's gradients with respect to the per-token outputs): one training step of
        the schedule, each micro-batch's rows found through the row index passed as its target."""
        args, padded = self._inputs(batch, n_chunks, temperature, packed)
        rows = batch["input_ids"].size(0)
        pad = padded - rows
        g_lp = torch.cat([grad_lp, grad_lp.new_zeros(pad, grad_lp.size(1))]).to(self.device)
        g_ent = torch.cat([grad_ent, grad_ent.new_zeros(pad, grad_ent.size(1))]).to(self.device)

        def loss_fn(output, target):
            lp, ent = output
            idx = target.clamp(0, padded - 1)  # the metadata pass's dummy call may pass anything
            return (g_lp[idx] * lp.float()).sum() + (g_ent[idx] * ent.float()).sum()

        sched = _build_schedule(self.schedule, self.stages, n_chunks, loss_fn)
        target = torch.arange(padded, device=self.device)
        if self.stages[0].is_first:
            sched.step(*args, target=target, return_outputs=False)
        else:
            sched.step(target=target, return_outputs=False)


def build_pipeline_model(
    model: nn.Module,
    pp_mesh,
    schedule: str,
    device: str,
    shard_fn=None,
    tp_mesh=None,
    chunk_size: int = 0,
    sequence_parallel: bool = False,
) -> PipelineModel:
    """Split ``model`` (an HF causal LM on the meta device) for this rank's pp index: prune, TP over ``tp_mesh``,
    ``shard_fn(stage_module)`` (FSDP2 over dp) per stage; returns the (still meta) pipeline model. ``chunk_size``:
    the last stage's scoring chunk (``model.logprob_chunk_size``; 0: full logits of the responses, under TP with
    the head's weight gathered; > 0 under TP: vocab-parallel). ``sequence_parallel``: the norms and the hidden
    states between stages split by sequence over tp (verl/utils/sequence_parallel_norms.py)."""
    pp = pp_mesh.size()
    check_model(model, pp, schedule)
    n_stages = pp * stages_per_rank(schedule)
    stages = rank_stages(pp_mesh.get_local_rank(), pp, schedule)
    model = prune_to_stages(model, stages, n_stages)
    if tp_mesh is not None and tp_mesh.size() > 1:
        from verl.utils.tensor_parallel import apply_tensor_parallel

        # the last stage gathers the sequence before its norm, which runs on the scored positions only
        model = apply_tensor_parallel(model, tp_mesh, sequence_parallel, gather_final_norm=False)
    modules = [PipelineStageModule(model, s, n_stages) for s in stages]
    if shard_fn is not None:
        modules = [shard_fn(m) for m in modules]
    return PipelineModel(model, modules, pp_mesh.get_group(), schedule, device, chunk_size)


def materialize_pipeline(pipe: PipelineModel, model_dir: str, device: str) -> PipelineModel:
    """Allocate each stage's (sharded) parameters on ``device`` and read the local shards from ``model_dir`` by the
    original names (``verl.utils.meta_init``)."""
    from verl.utils.meta_init import checkpoint_entries, load_local_shards

    buffers = {n: b.clone() for n, b in pipe.module.named_buffers()}
    for m in pipe.stage_modules:  # each stage module is the FSDP root of its parameters
        m.to_empty(device=device)
    with torch.no_grad():
        for name, buf in pipe.module.named_buffers():
            buf.copy_(buffers[name].to(buf.device))
    load_local_shards(pipe.module, model_dir, checkpoint_entries(model_dir))
    pipe.module.eval()
    return pipe


_PIPELINE_ATTR = "_pipeline_model"


def attach_pipeline(module: nn.Module, pipe: PipelineModel) -> nn.Module:
    """Record ``pipe`` on its pruned model (the worker passes the model around; ``pipeline_of`` finds the stages)."""
    setattr(module, _PIPELINE_ATTR, pipe)
    return module


def pipeline_of(module: Optional[nn.Module]) -> Optional[PipelineModel]:
    """The ``PipelineModel`` over ``module`` (None: not pipeline-parallel)."""
    return getattr(module, _PIPELINE_ATTR, None)


def section_errors(workers) -> list[str]:
    """Pre-flight lines of the ``actor_rollout_ref`` sections (``WorkerSections.validate``): Ulysses SP, and from a
    local model's config.json the layer count and tied embeddings; the world size is checked with the placement
    (luffy_pool/config/run_rules.py)."""
    from verl.utils.parallel_check import local_model_config

    a = workers.actor
    pp, tp = a.pipeline_model_parallel_size, a.tensor_model_parallel_size
    if pp <= 1:
        return []
    cfg = local_model_config(workers.model.path, workers.model.override_config) or {}
    layers, tied = cfg.get("num_hidden_layers"), cfg.get("tie_word_embeddings")
    errors = pp_layout_errors(pp, a.pipeline_schedule, pp * tp, tp, a.ulysses_sequence_parallel_size, layers, tied)
    if any(cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        errors.append(
            f"'{PP_KEY}'={pp} with a mixture-of-experts model ({workers.model.path}): the router's auxiliary loss "
            "and the per-expert weight push do not run through pipeline stages; use pipeline_model_parallel_size=1"
        )
    if a.fsdp_config.fsdp_size != -1:
        errors.append(
            f"'{PP_KEY}'={pp} with 'actor_rollout_ref.actor.fsdp_config.fsdp_size'={a.fsdp_config.fsdp_size}: each "
            "stage shards over every dp rank (HSDP is not combined with it); keep fsdp_size=-1"
        )
    return errors
