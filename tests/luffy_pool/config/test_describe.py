"""python -m luffy_pool.config.describe: a key's type, default, allowed values, bounds, LUFFY status and doc, all
read from its one declaration and its YAML comment."""

from luffy_pool.algorithm.mix_core_alg import OFF_POLICY_RESHAPES
from luffy_pool.config.check import declared
from luffy_pool.config.describe import describe, main, yaml_docs


def test_every_yaml_key_has_its_doc_from_the_comment_above_it():
    docs = yaml_docs()
    undocumented = [k for k, d in declared().items() if not d.optional and not docs.get(k)]
    assert not undocumented


def test_a_key_is_described_from_its_declaration_and_the_owners_value_list():
    text = describe("actor_rollout_ref.actor.off_policy_reshape")
    assert "default: 'no_reshape'" in text
    assert f"allowed: {', '.join(OFF_POLICY_RESHAPES)}" in text
    assert "doc: Shaping f(p) of off-policy tokens" in text
    clip = describe("actor_rollout_ref.actor.off_policy_max_clip")
    assert "type: float" in clip and "bounds: must be -1 (off) or > 0" in clip and "default: -1" in clip


def test_inert_and_refused_values_say_why():
    assert "accepted at its default only" in describe("actor_rollout_ref.actor.use_target_lst")
    assert "refused: 'gae' (needs a critic" in describe("algorithm.adv_estimator")


def test_an_unknown_key_gets_the_closest_one_and_exit_code_1(capsys):
    assert main(["actor_rollout_ref.actor.off_policy_max_clp"]) == 1
    assert "did you mean 'actor_rollout_ref.actor.off_policy_max_clip'" in capsys.readouterr().out
    assert main(["trainer.seed"]) == 0
