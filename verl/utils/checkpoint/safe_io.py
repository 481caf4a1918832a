"""Checkpoint files that load without running code: plain-data ``.pt`` files and a DCP reader that unpickles nothing.

Checkpoints travel between people and clusters, so nothing read at resume may execute code. Small state
files (the driver's ``data.pt``, each rank's ``extra_state_*.pt``) hold only tensors and plain data (dict,
list, tuple, str, int, float, bool, None): ``save_state`` converts numpy arrays to tagged plain data and
refuses anything else at save time, ``load_state`` reads with ``torch.load(weights_only=True)``. Files
written before this format (numpy arrays pickled in RNG states) still load: their pickled globals are
listed first, and only numpy's array reconstruction is admitted. Any other pickled object is refused
with one line naming the file. DCP's own ``.metadata`` is a pickle and its default planner
``torch.load``s non-tensor items with ``weights_only=False``; ``SafeFileSystemReader`` and
``SafeLoadPlanner`` replace both with restricted loaders.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import numpy as np
import torch

_NDARRAY_TAG = "__ndarray__"


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file holds a pickled object the safe loaders do not admit."""


# ---------------------------------------------------------------------- plain data
def to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` with numpy arrays/scalars turned into plain data; raises TypeError naming any other object."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.Size)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError(f"{where} is a numpy object array; checkpoint state must be tensors and plain data")
        return {_NDARRAY_TAG: str(obj.dtype), "shape": list(obj.shape), "data": obj.ravel().tolist()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError(f"{where} has a key of type {type(k).__name__}; keys must be str/int/float/bool")
            out[k] = to_plain(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, list):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; checkpoint state must be tensors "
        f"and plain data (dict, list, tuple, str, int, float, bool, None, numpy arrays)"
    )


def from_plain(obj: Any) -> Any:
    """Inverse of ``to_plain``: tagged dicts become numpy arrays again."""
    if isinstance(obj, dict):
        if _NDARRAY_TAG in obj and set(obj) == {_NDARRAY_TAG, "shape", "data"}:
            return np.asarray(obj["data"], dtype=np.dtype(obj[_NDARRAY_TAG])).reshape(obj["shape"])
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    return obj


def save_state(path: str, state: Any) -> None:
    """``torch.save`` of ``to_plain(state)`` with fsync; a non-plain object fails here, not at resume."""
    plain = to_plain(state, os.path.basename(path))
    with open(path, "wb") as f:
        torch.save(plain, f)
        f.flush()
        os.fsync(f.fileno())


def _legacy_numpy_globals() -> list:
    """numpy's array reconstruction: what this project's pre-safe checkpoints pickled (RNG key arrays)."""
    allowed = [np.ndarray, np.dtype]
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    allowed.append(_reconstruct)
    allowed += [
        type(np.dtype(t))
        for t in (np.uint32, np.uint64, np.int64, np.int32, np.float64, np.float32, np.uint8, np.bool_)
    ]
    return allowed


def _global_name(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def load_state(path: str) -> Any:
    """Load a state file written by ``save_state`` (or by this project's older ``torch.save``) without
    unpickling arbitrary objects; raises ``UnsafeCheckpointError`` naming the file and the refused global."""
    try:
        return from_plain(torch.load(path, map_location="cpu", weights_only=True))
    except pickle.UnpicklingError:
        pass
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as exc:  # noqa: BLE001 - not a torch zip file at all: name the file, keep the reason
        raise UnsafeCheckpointError(f"{path}: not a loadable checkpoint file ({type(exc).__name__}: {exc})") from None
    allowed = _legacy_numpy_globals()
    names = {_global_name(g) for g in allowed}
    # numpy 2 pickles under numpy._core, numpy 1 under numpy.core; both spellings name the same function.
    names |= {n.replace("numpy._core", "numpy.core") for n in names} | {
        n.replace("numpy.core", "numpy._core") for n in names
    }
    refused = sorted(g for g in found if g not in names)
    if refused:
        raise UnsafeCheckpointError(
            f"{path}: refused to load: it pickles {', '.join(refused)} (checkpoints may hold only tensors and plain "
            f"data; a file from an untrusted source must not be resumed)"
        )
    with torch.serialization.safe_globals(allowed):
        return from_plain(torch.load(path, map_location="cpu", weights_only=True))


# ---------------------------------------------------------------------- DCP
class _MetadataUnpickler(pickle.Unpickler):
    """Admits only the classes DCP's ``.metadata`` is made of."""

    def find_class(self, module: str, name: str):
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in {
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict"),
            ("torch.distributed.checkpoint.planner", "LoadItemType"),
            ("torch.distributed.checkpoint.planner", "WriteItemType"),
        }:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(f"refused to unpickle {module}.{name}")


def load_dcp_metadata(path: str):
    """Read a DCP ``.metadata`` file with the restricted unpickler; errors name the file."""
    with open(path, "rb") as f:
        try:
            return _MetadataUnpickler(f).load()
        except UnsafeCheckpointError as exc:
            raise UnsafeCheckpointError(
                f"{path}: {exc} (DCP metadata may hold only checkpoint layout classes)"
            ) from None
        except (
            pickle.UnpicklingError,
            EOFError,
            AttributeError,
            ImportError,
            IndexError,
            TypeError,
            ValueError,
        ) as exc:
            raise UnsafeCheckpointError(f"{path}: unreadable DCP metadata ({type(exc).__name__}: {exc})") from None


def safe_reader(checkpoint_dir: str):
    """A ``FileSystemReader`` for ``checkpoint_dir`` whose metadata read unpickles nothing unexpected."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            metadata = load_dcp_metadata(str(self._get_metadata_path(rank)))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(checkpoint_dir)


def safe_planner():
    """DCP's default load planner with non-tensor items (optimizer hyper-parameters) read ``weights_only``."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UnsafeCheckpointError(f"DCP item {read_item.dest_index.fqn!r}: refused to load ({exc})") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner()


def dcp_load(state_dict: dict, checkpoint_dir: str, **kwargs) -> None:
    """``dcp.load`` through the safe reader and planner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    meta_path = os.path.join(checkpoint_dir, ".metadata")
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"{meta_path} is missing")
    load_dcp_metadata(meta_path)  # refuses a planted pickle with a clean one-line error before DCP starts
    try:
        dcp.load(state_dict, storage_reader=safe_reader(checkpoint_dir), planner=safe_planner(), **kwargs)
    except CheckpointException as exc:  # a BaseException carrying each rank's traceback: keep the last line
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise RuntimeError(
            f"{checkpoint_dir}: DCP load failed ({lines[-1] if lines else type(exc).__name__}); "
            f"a shard is truncated or does not match .metadata"
        ) from None
