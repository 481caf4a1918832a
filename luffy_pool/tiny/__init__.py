"""Offline tiny model, tokenizer and synthetic arithmetic task.

Nothing can be downloaded from a model hub on CI or a laptop, so tests and the CPU quickstart build
their own Qwen2-architecture model (random, seeded weights) and a byte-level BPE tokenizer trained on
the synthetic task's text. The folder is a normal ``save_pretrained`` folder: transformers, vLLM and
the trainer load it like any hub checkpoint.
"""

from luffy_pool.tiny.arith_task import ArithProblem, make_problems, solve_with_trace, write_task_parquets
from luffy_pool.tiny.model import TinyModelSpec, build_tiny_model, build_tokenizer

__all__ = [
    "ArithProblem",
    "TinyModelSpec",
    "build_tiny_model",
    "build_tokenizer",
    "make_problems",
    "solve_with_trace",
    "write_task_parquets",
]
