"""The CUDA-graph pool term of the memory plan (luffy_pool/memory_plan/graph_pool.py), by hand."""

from types import SimpleNamespace

from luffy_pool.memory_plan.graph_pool import MiB, default_capture_sizes, engine_graph_pool_bytes, graph_pool_bytes


def test_capture_sizes_follow_vllms_default_list():
    # LUFFY's YAML: max_num_seqs 1024, 8192 batched tokens -> min(2048, 512, 8192) = 512; 1024 lies outside it.
    sizes = default_capture_sizes(1024, 8192)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-3:] == [480, 496, 512]
    assert len(sizes) == 3 + 31 + 17  # [1, 2, 4], 8..248 step 8, 256..512 step 16
    # max_num_seqs 100: largest min(200, 512) = 200, and 100 (a full decode batch) is appended
    assert default_capture_sizes(100, 8192) == sorted([1, 2, 4] + list(range(8, 201, 8)) + [100])
    # largest min(2 x 3, 512) = 6, capped by a 5-token budget, which is captured itself, and so is a full decode
    # batch of 3 sequences
    assert default_capture_sizes(3, 5) == [1, 2, 3, 4, 5]


def test_pool_is_the_largest_batchs_working_set_plus_one_mib_per_further_graph():
    # hidden 8, q 8, kv 4, intermediate 16, bf16, TP 2; max_num_seqs 3, 5 batched tokens -> sizes [1, 2, 3, 4, 5]
    got = graph_pool_bytes(
        hidden_size=8,
        q_size=8,
        kv_size=4,
        intermediate_size=16,
        dtype_bytes=2,
        tp=2,
        max_num_seqs=3,
        max_num_batched_tokens=5,
    )
    first = 5 * 2 * (2 * 8 + (8 + 2 * 4) // 2 + 2 * 16 // 2)  # 5 tokens x 2 bytes x 40 = 400
    piecewise, full = 5, 3  # every size; pure-decode sizes <= 3 sequences: 1, 2, 3
    assert got == first + MiB * ((piecewise - 1) + (full - 1)) == 400 + 6 * MiB


def test_eager_engine_has_no_pool():
    shape = SimpleNamespace(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=16
    )
    inputs = SimpleNamespace(enforce_eager=True, rollout_dtype_bytes=2, tp=2, max_num_seqs=3, max_num_batched_tokens=5)
    assert engine_graph_pool_bytes(inputs, shape) == 0
    assert engine_graph_pool_bytes(SimpleNamespace(**{**vars(inputs), "enforce_eager": False}), shape) == 400 + 6 * MiB
