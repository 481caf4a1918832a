"""LUFFY's family (ExGRPO, ReLIFT, HPT, SRFT, CHORD, UFT, Prefix-RFT) as pure building blocks, one module per method.

Importing this package registers every block in :mod:`luffy_pool.algorithm.family.registry` (losses with the
``fn(inputs, cfg) -> (loss, metrics)`` call shape of ``verl.trainer.ppo.core_algos``, step schedules, gates).
Nothing here is wired into the trainer yet: the blocks are the ground floor of issue 32, checked against the
authors' own functions (tests/data/family_golden/README.md) and METHODS_SPEC §10's hand values.
"""

from luffy_pool.algorithm.family import chord, exgrpo, hpt, prefix_rft, relift, srft, uft  # noqa: F401  (registers)
