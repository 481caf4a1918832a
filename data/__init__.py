"""Dataset preparation scripts (training, SFT and SFT-then-RL parquets) and their shared validation helpers.

The scripts run as ``python data/prepare_train.py ...`` or ``python -m data.prepare_train ...``; the
evaluation scripts import :mod:`verl.utils.data_format` to validate benchmark parquets with the same errors.
"""
