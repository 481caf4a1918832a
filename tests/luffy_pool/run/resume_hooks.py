"""A ``prepare`` hook for test_resume_e2e's ``Driver`` (``prepare="resume_hooks:dump_and_hang_in_last_step"``):
one driver is both the uninterrupted reference up to a step and a run SIGKILLed inside the next one.

The run is configured one step longer than the steps a test compares. When that last step begins (nothing of it
drawn, trained or recorded), the hook writes the weights the earlier steps left as an HF folder
(``weights_before_last_step`` in the driver's folder), prints ``DUMPED <step>`` and waits to be killed. A
resumed driver with the same hook stops at the same point, so its steps and weights compare with the first's.
"""

from __future__ import annotations

import os
import time

DUMP_DIR = "weights_before_last_step"


def dump_and_hang_in_last_step(trainer) -> None:
    real_step, last = trainer.rollout_step, trainer.last_step()

    def step(timing):
        if trainer.global_steps == last:
            trainer.wg.save_hf_model(os.path.join(os.getcwd(), DUMP_DIR))  # the driver runs in its result folder
            print(f"DUMPED {last - 1}", flush=True)
            time.sleep(3600)  # the parent SIGKILLs the driver here
        return real_step(timing)

    trainer.rollout_step = step
