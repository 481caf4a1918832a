"""algorithm.method=prefix_rft without Ray: the step's cosine prefix share on the group's n_prefix slots."""

from types import SimpleNamespace

import pytest

from luffy_pool.methods.prefix_rft import PrefixRftKnobs, PrefixRftSampler


def _sampler(n_prefix=1, decay_steps=None, total_steps=4):
    knobs = PrefixRftKnobs(ratio_start=0.95, ratio_end=0.05, decay_steps=decay_steps, prefix_entropy_top_frac=0.2)
    sections = SimpleNamespace(knobs=knobs, workers=SimpleNamespace(rollout=SimpleNamespace(n=4, n_prefix=n_prefix)))
    return PrefixRftSampler.from_sections(sections, seed=0, total_steps=total_steps)


def test_the_prefix_slots_carry_the_steps_share_and_the_others_none():
    sampler = _sampler()  # decay over the run's 4 steps: step 1 -> 0.95, 3 -> 0.5, 5 -> 0.05
    ratios, metrics = sampler.draw_batch([0, 1], global_step=1)
    assert ratios.tolist() == [[0.95, 0, 0, 0]] * 2 and metrics == {"prefix_rft/prefix_ratio": 0.95}
    plan, _ = sampler.plan_slots([0, 1], None, None, 3)  # the hook's slot plan is the step's draw
    assert plan.tolist() == sampler.draw_batch([0, 1], global_step=3)[0].tolist()
    assert sampler.draw_batch([0], global_step=3)[0][0, 0] == pytest.approx(0.5)
    assert sampler.draw_batch([0], global_step=5)[0][0, 0] == pytest.approx(0.05)
    assert _sampler(n_prefix=-1).draw_batch([0], global_step=1)[0].tolist() == [[0.95] * 4]
    assert _sampler(decay_steps=100, total_steps=4).draw_batch([0], global_step=51)[0][0, 0] == pytest.approx(0.5)


def test_state_is_the_step_only_and_another_samplers_state_is_refused():
    sampler = _sampler()
    sampler.load_state_dict(sampler.state_dict())
    with pytest.raises(ValueError, match="not algorithm.method=prefix_rft's"):
        sampler.load_state_dict({"seed": 0, "bit_generator_state": {}})
