"""setup_logging drops the named third-party lines and nothing else."""

from __future__ import annotations

import logging
import warnings

from verl.utils.logging_setup import setup_logging


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_vllm_reset_prefix_cache_line_is_dropped_and_other_lines_kept():
    parent = logging.getLogger("vllm")
    handler = _Collect()
    parent.addHandler(handler)  # as vLLM's own handler on its root logger
    old_level, parent.level = parent.level, logging.INFO
    try:
        setup_logging()
        setup_logging()  # idempotent: one filter, not two
        block_pool = logging.getLogger("vllm.v1.core.block_pool")
        block_pool.info("Successfully reset prefix cache")
        logging.getLogger("vllm.entrypoints.x").info("Resetting prefix cache...")
        block_pool.warning("KV cache is almost full")
        logging.getLogger("vllm.engine").info("engine started")
    finally:
        parent.removeHandler(handler)
        parent.level = old_level
    assert handler.lines == ["KV cache is almost full", "engine started"]
    patterns = [f.regex.pattern for f in block_pool.filters]
    assert len(patterns) == len(set(patterns))  # idempotent: no filter twice


def test_only_the_named_deprecation_warnings_are_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        setup_logging()
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning)
        warnings.warn("something of ours is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["something of ours is deprecated"]


def test_vllm_cpu_start_up_warnings_are_dropped_and_real_warnings_kept():
    parent = logging.getLogger("vllm")
    handler = _Collect()
    parent.addHandler(handler)
    try:
        setup_logging()
        log = logging.getLogger("vllm.v1.worker.cpu_worker")
        log.warning("libtcmalloc is not found in LD_PRELOAD. For best performance, please follow ...")
        log.warning("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
        logging.getLogger("vllm.config.vllm").warning("Enforce eager set, disabling torch.compile, CUDAGraphs")
        log.warning("KV cache is almost full")
    finally:
        parent.removeHandler(handler)
    assert handler.lines == ["KV cache is almost full"]


def test_filters_survive_vllm_replacing_its_handlers():
    child = logging.getLogger("vllm.engine.arg_utils_probe")  # exists before setup_logging, as after `import vllm`
    setup_logging()
    parent = logging.getLogger("vllm")
    handler = _Collect()
    parent.addHandler(handler)  # a handler vLLM's dictConfig installs later, without our filters
    try:
        child.warning("The global random seed is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False")
        child.warning("a real warning")
    finally:
        parent.removeHandler(handler)
    assert handler.lines == ["a real warning"]
