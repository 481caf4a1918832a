"""DataProto operations on hand-made batches: construction, selection, union, chunk/concat, repeat,
reorder, indexing, iteration, pickling and padding, including the errors bad input must raise."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProto, DataProtoItem, PerPart, pad_dataproto_to_divisor, unpad_dataproto


def make_batch(n: int = 4) -> DataProto:
    """Row i: ids = [i, 10 + i], score = i / 2, uid = f"u{i}", meta temperature 0.7."""
    return DataProto.from_dict(
        tensors={
            "ids": torch.stack([torch.arange(n), torch.arange(n) + 10], dim=1),
            "score": torch.arange(n, dtype=torch.float32) / 2,
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)]},
        meta_info={"temperature": 0.7},
    )


# ---------------------------------------------------------------------------- construction
def test_from_dict_builds_rows_and_object_arrays():
    data = make_batch(3)
    assert len(data) == 3
    assert data.batch["ids"].tolist() == [[0, 10], [1, 11], [2, 12]]
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"]
    assert data.meta_info == {"temperature": 0.7}


def test_from_dict_keeps_equal_length_lists_as_one_object_per_row():
    data = DataProto.from_dict(non_tensors={"target": [[1, 2], [3, 4]]})
    assert data.non_tensor_batch["target"].shape == (2,)
    assert data.non_tensor_batch["target"][1] == [3, 4]
    assert data.batch is None and len(data) == 2


def test_from_single_dict_splits_tensors_from_arrays_and_lists():
    data = DataProto.from_single_dict(
        {"x": torch.zeros(2, 3), "a": np.array(["p", "q"], dtype=object), "b": [{"k": 1}, {"k": 2}]},
        meta_info={"step": 5},
    )
    assert list(data.batch.keys()) == ["x"]
    assert sorted(data.non_tensor_batch) == ["a", "b"]
    assert data.non_tensor_batch["b"][1] == {"k": 2}
    assert data.meta_info["step"] == 5


def test_from_single_dict_rejects_scalar_value_naming_key():
    with pytest.raises(TypeError, match="'lr'"):
        DataProto.from_single_dict({"x": torch.zeros(2), "lr": 0.1})


def test_mismatched_tensor_rows_name_both_keys():
    with pytest.raises(ValueError, match="'b' has 3 rows but 'a' has 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2), "b": torch.zeros(3)})


def test_mismatched_non_tensor_rows_name_the_key():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 3 rows but batch has 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"uid": ["x", "y", "z"]})


def test_check_consistency_rejects_list_in_non_tensor_batch():
    with pytest.raises(TypeError, match="non_tensor_batch\\['uid'\\] must be a numpy array"):
        DataProto(batch=None, non_tensor_batch={"uid": ["a"]})


def test_check_consistency_rejects_two_batch_dims():
    with pytest.raises(ValueError, match="exactly one batch dimension"):
        DataProto(batch=TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))


# ---------------------------------------------------------------------------- select / pop / rename
def test_select_keeps_only_named_keys_and_shares_tensors():
    data = make_batch()
    picked = data.select(batch_keys=["ids"], non_tensor_batch_keys=[], meta_info_keys=["temperature"])
    assert list(picked.batch.keys()) == ["ids"]
    assert picked.non_tensor_batch == {}
    assert picked.meta_info == {"temperature": 0.7}
    picked.batch["ids"][0, 0] = 99
    assert data.batch["ids"][0, 0] == 99  # no deepcopy: same storage


def test_select_deepcopy_detaches_data():
    data = make_batch()
    copied = data.select(deepcopy=True)
    copied.batch["ids"][0, 0] = 99
    copied.non_tensor_batch["uid"][0] = "changed"
    assert data.batch["ids"][0, 0] == 0 and data.non_tensor_batch["uid"][0] == "u0"


def test_select_missing_key_raises_key_error_naming_it():
    with pytest.raises(KeyError, match="'nope'"):
        make_batch().select(batch_keys=["nope"])


def test_pop_removes_keys_and_returns_them():
    data = make_batch()
    popped = data.pop(batch_keys=["score"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(data.batch.keys()) == ["ids"] and data.non_tensor_batch == {} and data.meta_info == {}
    assert popped.batch["score"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert popped.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert popped.meta_info == {"temperature": 0.7}


def test_pop_missing_key_leaves_data_untouched():
    data = make_batch()
    with pytest.raises(KeyError, match="'missing'"):
        data.pop(batch_keys=["ids", "missing"])
    assert sorted(data.batch.keys()) == ["ids", "score"]


def test_rename_batch_key():
    data = make_batch().rename("score", "reward")
    assert sorted(data.batch.keys()) == ["ids", "reward"]
    with pytest.raises(ValueError, match="2 old keys but 1 new"):
        data.rename(["ids", "reward"], ["x"])


# ---------------------------------------------------------------------------- union
def test_union_merges_new_keys_and_meta():
    data = make_batch()
    extra = DataProto.from_dict(
        tensors={"adv": torch.tensor([1.0, -1.0, 0.0, 2.0])},
        non_tensors={"src": ["on", "off", "on", "on"]},
        meta_info={"temperature": 0.7, "n": 8},
    )
    merged = data.union(extra)
    assert merged is data
    assert sorted(data.batch.keys()) == ["adv", "ids", "score"]
    assert data.non_tensor_batch["src"].tolist() == ["on", "off", "on", "on"]
    assert data.meta_info == {"temperature": 0.7, "n": 8}


def test_union_accepts_equal_shared_key():
    data = make_batch()
    data.union(make_batch().select(batch_keys=["ids"]))
    assert data.batch["ids"][3].tolist() == [3, 13]


def test_union_conflicting_tensor_names_key():
    other = make_batch()
    other.batch["score"][2] = 100.0
    with pytest.raises(ValueError, match="tensor key 'score'"):
        make_batch().union(other)


def test_union_conflicting_non_tensor_and_meta_name_key():
    other = make_batch()
    other.non_tensor_batch["uid"][0] = "zz"
    with pytest.raises(ValueError, match="non-tensor key 'uid'"):
        make_batch().union(other)
    other = make_batch()
    other.meta_info["temperature"] = 1.0
    with pytest.raises(ValueError, match="meta_info key 'temperature'"):
        make_batch().union(other)


def test_union_different_row_counts_fails():
    with pytest.raises(ValueError, match="different row counts \\(4 vs 2\\)"):
        make_batch(4).union(make_batch(2))


# ---------------------------------------------------------------------------- chunk / split / concat
def test_chunk_then_concat_round_trips():
    data = make_batch(6)
    parts = data.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert parts[1].batch["ids"].tolist() == [[2, 12], [3, 13]]
    assert parts[2].non_tensor_batch["uid"].tolist() == ["u4", "u5"]
    assert all(p.meta_info == {"temperature": 0.7} for p in parts)
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["ids"], data.batch["ids"])
    assert back.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()


def test_chunk_requires_divisibility():
    with pytest.raises(ValueError, match="5 rows cannot be split into 2 equal chunks"):
        make_batch(5).chunk(2)


def test_split_last_piece_may_be_short():
    pieces = make_batch(5).split(2)
    assert [len(p) for p in pieces] == [2, 2, 1]
    assert pieces[2].batch["score"].tolist() == [2.0]


def test_concat_joins_per_part_meta_lists():
    # Each rank reports its own worker timings; the concatenated batch keeps every rank's entry, in order.
    # Any key may be per-part (no name is special); a plain list keeps the first part's value.
    parts = [make_batch(2) for _ in range(3)]
    for rank, part in enumerate(parts):
        part.meta_info["rollout_stats"] = PerPart([{"rank": rank}])
        part.meta_info["my_timings"] = PerPart([rank * 1.5])
        part.meta_info["plain"] = [rank]
    merged = DataProto.concat(parts)
    assert merged.meta_info["rollout_stats"] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert isinstance(merged.meta_info["rollout_stats"], PerPart)
    assert merged.meta_info["my_timings"] == [0.0, 1.5, 3.0] and merged.meta_info["plain"] == [0]
    assert merged.meta_info["temperature"] == 0.7
    assert parts[0].meta_info["rollout_stats"] == [{"rank": 0}]  # inputs untouched


def test_concat_takes_meta_from_first_and_checks_keys():
    a, b = make_batch(2), make_batch(2)
    b.meta_info["temperature"] = 1.0
    assert DataProto.concat([a, b]).meta_info == {"temperature": 0.7}
    c = make_batch(2)
    c.pop(batch_keys=["score"])
    with pytest.raises(ValueError, match="item 1 has tensor keys \\['ids'\\]"):
        DataProto.concat([a, c])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


# ---------------------------------------------------------------------------- repeat / reorder / index
def test_repeat_interleave_groups_copies_of_each_row():
    data = make_batch(2).repeat(repeat_times=3, interleave=True)
    assert data.batch["ids"][:, 0].tolist() == [0, 0, 0, 1, 1, 1]
    assert data.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]


def test_repeat_without_interleave_tiles_the_batch():
    data = make_batch(2).repeat(repeat_times=3, interleave=False)
    assert data.batch["ids"][:, 0].tolist() == [0, 1, 0, 1, 0, 1]
    assert data.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1", "u0", "u1"]


def test_reorder_permutes_in_place():
    data = make_batch(4)
    data.reorder(torch.tensor([3, 1, 0, 2]))
    assert data.batch["score"].tolist() == [1.5, 0.5, 0.0, 1.0]
    assert data.non_tensor_batch["uid"].tolist() == ["u3", "u1", "u0", "u2"]
    with pytest.raises(ValueError, match="needs 4 indices"):
        data.reorder(torch.tensor([0, 1]))


def test_int_index_returns_item_and_slice_returns_dataproto():
    data = make_batch(4)
    item = data[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["ids"].tolist() == [2, 12] and item.non_tensor_batch["uid"] == "u2"
    assert data[-1].non_tensor_batch["uid"] == "u3"
    part = data[1:3]
    assert isinstance(part, DataProto) and part.batch["score"].tolist() == [0.5, 1.0]
    with pytest.raises(IndexError, match="row 4 is out of range"):
        data[4]


def test_index_arrays_and_masks_select_rows():
    data = make_batch(4)
    assert data[np.array([3, 0])].non_tensor_batch["uid"].tolist() == ["u3", "u0"]
    assert data[torch.tensor([1, 1])].batch["score"].tolist() == [0.5, 0.5]
    assert data[torch.tensor([True, False, False, True])].non_tensor_batch["uid"].tolist() == ["u0", "u3"]
    with pytest.raises(ValueError, match="mask has 2 entries but the DataProto has 4 rows"):
        data[torch.tensor([True, False])]


# ---------------------------------------------------------------------------- iterate / device
def test_make_iterator_yields_mini_batches_per_epoch():
    data = make_batch(4)
    batches = list(data.make_iterator(mini_batch_size=2, epochs=2))
    assert [b.non_tensor_batch["uid"].tolist() for b in batches] == [["u0", "u1"], ["u2", "u3"]] * 2
    assert all(b.meta_info == {"temperature": 0.7} for b in batches)


def test_make_iterator_shuffle_is_seeded_and_covers_every_row():
    data = make_batch(6)
    first = [
        b.non_tensor_batch["uid"].tolist()
        for b in data.make_iterator(3, 1, seed=1, dataloader_kwargs={"shuffle": True})
    ]
    again = [
        b.non_tensor_batch["uid"].tolist()
        for b in data.make_iterator(3, 1, seed=1, dataloader_kwargs={"shuffle": True})
    ]
    assert first == again
    assert sorted(first[0] + first[1]) == [f"u{i}" for i in range(6)]


def test_make_iterator_rejects_indivisible_mini_batch():
    with pytest.raises(ValueError, match="not divisible by mini_batch_size=3"):
        make_batch(4).make_iterator(mini_batch_size=3, epochs=1)


def test_to_moves_tensors():
    data = make_batch(2).to("cpu")
    assert data.batch.device == torch.device("cpu")
    assert data.batch["ids"].device.type == "cpu"


# ---------------------------------------------------------------------------- pickling / padding
def test_pickle_round_trip_keeps_everything():
    data = make_batch(3)
    back = pickle.loads(pickle.dumps(data))
    assert torch.equal(back.batch["ids"], data.batch["ids"])
    assert back.batch["score"].dtype == torch.float32
    assert back.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"]
    assert back.meta_info == {"temperature": 0.7}
    assert pickle.loads(pickle.dumps(DataProto.from_dict(non_tensors={"a": [1]}))).batch is None


def test_pickle_keeps_dtypes_and_owns_read_only_buffers():
    import warnings

    data = DataProto.from_dict(
        tensors={
            "bf16": torch.tensor([[1.5, -2.25]], dtype=torch.bfloat16),  # numpy has no bf16: travels as its int16 bits
            "half": torch.tensor([[0.5, 3.0]], dtype=torch.float16),
            "flag": torch.tensor([[True, False]]),
        }
    )
    buffers = []  # out-of-band and read-only, as in Ray's object store
    blob = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    assert buffers, "numpy-backed tensors travel out of band"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns on a non-writable array
        back = pickle.loads(blob, buffers=[memoryview(b.raw()).toreadonly() for b in buffers])
    for key in ("bf16", "half", "flag"):
        assert back.batch[key].dtype == data.batch[key].dtype, key
        assert torch.equal(back.batch[key], data.batch[key]), key
    back.batch["half"] += 1  # owns its memory: writable
    assert back.batch["half"].tolist() == [[1.5, 4.0]] and data.batch["half"].tolist() == [[0.5, 3.0]]
    # a dtype numpy lacks, and a tensor that needs grad, keep torch's own pickling
    from verl.protocol_values import tensor_state

    assert tensor_state(torch.zeros(2, dtype=torch.float8_e4m3fn))[0] == "torch"
    again = pickle.loads(pickle.dumps(DataProto.from_dict(tensors={"grad": torch.ones(1, 2, requires_grad=True)})))
    assert again.batch["grad"].requires_grad


def test_pickled_chunk_carries_only_its_rows():
    data = DataProto.from_dict(tensors={"x": torch.zeros(64, 1024)})
    whole = len(pickle.dumps(data))
    quarter = len(pickle.dumps(data.chunk(4)[1]))
    # 64x1024 float32 = 256 KiB; one chunk must not drag the other 192 KiB of its base storage along.
    assert quarter < whole / 3


def test_pad_repeats_leading_rows_and_unpad_restores():
    data = make_batch(5)
    padded, pad = pad_dataproto_to_divisor(data, 4)
    assert pad == 3 and len(padded) == 8
    assert padded.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3", "u4", "u0", "u1", "u2"]
    restored = unpad_dataproto(padded, pad)
    assert restored.batch["ids"].tolist() == data.batch["ids"].tolist()


def test_pad_larger_than_batch_cycles_rows():
    padded, pad = pad_dataproto_to_divisor(make_batch(2), 7)
    assert pad == 5
    assert padded.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1", "u0", "u1", "u0"]


def test_pad_when_divisible_is_a_no_op():
    data = make_batch(4)
    padded, pad = pad_dataproto_to_divisor(data, 2)
    assert pad == 0 and padded is data
    assert unpad_dataproto(data, 0) is data
