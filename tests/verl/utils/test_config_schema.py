"""verl/utils/config_schema.py: the schema helpers both trainers' config checks are built on, on a toy schema."""

import pytest
from omegaconf import OmegaConf

from verl.utils.config_schema import (
    NONE_TYPE,
    SchemaConfigError,
    enum_error,
    load_yaml_tree,
    prepare_overrides,
    resolved_tree,
    suggest_key,
    type_ok,
    unknown_key_message,
    value_error,
    walk,
)

TREE = {"data": {"batch_size": 8, "files": ["a", "b"], "extra": {}}, "model": {"path": "???", "kwargs": {"x": 1}}}


def test_walk_yields_leaves_only_with_empty_dicts_and_lists_as_values():
    assert list(walk(TREE)) == [
        ("data.batch_size", 8),
        ("data.files", ["a", "b"]),
        ("data.extra", {}),
        ("model.path", "???"),
        ("model.kwargs.x", 1),
    ]


def test_walk_with_sections_yields_nodes_first_and_stops_at_open_keys():
    assert [k for k, _ in walk(TREE, sections=True, open_keys=("model.kwargs",))] == [
        "data",
        "data.batch_size",
        "data.files",
        "data.extra",
        "model",
        "model.path",
        "model.kwargs",
    ]


def test_load_yaml_tree_drops_hydra_nodes_and_resolves_on_request(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("defaults:\n  - _self_\na: 3\nb: ${a}\nhydra:\n  run:\n    dir: .\n")
    assert load_yaml_tree(str(path), resolve=True) == {"a": 3, "b": 3}
    assert load_yaml_tree(str(path), resolve=False) == {"a": 3, "b": "${a}"}


def test_resolved_tree_names_the_key_of_a_broken_interpolation():
    assert resolved_tree({"a": 1, "b": "${a}", "hydra": {"x": 1}}, SchemaConfigError) == {"a": 1, "b": 1}
    with pytest.raises(SchemaConfigError, match=r"Cannot resolve config key 'b'"):
        resolved_tree(OmegaConf.create({"b": "${nope}"}), SchemaConfigError)


@pytest.mark.parametrize(
    "value,types,ok",
    [
        (3, (float,), True),
        (3.0, (int,), False),
        (True, (int,), False),
        (True, (bool,), True),
        (None, (str,), False),
        (None, (str, NONE_TYPE), True),
        ({}, (dict,), True),
        ([1], (str,), False),
    ],
)
def test_type_ok_counts_int_as_float_but_never_bool_as_number(value, types, ok):
    assert type_ok(value, types) is ok


def test_value_and_enum_errors_name_the_key():
    assert value_error("m.path", "???", (str,)) == "'m.path' is required (no default); pass m.path=..."
    assert value_error("d.n", "4", (int, NONE_TYPE)) == "'d.n' must be int or null, got '4'"
    assert value_error("d.n", 4, (int,)) is None
    assert (
        enum_error("k", "cosin", ("cosine", "constant"))
        == "'k'='cosin' is not one of: cosine, constant (did you mean 'cosine'?)"
    )
    assert enum_error("k", "zzz", ("cosine",)) == "'k'='zzz' is not one of: cosine"
    assert enum_error("k", "cosine", ("cosine",)) is None


def test_suggest_key_prefers_same_last_segment_then_whole_path_then_segment():
    keys = ["actor.lr", "critic.lr", "data.batch_size", "trainer.total_epochs"]
    assert suggest_key("actr.lr", keys, leaf_cutoff=0.6) == "actor.lr"  # same segment, closer whole path
    assert suggest_key("critc.lr", keys, leaf_cutoff=0.6) == "critic.lr"
    assert suggest_key("data.batch_sise", keys, leaf_cutoff=0.6) == "data.batch_size"
    assert suggest_key("x.total_epoch", keys, leaf_cutoff=0.75) == "trainer.total_epochs"
    assert suggest_key("x.qqq", keys, leaf_cutoff=0.6) is None
    assert unknown_key_message("x.qqq", None) == "Unknown config key 'x.qqq'"
    assert unknown_key_message("a.b", "a.c") == "Unknown config key 'a.b'; did you mean 'a.c'?"


def _classify(key):
    return {"a.b": "schema", "opt": "optional"}.get(key)


def _unknown(key, plus):
    return f"unknown {key} plus={plus}"


def test_prepare_overrides_strips_plus_on_schema_keys_and_adds_double_plus_to_others():
    out = prepare_overrides(
        ["+a.b=1", "opt=2", "hydra.run.dir=.", "++a.b=3"],
        classify=_classify,
        unknown_message=_unknown,
        error_cls=SchemaConfigError,
    )
    assert out == ["a.b=1", "++opt=2", "hydra.run.dir=.", "a.b=3"]


def test_prepare_overrides_lists_every_problem():
    with pytest.raises(SchemaConfigError) as info:
        prepare_overrides(
            ["x=1", "+y=2", "~a.b", "a.b@p=1"],
            classify=_classify,
            unknown_message=_unknown,
            error_cls=SchemaConfigError,
        )
    assert info.value.errors == [
        "unknown x plus=False",
        "unknown y plus=True",
        "Deleting config keys is not supported: '~a.b'",
        "Package overrides are not supported: 'a.b@p=1'",
    ]
    assert prepare_overrides(
        ["~a.b"],
        classify=_classify,
        unknown_message=_unknown,
        error_cls=SchemaConfigError,
        allow_delete_and_package=True,
    ) == ["~a.b"]
    with pytest.raises(SchemaConfigError, match="^Cannot parse override"):
        prepare_overrides(["a=[1,"], classify=_classify, unknown_message=_unknown, error_cls=SchemaConfigError)
