"""Offline evaluation: batch generation and grading over benchmark parquets, and result tables.

Run as scripts (``python eval_scripts/generate_vllm.py ...``) or modules (``python -m eval_scripts.generate_vllm``).
"""
