"""LUFFY's ``deepscaler.globals`` (its scripts import the think delimiters from here).

The two delimiters equal the strings every grader of this package splits on
(``deepscaler.rewards.math_utils.extract.THINK_OPEN`` / ``THINK_CLOSE``; a test keeps them equal; literals
here so that importing this module loads no grader). The judge settings are LUFFY's defaults, kept for
scripts that read them; this package's LLM judge takes its model and endpoint from ``reward.orm.*``.
"""

THOUGHT_DELIMITER_START = "<think>"
THOUGHT_DELIMITER_END = "</think>"
GCP_PROJECT_ID = None
GCP_LOCATION = None
GEMINI_MODEL = "gemini-1.5-pro-002"
OAI_RM_MODEL = "gpt-4o-mini"
