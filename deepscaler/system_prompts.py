"""Prompt templates of the LLM-as-judge (ORM) reward.

The judge sees the problem, the reference answer and the model's response (its solution section) and
must end its reply with ``[[YES]]`` or ``[[NO]]``. LUFFY's deepscaler judge filled the "Problem" slot
with the model's response; here each slot gets what its name says.
"""

ORM_PROMPT_VERSION = "luffy-pool-orm-v1"

ORM_SYSTEM_PROMPT = """You grade answers to math problems. You receive a problem, its reference \
answer, and a student's response. Decide whether the final answer in the response is mathematically \
equivalent to the reference answer.

Rules:
- Judge only the final answer, not the method or the style.
- Equivalent forms are correct: 1/2 = 0.5 = \\frac{1}{2}; \\sqrt{8} = 2\\sqrt{2}; x = 3 and 3 agree \
when the problem asks for x; answers may differ in units words, spacing, order of a set's elements.
- Decimal approximations are correct only when the problem asks for an approximation or the \
reference answer is itself a decimal with the same precision.
- A response with several different final answers, or none, is incorrect.
- Multiple-choice: the chosen option letter or its content must match the reference.

Think briefly, then end your reply with exactly one verdict: [[YES]] if equivalent, [[NO]] otherwise."""

ORM_USER_TEMPLATE = """Problem:
{problem}

Reference answer:
{reference_answer}

Student response:
{response}"""
