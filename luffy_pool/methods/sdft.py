"""``algorithm.method=sdft`` (arXiv 2601.19897, Self-Distillation Fine-Tuning): the demonstration is not trained on;
the model shown it in its prompt (``"{prompt}\\n\\n{privileged_context}"``) is the teacher of its own fresh
rollouts, distilled into the student (the plain prompt) on the rollouts' sampled tokens. No reward enters the loss.

Reference followed: TRL release 1.16.0 (PyPI wheel), ``trl/experimental/sdft``: ``sdft_trainer.py``
``DemonstrationTeacherContextBuilder`` (135-205: the teacher prompt; a list of messages as privileged context is
joined by newlines) -> :meth:`DemonstrationTeacher.teacher_prompt`, ``compute_loss`` /
``_compute_self_distillation_loss`` (812-903) and ``loss_utils.py`` (sampled-token loss 114-135, IS clip 56-65) ->
the blocks of luffy_pool/methods/sdpo.py (:func:`~luffy_pool.methods.sdpo.distillation_loss`), whose teacher pass
(:class:`~luffy_pool.methods.sdpo.SelfTeacher`) this method shares. The SDFT authors' own code was not located.

Teacher: ``teacher=base`` (their default ``teacher_model_kind``): the frozen initial model, i.e. the worker's
reference model; ``ema``: the reference moved toward the actor after each step (rate 0.05, checkpointed).

Differences kept visible: their default ``distillation_mode=topk_logits`` (k = 100 over the student's support,
α = 0.5) needs the teacher's logits, which the reference pass does not return: it is refused at pre-flight, as is
``full_logits``; the default here is ``sampled_token`` (their reverse-KL mode, α = 1). A train row whose target is
null is refused at pre-flight (``needs_demonstration``; theirs raises). ``num_loss_tokens_to_skip`` (theirs 0) and
``generate_from_teacher`` (theirs False) are not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.sdpo import IS_CLIP, TEACHER_KEYS, SelfTeacher, distillation_loss
from verl.utils.config_section import OPEN_UNIT, key

# TRL SDFTConfig.teacher_prompt_template
TEACHER_TEMPLATE = "{prompt}\n\n{privileged_context}"
NO_LOGITS = "not implemented: the teacher pass returns the sampled token's log-prob, not logits"


def privileged_text(target) -> str | None:
    """The demonstration as text: a string as is, a list of messages as their contents joined by newlines."""
    if target is None:
        return None
    if isinstance(target, str):
        return target
    chunks = [str(m.get("content", "")) for m in list(target) if isinstance(m, dict)]
    return "\n".join(c for c in chunks if c)


@dataclass(frozen=True)
class SdftKnobs:
    """``algorithm.sdft``: TRL 1.16.0 ``SDFTConfig``'s defaults (trl/experimental/sdft/sdft_config.py)."""

    distillation_mode: str = key(
        choices=("sampled_token", "topk_logits", "full_logits"),
        refuse={"topk_logits": NO_LOGITS, "full_logits": NO_LOGITS},
        default="sampled_token",
        doc="sampled_token: reverse KL on the sampled token (alpha 1). TRL SDFTConfig.distillation_mode default is "
        "topk_logits (k=100, alpha 0.5), refused here: the reference pass gives no logits.",
    )
    is_clip: float = key(
        bounds=IS_CLIP,
        default=2.0,
        doc="Cap of the detached ratio exp(l - l_old) multiplying each distillation token; -1 off. TRL "
        "SDFTConfig.distillation_is_clip: 2.0.",
    )
    teacher: str = key(
        choices=("base", "ema"),
        default="base",
        doc="base: the frozen initial model (the reference); ema: the reference moved toward the actor after each "
        "step. TRL SDFTConfig.teacher_model_kind: base.",
    )
    ema_rate: float = key(
        bounds=OPEN_UNIT,
        default=0.05,
        doc="EMA rate r (teacher=ema): teacher <- (1-r)*teacher + r*actor. TRL SDFTConfig.teacher_update_rate: 0.05.",
    )


def sdft_loss(inputs: FamilyLossInputs, knobs: SdftKnobs, step: int):
    """The self-distillation term only (their ``compute_loss``)."""
    return distillation_loss(inputs, knobs, "sdft")


class DemonstrationTeacher(SelfTeacher):
    """SDFT's teacher prompt: the prompt followed by the row's demonstration (dataset target)."""

    name = "sdft"

    def __init__(self, context):
        super().__init__(context)
        s = context.sections
        self.targets = [privileged_text(t) for t in self.dataset.dataframe[s.data.target_key].tolist()]

    def teacher_prompt(self, batch, row: int, item: int, context: dict):
        demo = self.targets[item]
        if demo is None:
            return None
        return self.chat_prompt(item, TEACHER_TEMPLATE.format(prompt=self.user_text(item), privileged_context=demo))


SDFT = register_method(
    Method(
        name="sdft",
        mechanism="self-distillation: the policy with the demonstration in its prompt teaches its own rollouts",
        knobs=SdftKnobs,
        loss=sdft_loss,
        hooks=DemonstrationTeacher,
        needs_demonstration=True,
        batch_keys=TEACHER_KEYS,
    )
)
