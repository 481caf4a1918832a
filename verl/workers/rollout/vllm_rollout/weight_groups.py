"""Re-cut a stream of weight buckets so each bucket brings whole vLLM modules.

A push is one in-place layer-wise reload (worker_extension.py): a fused module (``qkv_proj`` = q/k/v + biases,
``gate_up_proj``) is processed once all its tensors have arrived, in whichever bucket. Regrouping by decoder layer
still matters: a layer split over two buckets would keep the first bucket's tensors buffered, with its
materialised copy, until the second arrives, instead of being processed and freed within one call. (When every
bucket was a reload of its own, a split layer was corrupted: logprob error 2.6 with one tensor per call, NaN when
q_proj and k_proj came in different calls; <3e-6 with whole decoder layers.) Tensors are grouped by decoder layer
(``...layers.<i>``) or, outside the layer stack, by parent module; a group still open at the end of a bucket is
carried over to the next one, and a group seen again after it was sent is refused.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

import torch

# Matches the layer stack of every HF decoder family in use (model.layers.N, transformer.h.N,
# model.decoder.layers.N, gpt_neox.layers.N, ...).
_LAYER_PREFIX = re.compile(r"^(.*?\.(?:layers|h|blocks|block)\.\d+)\.")


def weight_group_key(name: str) -> str:
    """The unit that must be reloaded in one call: its decoder layer, else its parent module."""
    match = _LAYER_PREFIX.match(name)
    if match:
        return match.group(1)
    return name.rpartition(".")[0] or name


class LayerAlignedRegrouper:
    """Accumulates pushed tensors and releases only whole groups (see module docstring).

    ``add`` returns the tensors that are safe to send now; ``flush`` returns the last open group at
    the end of a sync. Groups must arrive contiguously: a key seen again after its group was released
    raises, because sending it would reload that layer with part of its weights.
    """

    def __init__(self) -> None:
        self._open_key: Optional[str] = None
        self._open: list[tuple[str, torch.Tensor]] = []
        self._released_keys: set[str] = set()
        self.names_seen: set[str] = set()

    def add(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        ready: list[tuple[str, torch.Tensor]] = []
        for name, tensor in named_tensors:
            if name in self.names_seen:
                raise ValueError(f"weight {name!r} pushed twice in one sync")
            key = weight_group_key(name)
            if key != self._open_key:
                self._close_open_group(ready)
                if key in self._released_keys:
                    raise ValueError(
                        f"weight {name!r} arrived after the other tensors of {key!r} were already sent; "
                        "push the tensors of one layer contiguously (state_dict order)"
                    )
                self._open_key = key
            self._open.append((name, tensor))
            self.names_seen.add(name)
        return ready

    def flush(self) -> list[tuple[str, torch.Tensor]]:
        ready: list[tuple[str, torch.Tensor]] = []
        self._close_open_group(ready)
        return ready

    def reset(self) -> None:
        self.__init__()

    def _close_open_group(self, ready: list[tuple[str, torch.Tensor]]) -> None:
        if self._open_key is not None:
            ready.extend(self._open)
            self._released_keys.add(self._open_key)
        self._open_key = None
        self._open = []
