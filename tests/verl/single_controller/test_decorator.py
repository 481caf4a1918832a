"""Dispatch and collect functions of every mode, checked without Ray on a stand-in group, plus the
checks ``@register`` makes when a worker class is defined."""

from __future__ import annotations

import types

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, Execute, get_dispatch_fns, get_registered_method, register

GROUP = types.SimpleNamespace(world_size=2)


def rows(*values: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.tensor(values)}, meta_info={"tag": "t"})


def test_one_to_all_copies_arguments_to_every_rank():
    dispatch, collect = get_dispatch_fns(Dispatch.ONE_TO_ALL)
    args, kwargs = dispatch(GROUP, 1, "a", flag=True)
    assert args == ([1, 1], ["a", "a"]) and kwargs == {"flag": [True, True]}
    assert collect(GROUP, ["r0", "r1"]) == ["r0", "r1"]


def test_all_to_all_splits_per_rank_lists_and_broadcasts_the_rest():
    dispatch, collect = get_dispatch_fns(Dispatch.ALL_TO_ALL)
    assert dispatch(GROUP, [1, 2], y=("a", "b")) == (([1, 2],), {"y": ["a", "b"]})
    assert dispatch(GROUP, [1, 2], 3) == (([[1, 2], [1, 2]], [3, 3]), {})
    assert collect(GROUP, [5, 6]) == [5, 6]


def test_dp_compute_requires_one_entry_per_rank():
    dispatch, collect = get_dispatch_fns(Dispatch.DP_COMPUTE)
    assert dispatch(GROUP, [1, 2], k=[3, 4]) == (([1, 2],), {"k": [3, 4]})
    with pytest.raises(ValueError, match="argument 0 to be a list with one entry per rank \\(2\\), got a list of len"):
        dispatch(GROUP, [1, 2, 3])
    with pytest.raises(ValueError, match="expected 2 outputs"):
        collect(GROUP, [1])


def test_dp_compute_proto_chunks_and_concatenates():
    dispatch, collect = get_dispatch_fns(Dispatch.DP_COMPUTE_PROTO)
    (chunks,), kwargs = dispatch(GROUP, rows(1, 2, 3, 4))
    assert [c.batch["x"].tolist() for c in chunks] == [[1, 2], [3, 4]] and kwargs == {}
    merged = collect(GROUP, [rows(10, 20), rows(30, 40)])
    assert merged.batch["x"].tolist() == [10, 20, 30, 40]
    with pytest.raises(TypeError, match="argument 0 to be a DataProto or DataProtoFuture, got int"):
        dispatch(GROUP, 7)
    with pytest.raises(TypeError, match="rank 1 returned dict"):
        collect(GROUP, [rows(1), {"x": 1}])


def test_dp_compute_proto_with_func_broadcasts_the_function():
    dispatch, collect = get_dispatch_fns(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)

    def double(worker, data):
        return data

    (funcs, chunks), _ = dispatch(GROUP, double, rows(1, 2))
    assert funcs == [double, double]
    assert [c.batch["x"].tolist() for c in chunks] == [[1], [2]]
    with pytest.raises(TypeError, match="needs a function"):
        dispatch(GROUP, rows(1, 2))


def test_dp_compute_metric_chunks_and_returns_the_raw_list():
    dispatch, collect = get_dispatch_fns(Dispatch.DP_COMPUTE_METRIC)
    (chunks,), _ = dispatch(GROUP, rows(1, 2))
    assert len(chunks) == 2
    assert collect(GROUP, [{"loss": 1.0}, {"loss": 3.0}]) == [{"loss": 1.0}, {"loss": 3.0}]


def test_register_records_modes_and_rank_zero_implies_rank_zero_execution():
    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def on_rank_zero(self):
        return 1

    spec = get_registered_method(on_rank_zero)
    assert spec.dispatch_mode is Dispatch.RANK_ZERO and spec.execute_mode is Execute.RANK_ZERO and spec.blocking
    assert get_registered_method(lambda: 0) is None


def test_register_rejects_splitting_mode_on_rank_zero_only():
    with pytest.raises(ValueError, match="cannot run with Execute.RANK_ZERO"):
        register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO)


def test_register_accepts_custom_dispatch_dict_and_rejects_incomplete_one():
    custom = {"dispatch_fn": lambda g, *a, **k: (a, k), "collect_fn": lambda g, o: o}
    assert get_dispatch_fns(custom) == (custom["dispatch_fn"], custom["collect_fn"])
    with pytest.raises(ValueError, match="missing \\['collect_fn'\\]"):
        register(dispatch_mode={"dispatch_fn": custom["dispatch_fn"]})
