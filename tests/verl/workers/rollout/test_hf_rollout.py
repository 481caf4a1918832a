"""HF fallback rollout: sampling maths, per-row caps, EOS, log-probs, seeding and weight pushes."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl.workers.rollout.base import SamplingSpec
from verl.workers.rollout.config import engine_config
from verl.workers.rollout.hf_rollout import HFRollout, filter_logits
from tests.helpers.sections import engine_section

GREEDY = SamplingSpec(temperature=0.0, return_logprobs=True)


def test_filter_logits_hand_computed():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    # softmax = [.6439, .2369, .0871, .0321]; mass ranked above token 2 is .8808 >= .7 -> drop 2 and 3
    kept = torch.log_softmax(filter_logits(logits, 1.0, -1, 0.7), -1)[0]
    assert kept[:2].tolist() == pytest.approx([math.log(0.7310586), math.log(0.2689414)], abs=1e-6)
    assert torch.isinf(kept[2:]).all()
    # top_p 0.6 < p(token 0): only the top token survives
    assert torch.isinf(filter_logits(logits, 1.0, -1, 0.6)[0, 1:]).all()
    # T=2 then top-2: log_softmax([1, .5]) = [-.474077, -.974077]
    k2 = torch.log_softmax(filter_logits(logits, 2.0, 2, 1.0), -1)[0]
    assert k2[:2].tolist() == pytest.approx([-0.474077, -0.974077], abs=1e-6)
    assert torch.isinf(k2[2:]).all()


def test_greedy_matches_hf_generate_with_per_row_caps_and_skipped_rows(tiny_model_dir, check_capped_greedy):
    check_capped_greedy(HFRollout(tiny_model_dir, engine_section(hf_micro_batch_size=2)))


def test_micro_batching_and_row_dropping_do_not_change_greedy_output(tiny_model_dir, prompts):
    rollout = HFRollout(tiny_model_dir, engine_section(hf_micro_batch_size=1))
    caps = [7, 2, 9, 4, 5, 3]
    one_by_one = rollout.generate_token_ids(prompts, caps, GREEDY)
    rollout.config = engine_config(engine_section(hf_micro_batch_size=8))
    batched = rollout.generate_token_ids(prompts, caps, GREEDY)
    assert batched.token_ids == one_by_one.token_ids
    assert all(
        torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-5)
        for a, b in zip(batched.logprobs, one_by_one.logprobs)
    )


def test_generation_stops_at_and_includes_eos_unless_ignored(tiny_model_dir, reference, prompts, hf_greedy):
    rollout = HFRollout(tiny_model_dir, engine_section())
    full = hf_greedy(reference, prompts[0], 8)
    stop = full[2]
    rollout.eos_ids = {stop}
    out = rollout.generate_token_ids(prompts[:1], [8], GREEDY)
    assert out.token_ids[0] == full[: full.index(stop) + 1]
    ignored = rollout.generate_token_ids(prompts[:1], [8], SamplingSpec(temperature=0.0, ignore_eos=True))
    assert ignored.token_ids[0] == full and ignored.logprobs is None


def test_sampled_logprobs_are_temperature_scaled_logprobs_of_the_model(tiny_model_dir, reference, prompts, hf_logprobs):
    rollout = HFRollout(tiny_model_dir, engine_section())
    spec = SamplingSpec(temperature=0.7, seed=5, return_logprobs=True, ignore_eos=True)
    out = rollout.generate_token_ids(prompts[:3], [12, 12, 12], spec)
    for prompt, ids, lps in zip(prompts, out.token_ids, out.logprobs):
        assert torch.allclose(torch.as_tensor(lps), hf_logprobs(reference, prompt, ids, 0.7), atol=1e-5)


def test_seeded_sampling_is_reproducible_and_the_seed_matters(tiny_model_dir, prompts):
    rollout = HFRollout(tiny_model_dir, engine_section())
    spec = SamplingSpec(temperature=1.0, seed=11, ignore_eos=True)
    first = rollout.generate_token_ids(prompts, [20] * len(prompts), spec)
    again = rollout.generate_token_ids(prompts, [20] * len(prompts), spec)
    other = rollout.generate_token_ids(
        prompts, [20] * len(prompts), SamplingSpec(temperature=1.0, seed=12, ignore_eos=True)
    )
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids


def test_pushed_weights_drive_generation(tiny_model_dir, prompts, hf_greedy):
    rollout = HFRollout(tiny_model_dir, engine_section())
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    items = list(trained.state_dict().items())
    for start in range(0, len(items), 5):  # several buckets
        rollout.update_weights(items[start : start + 5])
    rollout.after_weight_update()
    out = rollout.generate_token_ids(prompts, [6] * len(prompts), SamplingSpec(temperature=0.0, ignore_eos=True))
    assert out.token_ids == [hf_greedy(trained, p, 6) for p in prompts]
    assert rollout.weights_version == 1


def test_bad_pushes_fail_with_the_tensor_name(tiny_model_dir):
    rollout = HFRollout(tiny_model_dir, engine_section())
    with pytest.raises(KeyError, match="model.nope.weight"):
        rollout.update_weights([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="model.norm.weight"):
        rollout.update_weights([("model.norm.weight", torch.zeros(3))])
    rollout.update_weights([("model.norm.weight", torch.ones(rollout.model.config.hidden_size))])
    with pytest.raises(RuntimeError, match="weight sync incomplete"):
        rollout.after_weight_update()


def test_tied_embeddings_are_covered_by_pushing_either_name():
    cfg = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    rollout = HFRollout("unused", engine_section(), model=Qwen2ForCausalLM(cfg))
    source = Qwen2ForCausalLM(cfg)
    pushed = [(k, v) for k, v in source.state_dict().items() if k != "lm_head.weight"]
    rollout.update_weights(pushed)
    rollout.after_weight_update()
    assert torch.equal(rollout.model.lm_head.weight, source.model.embed_tokens.weight)


def test_do_sample_false_makes_the_hf_engine_greedy(tiny_model_dir, reference, prompts, hf_greedy, compose_config):
    from verl.workers.config_sections import RolloutSection
    from verl.workers.rollout.base import sampling_from_config

    def rcfg(do_sample, calculate_log_probs=False):  # the worker's typed rollout section, from the composed config
        cfg = compose_config(
            [
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.rollout.ignore_eos=True",
                f"actor_rollout_ref.rollout.do_sample={do_sample}",
                f"actor_rollout_ref.rollout.calculate_log_probs={calculate_log_probs}",
            ]
        )
        return RolloutSection.from_rollout_config(cfg.actor_rollout_ref.rollout)

    rollout = HFRollout(tiny_model_dir, engine_section(hf_micro_batch_size=8))
    caps = [8] * len(prompts)

    def run(cfg, seed):
        spec, _ = sampling_from_config(cfg)
        spec.seed = seed
        return rollout.generate_token_ids(prompts, caps, spec).token_ids

    sampled = [run(rcfg(True), seed) for seed in (1, 2)]
    assert sampled[0] != sampled[1]  # sampling: the seed changes the draw
    greedy = [run(rcfg(False), seed) for seed in (1, 2)]
    assert greedy[0] == greedy[1] == [hf_greedy(reference, p, 8) for p in prompts]
    assert sampling_from_config(rcfg(False))[1] == 0.0  # validation greedy too
    assert sampling_from_config(rcfg(True))[1] == 0.6
    # calculate_log_probs asks the engine for the sampled tokens' log-probs (rollout correction reads them)
    assert sampling_from_config(rcfg(True))[0].return_logprobs is False
    spec, _ = sampling_from_config(rcfg(True, calculate_log_probs=True))
    spec.seed = 1
    assert spec.return_logprobs is True
    out = rollout.generate_token_ids(prompts, caps, spec)
    assert out.token_ids == sampled[0] and [len(lp) for lp in out.logprobs] == [len(t) for t in out.token_ids]
