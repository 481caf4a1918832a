"""LUFFY's module path ``verl.mix_src.rl_dataset_with_target``: the training dataset with off-policy targets
(``luffy_pool.rollout.rl_dataset_with_target``), its collate function, the resumable sampler
(``verl.utils.dataset.sampler``) and LUFFY's ``BufferedDataLoader``."""

from __future__ import annotations

from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget, collate_fn
from verl.utils.dataset.sampler import ResumableRandomSampler

__all__ = ["BufferedDataLoader", "RLHFDatasetWithTarget", "ResumableRandomSampler", "collate_fn"]


class BufferedDataLoader:
    """A dataloader plus a ``DataProto`` buffer of leftover rows (LUFFY's accuracy-rebatching helper).

    ``start_new_epoch`` / ``get_next_batch`` iterate the wrapped loader; ``add_to_buffer`` appends rows and
    ``get_from_buffer(count, dp_size)`` takes the first ``count`` (cut to a multiple of ``dp_size`` when fewer
    are buffered).
    """

    def __init__(self, dataloader):
        self.dataloader = dataloader
        self.batch_size = dataloader.batch_size
        self.buffer = None
        self.dataloader_iter = None

    def start_new_epoch(self) -> None:
        self.dataloader_iter = iter(self.dataloader)

    def get_next_batch(self):
        if self.dataloader_iter is None:
            self.start_new_epoch()
        return next(self.dataloader_iter)

    def __len__(self) -> int:
        return len(self.dataloader)

    def add_to_buffer(self, samples) -> None:
        from verl.protocol import DataProto

        self.buffer = (
            samples if self.buffer is None or len(self.buffer) == 0 else DataProto.concat([self.buffer, samples])
        )

    def buffer_size(self) -> int:
        return 0 if self.buffer is None else len(self.buffer)

    def get_from_buffer(self, count: int, dp_size: int):
        size = self.buffer_size()
        if count > size:
            count = (size // dp_size) * dp_size
        taken = self.buffer.slice(0, count)
        self.buffer = self.buffer.slice(count, size)
        return taken
