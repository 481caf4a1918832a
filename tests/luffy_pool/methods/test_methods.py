"""The method selector and the compositions of hpt / srft / chord / grpo, without Ray: which keys a method sets
and refuses, HPT's gate on the group's success count, and that the knobs, masks and step reach the family loss."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

A = "actor_rollout_ref.actor"


@pytest.fixture
def tiny_config(compose_config, luffy_overrides, tmp_path):
    def make(*extra):
        return compose_config(luffy_overrides("m", "d", str(tmp_path), steps=2) + list(extra))

    return make


def test_method_values_come_from_the_registry_and_an_unknown_one_is_refused_with_the_list():
    from luffy_pool.methods import get_method, method_names

    assert set(method_names()) == {
        "ampo",
        "luffy",
        "grpo",
        "hpt",
        "srft",
        "chord",
        "prefix_rft",
        "uft",
        "relift",
        "exgrpo",
        "rl_plus",
        "questa",
        "sdpo",
        "sdft",
    }
    with pytest.raises(
        ValueError, match=r"algorithm.method='bread' is not implemented; valid: \['ampo', 'chord', 'exgrpo', "
    ):
        get_method("bread")


def test_config_check_refuses_an_unknown_method(compose_config):
    from luffy_pool.config.check import validate_config

    errors = validate_config(
        compose_config(
            ["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m", "algorithm.method=bread"]
        )
    )
    assert any("algorithm.method" in e and "bread" in e for e in errors), errors


def test_luffy_changes_nothing(tiny_config):
    from luffy_pool.config.method_group import apply_method

    config = tiny_config()
    before = OmegaConf.to_container(config)
    assert apply_method(config).name == "luffy"
    assert OmegaConf.to_container(config) == before


LUFFY_SWITCHES = (f"{A}.use_off_policy_loss=True", "actor_rollout_ref.rollout.n_prefix=1")  # tiny LUFFY's values
# presets with no demonstration slot (exgrpo: slots get a trace when replayed; questa: the demonstration makes hints;
# ampo: teacher traces replace failed rows after the reward)
ON_POLICY = ("grpo", "relift", "exgrpo", "questa", "ampo")
METHOD_LOSSES = [
    ("hpt", "hpt", "grpo_split"),
    ("srft", "srft", "grpo"),
    ("chord", "chord", "grpo_split"),
    ("grpo", "vanilla", "grpo"),
    ("prefix_rft", "prefix_rft", "grpo"),
    ("uft", "uft", "grpo"),
    ("relift", "vanilla", "grpo"),
    ("exgrpo", "exgrpo", "grpo"),
    ("rl_plus", "rl_plus", "grpo"),
    ("questa", "questa", "grpo"),
    ("ampo", "ampo", "grpo"),
]
# presets that also turn LUFFY's shaping off (tiny LUFFY's off_policy_reshape=p_div_p_0.1 contradicts them)
NO_SHAPING = ("rl_plus",)


@pytest.fixture
def config_without(compose_config, luffy_overrides, tmp_path):
    """The tiny LUFFY config with some of its overrides left out (they fall back to the base YAML's defaults)."""

    def make(dropped, *extra):
        from luffy_pool.config.check import prepare_overrides

        kept = [o for o in luffy_overrides("m", "d", str(tmp_path), steps=2) if o not in dropped]
        return compose_config(prepare_overrides(kept + list(extra)))  # as the trainer's command line composes it

    return make


@pytest.mark.parametrize("method,loss,adv", METHOD_LOSSES)
def test_a_methods_preset_lands_in_the_config_when_nothing_contradicts_it(config_without, method, loss, adv):
    from luffy_pool.config.check import validate_config
    from luffy_pool.config.method_group import apply_method
    from luffy_pool.methods import get_method

    # leave out the LUFFY switches the preset contradicts; prefix_rft / uft keep LUFFY's slot plan (n_prefix=1)
    contradicted = LUFFY_SWITCHES if method in ON_POLICY else LUFFY_SWITCHES[:1]
    if method in NO_SHAPING:
        contradicted += (f"{A}.off_policy_reshape=p_div_p_0.1",)
    config = config_without(contradicted, f"algorithm.method={method}")
    assert apply_method(config).name == method
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (actor.policy_loss, config.algorithm.adv_estimator, actor.use_off_policy_loss) == (loss, adv, False)
    assert rollout.n_prefix == (0 if method in ON_POLICY else 1)
    for path, value in get_method(method).preset_keys().items():
        assert OmegaConf.select(config, path) == value, path
    knobs = get_method(method).knob_defaults()
    # the defaults as the config holds them (a list knob's tuple default is a list there)
    knobs = OmegaConf.to_container(OmegaConf.create(knobs)) if knobs else knobs
    assert OmegaConf.to_container(config.algorithm[method]) == knobs if knobs else method not in config.algorithm
    before = OmegaConf.to_container(config)
    apply_method(config)  # idempotent
    assert OmegaConf.to_container(config) == before
    assert not [e for e in validate_config(config) if "policy_loss" in e or "method" in e]


@pytest.mark.parametrize("method", [m for m, _, _ in METHOD_LOSSES])
def test_luffys_switches_under_another_method_are_refused_in_one_line(tiny_config, method):
    from luffy_pool.config.check import validate_config
    from luffy_pool.config.method_group import apply_method

    config = tiny_config(f"algorithm.method={method}")
    expected = (
        f"algorithm.method={method} sets {A}.use_off_policy_loss=False, but the config has "
        f"{A}.use_off_policy_loss=True; drop that override or choose another algorithm.method"
    )
    with pytest.raises(ValueError) as exc:
        apply_method(config)
    assert str(exc.value) == expected
    assert validate_config(config) == [expected]
    assert config.actor_rollout_ref.actor.use_off_policy_loss is True  # nothing was merged


def test_a_value_contradicting_the_method_is_refused_naming_both_keys(config_without):
    from luffy_pool.config.method_group import apply_method

    config = config_without(LUFFY_SWITCHES[:1], "algorithm.method=hpt", f"{A}.policy_loss=vanilla")
    with pytest.raises(ValueError) as exc:
        apply_method(config)
    msg = str(exc.value)
    assert "\n" not in msg and "algorithm.method=hpt sets" in msg and f"{A}.policy_loss='vanilla'" in msg
    config = config_without(LUFFY_SWITCHES, "algorithm.method=chord", "actor_rollout_ref.rollout.n_prefix=2")
    with pytest.raises(ValueError, match="algorithm.method=chord sets actor_rollout_ref.rollout.n_prefix=1"):
        apply_method(config)


def test_the_trainer_cli_refuses_a_contradiction_in_one_line(config_without):
    from luffy_pool.config.check import ConfigError
    from luffy_pool.run.main_mix_ppo import run

    with pytest.raises(ConfigError, match="algorithm.method=srft sets actor_rollout_ref.actor.off_policy_reshape"):
        run(config_without(LUFFY_SWITCHES[:1], "algorithm.method=srft", f"{A}.off_policy_reshape=p_div_p_0.3"))


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["algorithm.method=luffy", "algorithm.chord.mu_peak=0.9"],
            "algorithm.chord.mu_peak is a knob of algorithm.method=chord, but algorithm.method=luffy; "
            "drop it or set algorithm.method=chord",
        ),
        (
            ["algorithm.method=grpo", "actor_rollout_ref.rollout.n_prefix=2"],
            "algorithm.method=grpo sets actor_rollout_ref.rollout.n_prefix=0, but the config has "
            "actor_rollout_ref.rollout.n_prefix=2; drop that override or choose another algorithm.method",
        ),
    ],
)
def test_a_command_line_contradicting_the_method_is_refused_in_one_line_before_any_worker(
    compose_config, luffy_overrides, tmp_path, overrides, expected
):
    """The overrides as the CLI gets them: prepare_overrides accepts the knob, the composed config is refused by
    validate_config and by the trainer's entry before it builds anything (the model path does not exist)."""
    from luffy_pool.config.check import ConfigError, prepare_overrides, validate_config
    from luffy_pool.run.main_mix_ppo import run

    base = [o for o in luffy_overrides("m", "d", str(tmp_path), steps=2) if o not in LUFFY_SWITCHES]
    config = compose_config(prepare_overrides(base + overrides))
    assert validate_config(config) == [expected]
    with pytest.raises(ConfigError) as exc:
        run(config)
    assert str(exc.value).strip() == expected


# ---------------------------------------------------------------- HPT's gate
def _group_batch(scores, demo):
    """A DataProto of groups: ``scores[g]`` and ``demo[g]`` per row of group g (score on the last token)."""
    from verl.protocol import DataProto

    flat_scores = [s for g in scores for s in g]
    flat_demo = [d for g in demo for d in g]
    rows, width = len(flat_scores), 3
    tls = torch.zeros(rows, width)
    tls[:, -1] = torch.tensor(flat_scores, dtype=torch.float32)
    prefix = torch.zeros(rows, width, dtype=torch.bool)
    prefix[torch.tensor(flat_demo)] = True
    uids = np.array([f"p{g}" for g, grp in enumerate(scores) for _ in grp], dtype=object)
    return DataProto.from_dict(tensors={"token_level_scores": tls, "prefix_mask": prefix}, non_tensors={"uid": uids})


def _sections(switch_gate=0, reward_impl_version=3):
    from luffy_pool.methods.hpt import HptKnobs

    return SimpleNamespace(
        knobs=HptKnobs(switch_gate=switch_gate), data=SimpleNamespace(reward_impl_version=reward_impl_version)
    )


def test_hpt_gate_picks_the_demonstration_when_the_group_has_no_success():
    from luffy_pool.methods.hpt import hpt_gate

    # group 0: no success among its rollouts -> SFT on the demo row; group 1: one success -> RL on its rollouts
    batch = _group_batch(scores=[[0, 0, 0, 1], [1, 0, 0, 1]], demo=[[False, False, False, True]] * 2)
    metrics = hpt_gate(batch, _sections(switch_gate=0))
    assert batch.batch["loss_row_mask"].tolist() == [0, 0, 0, 1, 1, 1, 1, 0]
    assert metrics == {"hpt/sft_group_fraction": 0.5, "hpt/mean_successes": 0.5}
    # gate 2 (the authors' Llama setting): one success is still SFT
    hpt_gate(batch, _sections(switch_gate=2))
    assert batch.batch["loss_row_mask"].tolist() == [0, 0, 0, 1, 0, 0, 0, 1]


# ---------------------------------------------------------------- knobs, masks and step reach the loss
def _knobs(method, **values):
    """``method``'s frozen knob section: its YAML defaults under ``values``."""
    from luffy_pool.methods import get_method

    knobs = get_method(method).knobs
    return knobs(**{**get_method(method).knob_defaults(), **values})


def _stub_actor(method, knobs=None, expert_share=0.25, **loss_keys):
    """What method_policy_loss reads of the actor: its policy loss (the method's registry entry), the
    MethodSelection it got at init, its loss keys and batch sizes."""
    from luffy_pool.methods import MethodSelection, get_method
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.batch_sizes import RankBatchSizes

    loss = dict(
        clip_ratio=0.2,
        loss_remove_token_mean=True,
        loss_remove_clip=True,
        sft_loss_coef=1.0,
        off_policy_reshape="p_div_p_0.1",
        clip_upper_bound=1.0,
    )
    loss.update(loss_keys)
    policy_loss = get_method(method).preset_keys()[f"{A}.policy_loss"]
    return SimpleNamespace(
        policy_loss=policy_loss,
        policy_loss_fn=get_policy_loss_fn(policy_loss),
        policy_loss_cfg=None,
        method_selection=MethodSelection(method, knobs, expert_share),
        update_config=SimpleNamespace(loss=SimpleNamespace(**loss), use_dynamic_bsz=False),
        batch_sizes=RankBatchSizes(ppo_mini_rows=4, ppo_micro_rows=4, gradient_accumulation=1),
        config=None,
        extra_policy_loss=lambda out, metrics: None,
    )


def _loss(actor, micro, log_prob, entropy, mask, step=0, update_state=None):
    """The actor's method loss for the update of zero-based ``step`` (the trainer sends global_steps = step + 1)."""
    from luffy_pool.methods.losses import method_policy_loss

    return method_policy_loss(actor, micro, log_prob, entropy, mask, step + 1, update_state)


def _micro(rows=4, width=3, demo_rows=(3,), seed=0):
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(rows, width, generator=g) - 0.05
    prefix = torch.zeros(rows, width, dtype=torch.bool)
    prefix[list(demo_rows)] = True
    micro = {
        "old_log_probs": log_prob + 0.1 * torch.randn(rows, width, generator=g),
        "advantages": torch.tensor([1.0, -0.5, 0.5, -1.0][:rows]).unsqueeze(-1).expand(rows, width).contiguous(),
        "prefix_mask": prefix,
    }
    entropy = torch.rand(rows, width, generator=g)
    return micro, log_prob, entropy, torch.ones(rows, width)


CHORD_MU = {
    "mu_warmup_steps": 0,
    "mu_decay_steps": 200,
    "mu_peak": 0.9,
    "mu_valley": 0.05,
    "enable_phi_function": False,
    "clip_ratio_c": 3.0,
    "use_token_level_loss_in_sft": True,
}


@pytest.mark.parametrize("step,mu", [(0, 0.9), (50, 0.775520), (100, 0.475), (199, 0.050052), (400, 0.05)])
def test_the_step_reaches_chords_mu(step, mu):
    loss, metrics = _loss(_stub_actor("chord", _knobs("chord", **CHORD_MU), 0.25), *_micro(), step=step)
    assert metrics["actor/mu"] == pytest.approx(mu, abs=1e-6)  # CHORD-μ schedule values
    # one expert row of four in a one-micro-batch mini-batch: each term is the mean over its own rows
    from luffy_pool.methods.chord import ChordConfig, dual_clip_ppo_loss, sft_plain_loss
    from luffy_pool.methods.loss_inputs import FamilyLossInputs

    micro, log_prob, _, mask = _micro()
    part = {
        name: FamilyLossInputs(
            log_prob=log_prob[rows],
            old_log_prob=micro["old_log_probs"][rows],
            advantages=micro["advantages"][rows],
            response_mask=mask[rows],
        )
        for name, rows in (("usual", [0, 1, 2]), ("expert", [3]))
    }
    usual, _ = dual_clip_ppo_loss(part["usual"], ChordConfig(clip_range=0.2))
    expert, _ = sft_plain_loss(part["expert"], ChordConfig())
    assert loss.item() == pytest.approx((1 - mu) * usual.item() + mu * expert.item(), rel=1e-5)


def test_the_loss_gets_the_selected_knobs_a_zero_based_step_and_the_update_state(config_without):
    """What the trainer sends with an update (meta_info global_steps, update_state) and what the worker got at
    init (select_method: the knob section and n_prefix / n) reach the method's loss as its inputs."""
    from luffy_pool.config.method_group import apply_method
    from luffy_pool.methods import select_method

    config = config_without(
        LUFFY_SWITCHES[:1], "algorithm.method=chord", "actor_rollout_ref.rollout.n=8", "algorithm.chord.mu_peak=0.9"
    )
    apply_method(config)
    selection = select_method(config)
    assert selection.knobs == _knobs("chord", mu_peak=0.9) and selection.expert_share == 0.125
    seen = []
    actor = _stub_actor("chord", selection.knobs, selection.expert_share)
    actor.policy_loss_fn = lambda inputs, cfg: (seen.append(inputs) or torch.tensor(0.0), {})
    actor.method_selection = selection
    from luffy_pool.methods.losses import method_policy_loss

    method_policy_loss(actor, *_micro(), global_steps=1, update_state={"mixed": True})
    (inputs,) = seen
    assert (inputs.knobs, inputs.step, inputs.expert_share) == (selection.knobs, 0, 0.125)
    assert inputs.update_state == {"mixed": True} and inputs.settings is actor.update_config.loss
    with pytest.raises(ValueError, match="needs the update's step \\(meta_info\\['global_steps'\\]\\)"):
        method_policy_loss(actor, *_micro(), global_steps=None, update_state=None)


def test_hpt_rows_the_gate_dropped_count_as_removed():
    """Masking a row out of the hpt loss equals the authors' removing it from the batch."""
    from luffy_pool.methods.hpt import HptConfig, hpt_sft_loss
    from luffy_pool.methods.loss_inputs import FamilyLossInputs

    micro, log_prob, entropy, mask = _micro(rows=4, demo_rows=(2, 3))
    micro["loss_row_mask"] = torch.tensor([1.0, 1.0, 0.0, 1.0])  # row 2 (a demo row of an RL group) dropped
    loss, metrics = _loss(_stub_actor("hpt", _knobs("hpt", switch_gate=0)), micro, log_prob, entropy, mask)
    keep = [0, 1, 3]
    kept = FamilyLossInputs(
        log_prob=log_prob[keep],
        old_log_prob=micro["old_log_probs"][keep],
        advantages=micro["advantages"][keep],
        response_mask=mask[keep],
        prefix_mask=micro["prefix_mask"][keep],
    )
    expected, _ = hpt_sft_loss(kept, HptConfig(loss_remove_token_mean=True, loss_remove_clip=True))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["actor/sft_loss"] == pytest.approx(float(-log_prob[3].mean()), rel=1e-6)


def test_srft_correct_rows_come_from_the_row_scores():
    micro, log_prob, entropy, mask = _micro()
    knobs = _knobs("srft", srft_type="paper", sft_weight_scale=0.5, rl_pos_weight_scale=0.1)
    actor = _stub_actor("srft", knobs)
    micro["row_scores"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    loss_a, _ = _loss(actor, dict(micro), log_prob, entropy, mask)
    micro["row_scores"] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    loss_b, metrics = _loss(actor, dict(micro), log_prob, entropy, mask)
    # row 0 correct: its on-policy weight is 0.1·e^{H_0} instead of −1 (sum / width, width 3)
    h0 = entropy[0].mean()
    delta = (-(0.1 * torch.exp(h0)) * log_prob[0]).sum() / 3 - (1.0 * log_prob[0]).sum() / 3
    assert (loss_a - loss_b).item() == pytest.approx(delta.item(), rel=1e-5)
    assert metrics["actor/srft/H"] == pytest.approx(float(entropy.mean(-1).mean()), rel=1e-6)


def test_prefix_rft_and_uft_losses_read_their_knobs_and_the_actors_clip_keys():
    from luffy_pool.methods.loss_inputs import FamilyLossInputs
    from luffy_pool.methods.prefix_rft import PrefixRftConfig, prefix_rft_loss
    from luffy_pool.methods.uft import UftLossConfig, uft_loss

    micro, log_prob, entropy, mask = _micro()
    inputs = FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=micro["old_log_probs"],
        advantages=micro["advantages"],
        response_mask=mask,
        prefix_mask=micro["prefix_mask"],
        entropy=entropy,
    )
    knobs = _knobs("prefix_rft", ratio_start=0.95, ratio_end=0.05, decay_steps=None, prefix_entropy_top_frac=0.4)
    actor = _stub_actor("prefix_rft", knobs, loss_remove_clip=False)
    loss, metrics = _loss(actor, dict(micro), log_prob, entropy, mask, step=3)
    expected, _ = prefix_rft_loss(inputs, PrefixRftConfig(prefix_entropy_top_frac=0.4, loss_remove_clip=False))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["actor/prefix_rft/kept_prefix_share"] == pytest.approx(2 / 3)  # ceil(0.4 * 3) of the demo row
    loss, metrics = _loss(_stub_actor("uft", _knobs("uft", hint_sft_coef=0.5)), dict(micro), log_prob, entropy, mask)
    expected, _ = uft_loss(inputs, UftLossConfig(hint_sft_coef=0.5, loss_remove_token_mean=True, loss_remove_clip=True))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["actor/uft/hint_nll"] == pytest.approx(float(-log_prob[3].mean()), rel=1e-6)


@pytest.mark.parametrize("started_with", [None, "hpt"])
def test_an_actor_not_started_with_the_losss_method_refuses_it(started_with):
    from luffy_pool.methods import MethodSelection
    from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor

    actor = _stub_actor("chord", _knobs("chord", **CHORD_MU))
    actor.method_selection = None if started_with is None else MethodSelection(started_with, _knobs("hpt"))
    expected = (
        f"policy loss 'chord' is algorithm.method=chord's loss, but this actor was started with "
        f"algorithm.method={started_with}"
    )
    with pytest.raises(ValueError) as exc:
        MIXDataParallelPPOActor.compute_policy_loss(actor, *_micro(), global_steps=1)
    assert str(exc.value) == expected


def test_exgrpo_clips_in_warm_up_and_not_in_the_mixed_phase():
    """The trainer sends the phase with the update (``update_state["mixed"]``, from ExGRPO's before_update hook);
    the loss is exgrpo_token_loss with ``loss_remove_clip`` only when mixed (the authors force PPO clip in
    warm-up)."""
    from luffy_pool.methods.exgrpo.blocks import ExgrpoLossConfig, exgrpo_token_loss
    from luffy_pool.methods.loss_inputs import FamilyLossInputs

    micro, log_prob, entropy, mask = _micro()
    micro["old_log_probs"] = log_prob - torch.tensor([0.5, -0.5, 0.5, -0.3]).unsqueeze(-1)  # ratios far outside 1 ± 0.2
    inputs = FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=micro["old_log_probs"],
        advantages=micro["advantages"],
        response_mask=mask,
        prefix_mask=micro["prefix_mask"],
    )
    actor = _stub_actor(
        "exgrpo", _knobs("exgrpo"), 0.0, off_policy_max_clip=-1, off_policy_min_clip=-1, all_max_clip=-1
    )
    for mixed in (False, True):
        loss, metrics = _loss(actor, micro, log_prob, entropy, mask, update_state={"mixed": mixed})
        expected, _ = exgrpo_token_loss(inputs, ExgrpoLossConfig(loss_remove_clip=mixed))
        assert float(loss) == pytest.approx(float(expected), rel=1e-6)
        assert (metrics["actor/on_pg_clipfrac"] > 0) == (not mixed)


def test_exgrpo_refuses_self_replay_in_one_line(tiny_config):
    from luffy_pool.config.method_group import apply_method

    with pytest.raises(ValueError, match="algorithm.method=exgrpo sets data.self_replay.enable=False"):
        apply_method(tiny_config("algorithm.method=exgrpo", "data.self_replay.enable=True"))


@pytest.mark.parametrize(
    "indexes,problem",
    [
        (None, None),  # no extra_info: the row position is the id
        ([3, 1, 2], None),
        ([3, None, 2], "row 1: column 'extra_info.index' is missing, but {a} row 0 has one"),
        ([3, 1, 3], "row 2: column 'extra_info.index' repeats 3 of {a} row 0"),
    ],
)
def test_exgrpo_needs_one_question_id_per_row(tmp_path, indexes, problem):
    import pandas as pd

    from luffy_pool.run.preflight import check_question_ids

    a = str(tmp_path / "a.parquet")
    frame = pd.DataFrame({"prompt": ["x", "y", "z"]})
    if indexes is not None:
        frame["extra_info"] = [{"index": i} if i is not None else {"split": "train"} for i in indexes]
    frame.to_parquet(a)
    got = check_question_ids([a], "exgrpo")
    if problem is None:
        assert got is None
    else:
        assert got.startswith(f"data.train_files: {a}: {problem.format(a=a)}") and "algorithm.method=exgrpo" in got
    assert check_question_ids([a], "luffy") is None


def test_exgrpo_question_ids_must_be_unique_across_train_files(tmp_path):
    import pandas as pd

    from luffy_pool.run.preflight import check_question_ids

    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pd.DataFrame({"prompt": ["x"], "extra_info": [{"index": 0}]}).to_parquet(a)
    pd.DataFrame({"prompt": ["y"], "extra_info": [{"index": 0}]}).to_parquet(b)
    assert check_question_ids([a, b], "exgrpo").startswith(
        f"data.train_files: {b}: row 0: column 'extra_info.index' repeats 0 of {a} row 0"
    )


# ---------------------------------------------------------------- data checks before Ray
@pytest.mark.parametrize(
    "method,refused",
    [
        ("hpt", True),
        ("srft", True),
        ("chord", True),
        ("relift", True),
        ("luffy", False),
        ("grpo", False),
        ("prefix_rft", True),
        ("uft", False),
        ("rl_plus", True),
        ("ampo", False),
    ],
)
def test_a_null_demonstration_is_refused_for_the_methods_that_train_on_it(tmp_path, method, refused):
    import pandas as pd

    from luffy_pool.run.preflight import check_demonstrations

    path = str(tmp_path / "train.parquet")
    pd.DataFrame({"prompt": ["a", "b", "c"], "target": [[{"content": "x"}], None, [{"content": "y"}]]}).to_parquet(path)
    problem = check_demonstrations(path, "target", method)
    if refused:
        assert problem == (
            f"data.train_files: {path}: row 1: column 'target' is null, but algorithm.method={method} "
            "trains on every prompt's demonstration"
        )
    else:
        assert problem is None


def test_a_missing_demonstration_column_is_refused_before_ray_naming_file_and_column(
    tmp_path, compose_config, luffy_overrides, tiny_model_dir
):
    import pandas as pd

    from luffy_pool.run.launcher import build_trainer
    from luffy_pool.run.preflight import PreflightError

    data = tmp_path / "data"
    data.mkdir()
    rows = {
        "prompt": [[{"role": "user", "content": "1+1"}]],
        "data_source": ["t"],
        "reward_model": [{"ground_truth": "2", "style": "rule"}],
    }
    pd.DataFrame(rows).to_parquet(data / "train.parquet")
    pd.DataFrame(rows).to_parquet(data / "test.parquet")
    overrides = luffy_overrides(tiny_model_dir, str(data), str(tmp_path / "out"), steps=2)
    config = compose_config([o for o in overrides if o not in LUFFY_SWITCHES[:1]] + ["algorithm.method=srft"])
    with pytest.raises(PreflightError, match=f"data.train_files: {data}/train.parquet: missing column 'target'"):
        build_trainer(config)
