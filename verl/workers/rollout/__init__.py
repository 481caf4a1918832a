"""Rollout engines: vLLM (default, GPU and CPU build) and HF generate (fallback)."""
