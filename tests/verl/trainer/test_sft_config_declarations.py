"""The SFT trainer's keys are declared once (verl/trainer/sft/config.py) and in step with sft_trainer.yaml."""

import pytest

from verl.trainer.sft.config import declared, schema_defaults
from verl.utils.config_schema import type_ok


def test_every_yaml_key_is_declared_and_every_declaration_is_a_yaml_key():
    assert set(declared()) == set(schema_defaults())


@pytest.mark.parametrize("key", sorted(schema_defaults()))
def test_the_yaml_default_satisfies_its_declaration(key):
    d, default = declared()[key], schema_defaults()[key]
    if default == "???" or (isinstance(default, str) and "${" in default):  # required, or an interpolation
        return
    assert type_ok(default, d.types), (key, default, d.types)
    allowed = d.allowed()
    for item in default if isinstance(default, list) and allowed is not None else [default]:
        assert allowed is None or item in allowed, (key, item, allowed)
    assert d.bounds is None or default is None or d.bounds.ok(default), (key, default)
