"""``algorithm.method=luffy`` (default): LUFFY as configured by the actor's and rollout's keys (its loss switch
``use_off_policy_loss``, its prefix plan); selecting it changes nothing, so existing runs are bit for bit the same."""

from luffy_pool.methods.base import Method, register_method

LUFFY = register_method(
    Method(name="luffy", mechanism="on-policy GRPO rows + the demonstration as an in-group row, shaped f(p)=p/(p+0.1)")
)
