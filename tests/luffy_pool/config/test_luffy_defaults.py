"""Our defaults against LUFFY's: every key both YAMLs share has LUFFY's value, except the user guide's table
(docs/user_guide.md, "Differences from LUFFY's defaults")."""

import json
import os
import re

from luffy_pool.config.check import schema_defaults

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LUFFY_DEFAULTS = os.path.join(REPO, "tests", "data", "luffy_mix_ppo_trainer_defaults.json")


def _luffy() -> dict:
    with open(LUFFY_DEFAULTS) as f:
        return json.load(f)["defaults"]


def _documented_differences() -> dict[str, tuple[str, str]]:
    """``{key: (LUFFY value, our value)}`` from the user guide's table of deliberate differences."""
    text = open(os.path.join(REPO, "docs", "user_guide.md")).read()
    section = text.split("### Differences from LUFFY's defaults", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]*)` \| `([^`]*)` \|", section, flags=re.M)
    return {key: (luffy, ours) for key, luffy, ours in rows}


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)  # LUFFY writes top_p: 1, we write 1.0
    return a == b


def test_every_shared_key_has_luffys_default_or_is_in_the_documented_table():
    ours, luffy, table = schema_defaults(), _luffy(), _documented_differences()
    assert set(luffy) <= set(ours), sorted(set(luffy) - set(ours))
    differing = {k for k in luffy if not _same(ours[k], luffy[k])}
    assert differing == set(table), (sorted(differing - set(table)), sorted(set(table) - differing))
    for key, (luffy_text, ours_text) in table.items():  # the table shows the real values
        assert str(luffy[key]) == luffy_text and str(ours[key]) == ours_text, key


def test_the_review_items_defaults_are_luffys():
    ours = schema_defaults()
    assert ours["actor_rollout_ref.actor.use_kl_loss"] is True
    assert ours["actor_rollout_ref.actor.kl_loss_coef"] == 0.001
    assert ours["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert ours["actor_rollout_ref.rollout.n_val"] == 8
    assert ours["trainer.logger"] == ["console", "wandb"]
    assert ours["trainer.resume_from_path"] is False


def test_the_copy_of_luffys_list_is_luffys_yaml_shape():
    luffy = _luffy()
    # a sanity check of the stored copy itself: LUFFY's sections, no critic keys (not shipped)
    assert {k.split(".", 1)[0] for k in luffy} == {"data", "actor_rollout_ref", "reward_model", "algorithm", "trainer"}
    assert luffy["algorithm.adv_estimator"] == "gae" and luffy["actor_rollout_ref.rollout.n_val"] == 8
