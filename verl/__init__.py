"""verl package. ``from verl import DataProto`` works as in verl (LUFFY's mix_src modules import it that way); the
name is loaded on first use so ``import verl.<light module>`` (the config checker) does not pull in torch."""

__all__ = ["DataProto"]


def __getattr__(name: str):
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
