"""torchrun for the SFT trainer, ending with 128 + signal when stopped by SIGTERM/SIGINT (143 / 130).

``python -m verl.trainer.sft.launch <torchrun arguments>`` is ``python -m torch.distributed.run <same>``
(exp_scripts/train_sft.sh execs it, so it is the script's own process). On a stop signal torch's agent
(torch/distributed/elastic/agent/server/api.py, ``run``) raises ``SignalException``, sends the same signal
to every rank's process group and waits up to ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds before SIGKILL,
then re-raises; plain torchrun would end with exit code 1 and a traceback. The SFT ranks finish their
step, write its HF folder and exit 143 meanwhile; here the agent's ``SignalException`` becomes one log line
and exit code 128 + signal, the shell convention the RL driver follows.

torch's 30 s default wait is shorter than finishing a long step and gathering and writing a 7B model, so
this launcher raises it to ``DEFAULT_SHUTDOWN_TIMEOUT_S`` unless the variable is set (a pod's
``terminationGracePeriodSeconds`` / Slurm's ``--signal`` lead time should cover it). A second signal to the
agent while it waits makes it signal the ranks again, which then abort at once.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

DEFAULT_SHUTDOWN_TIMEOUT_S = 1800


def main(argv: Optional[list[str]] = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(DEFAULT_SHUTDOWN_TIMEOUT_S))
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        # torch.distributed.run.main minus its @record wrapper, which would log the signal as a failure
        run(args)
    except SignalException as exc:
        code = 128 + int(exc.sigval)
        print(
            f"torchrun agent: {exc.sigval.name} received; the ranks were signalled and have stopped; exit code {code}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(code)


if __name__ == "__main__":
    main()
