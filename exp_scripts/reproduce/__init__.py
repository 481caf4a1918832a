"""Helpers of ``exp_scripts/reproduce_tiny.py``: the method table, the per-run drivers, evaluation and the report.

Each baseline of LUFFY's comparison is one entry of ``methods.METHODS`` backed by a tiny CPU config in
``luffy_pool/config``; ``run_rl`` trains one RL method in its own process, ``evaluate`` scores a model
folder with ``eval_scripts/generate_vllm.py`` and ``report`` turns the runs into ``results.md`` and plots.
``task`` builds the model and the split files, ``regime`` checks the no-reward preset's start model, and
``results_md`` writes the protocol's ``results.md`` / ``results.json`` (``summary`` computes what they show).
"""
