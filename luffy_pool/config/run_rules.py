"""The rules between the run config's groups that need the model, the world or the pipeline: the trainer's
``rollout_pipeline`` against the placement, the context length against the model's positions, and the token budgets,
batch sizes, shards and TP against the world size. ``ConfigSections.validate`` (luffy_pool/config/sections.py)
calls them; each returns one line per problem, naming the keys."""

from __future__ import annotations

_A, _R, _REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


def pipeline_errors(sections) -> list[str]:
    """``trainer.rollout_pipeline`` against the placement: one_step_off overlaps generation with training, which
    needs the engines on ranks of their own; the split engines each take a whole share of the prompts."""
    errors, w = [], sections.workers
    if sections.trainer.rollout_pipeline == "one_step_off" and w.hybrid_engine:
        errors.append(
            "'trainer.rollout_pipeline'=one_step_off needs 'actor_rollout_ref.hybrid_engine'=False (the "
            f"rollout engines on their own '{_R}.n_gpus_per_node' ranks, generating while the actor trains)"
        )
    if sections.trainer.rollout_pipeline == "one_step_off":
        from luffy_pool.methods import get_method

        method = get_method(sections.algorithm.method)
        if method.stateful:  # its state assumes a batch drawn after the last update
            errors.append(
                f"'algorithm.method'={method.name} keeps state between its steps (experience pool or SFT "
                "buffer) that the next batch is drawn from, so it needs 'trainer.rollout_pipeline'=sync "
                "(one_step_off draws batch N+1 before update N)"
            )
    ranks = w.rollout_world_size
    if ranks and sections.data.train_batch_size % ranks:
        errors.append(
            f"'data.train_batch_size'={sections.data.train_batch_size} must split evenly over the {ranks} "
            f"rollout ranks ('{_R}.nnodes' * '{_R}.n_gpus_per_node')"
        )
    return errors


def context_errors(sections) -> list[str]:
    """Prompt + response within the model's positions, when its config.json is on disk (else the launcher's
    pre-flight checks it once the model is resolved)."""
    from verl.utils.context_length import context_length_error
    from verl.utils.parallel_check import local_model_config

    model = sections.workers.model
    hf = local_model_config(model.path, model.override_config)
    limit = None if hf is None else hf.get("max_position_embeddings")
    problem = context_length_error(
        sections.data.max_prompt_length,
        sections.data.max_response_length,
        None if limit is None else int(limit),
        model.path,
    )
    return [problem] if problem else []


def layout_errors(sections) -> list[str]:
    """Token budgets hold one sequence; the actor's TP, batch sizes, HSDP shards and vLLM TP split over the world's
    ranks."""
    from verl.utils.batch_sizes import (
        BatchSizeError,
        normalize_actor_batch_sizes,
        optimizer_steps_per_training_step,
        rows_per_rank,
    )

    errors, w, a, n = [], sections.workers, sections.actor, sections.workers.rollout.n
    world, sp = sections.trainer.nnodes * sections.trainer.n_gpus_per_node, a.ulysses_sequence_parallel_size
    longest = sections.data.max_prompt_length + sections.data.max_response_length
    log_prob = ("log_prob_max_token_len_per_gpu", "log_prob_use_dynamic_bsz")
    budgets = ((_A, a, ("ppo_max_token_len_per_gpu", "use_dynamic_bsz"), True), (_R, w.rollout, log_prob, True))
    for group, section, (budget_key, switch), enabled in budgets + ((_REF, w.ref, log_prob, w.ref.use_ref),):
        # A micro-batch holds at least one whole sequence; an SP rank holds 1/sp of it (dp_actor).
        budget, dynamic = getattr(section, budget_key), enabled and getattr(section, switch)
        if dynamic and budget * sp < longest:
            errors.append(
                f"'{group}.{budget_key}'={budget} is below one sequence: data.max_prompt_length + "
                f"data.max_response_length = {longest} tokens{f' (/ Ulysses SP {sp})' if sp > 1 else ''}; "
                f"raise it or set {group}.{switch}=False"
            )
    fsdp_size = a.fsdp_config.fsdp_size
    if fsdp_size > 0 and world % fsdp_size:
        errors.append(
            f"'{_A}.fsdp_config.fsdp_size'={fsdp_size} must divide the world size {world} (trainer.nnodes"
            " * trainer.n_gpus_per_node), or be -1 to shard over all ranks"
        )
    sizes = {k: getattr(a, k) for k in ("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu")}
    actor_tp = a.tensor_model_parallel_size
    if world % actor_tp:
        return errors + [
            f"'{_A}.tensor_model_parallel_size'={actor_tp} must divide the world size {world} (trainer.nnodes * "
            "trainer.n_gpus_per_node)"
        ]
    pp = a.pipeline_model_parallel_size  # verl/utils/pipeline_parallel.py
    if pp > 1 and world % (pp * actor_tp):
        return errors + [
            f"'{_A}.pipeline_model_parallel_size'={pp} x '{_A}.tensor_model_parallel_size'={actor_tp} must divide "
            f"the world size {world} (trainer.nnodes * trainer.n_gpus_per_node)"
        ]
    sp *= actor_tp * pp  # the ranks of an SP, TP or PP group train on the same rows: dp = world / (sp x tp x pp)
    try:
        rows_per_rank(sections.data.train_batch_size, n, world)
        per_rank = normalize_actor_batch_sizes(sizes, n, world, sp)
        optimizer_steps_per_training_step(
            sections.data.train_batch_size, n, world, per_rank["ppo_mini_batch_size_per_rank"], a.ppo_epochs, sp
        )
    except BatchSizeError as exc:
        errors.append(str(exc))
    for group, section, enabled in ((_R, w.rollout, True), (_REF, w.ref, w.ref.use_ref)):
        micro = section.log_prob_micro_batch_size
        if enabled and sp >= 1 and not section.log_prob_use_dynamic_bsz and (micro is None or micro < world // sp):
            errors.append(
                f"'{group}.log_prob_micro_batch_size'={micro} must be >= the {world // sp} "
                "data-parallel ranks (or enable log_prob_use_dynamic_bsz)"
            )
    if w.rollout.name == "vllm" and world % w.rollout.tensor_model_parallel_size:
        errors.append(
            f"'{_R}.tensor_model_parallel_size'={w.rollout.tensor_model_parallel_size} must divide the "
            f"world size {world} (trainer.nnodes * trainer.n_gpus_per_node)"
        )
    tp = w.rollout.tensor_model_parallel_size
    if w.rollout.name == "vllm" and tp > 1:  # a local model's heads against vLLM's TP split
        from verl.utils.parallel_check import local_model_heads, tp_heads_error

        heads = local_model_heads(w.model.path, w.model.override_config)
        problem = tp_heads_error(*heads, tp) if heads is not None else None
        if problem:
            errors.append(f"{problem} (from {w.model.path}/config.json)")
    return errors
