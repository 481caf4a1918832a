"""A method's preset as command-line overrides: a test config built on the tiny LUFFY overrides (LUFFY's switches
on, one demonstration slot) states the method's preset, as the family's launch scripts do on top of train.sh, since
a contradicting value is refused (luffy_pool/config/method_group.py)."""

from __future__ import annotations


def preset_overrides(method: str) -> list[str]:
    from luffy_pool.methods import get_method

    return [f"{key}={value}" for key, value in get_method(method).preset_keys().items()]
