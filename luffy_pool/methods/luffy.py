"""``algorithm.method=luffy`` (default; arXiv 2504.14945, ElliottYan/LUFFY): LUFFY as its keys configure it.

Its switches (``actor.use_off_policy_loss`` / ``actor.use_sft_multitask_loss`` under ``actor.policy_loss=auto``)
and its slot plan (``rollout.n_prefix``, ``min/max_prefix_ratio``) are keys of the base YAML, read by verl's loss
registry (luffy_pool/algorithm/mix_core_alg.py registers LUFFY's losses) and the slot plan; selecting the method
sets nothing, so an existing LUFFY run is the same bit for bit.
"""

from luffy_pool.methods.base import Method, register_method

LUFFY = register_method(
    Method(name="luffy", mechanism="on-policy GRPO rows + the demonstration as an in-group row, shaped f(p)=p/(p+0.1)")
)
