"""Parts of the SFT baseline trainer (verl/trainer/fsdp_sft_trainer.py): config checks, data, loss, FSDP2 model.

Split by responsibility so each can be tested alone on CPU; the training loop and entry points live in
``verl.trainer.fsdp_sft_trainer``.
"""
