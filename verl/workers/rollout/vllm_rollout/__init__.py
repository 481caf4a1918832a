"""vLLM rollout: the engine wrapper, its config translation and the worker-side weight-sync extension."""

from verl.workers.rollout.vllm_rollout.vllm_rollout import VLLMRollout

__all__ = ["VLLMRollout"]
