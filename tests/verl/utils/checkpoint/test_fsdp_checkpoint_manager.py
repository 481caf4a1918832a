"""DCP checkpoints of an FSDP2 tiny model on 2 gloo ranks: exact round trip, 2 -> 1 rank resharding,
HF export at save time, and the per-rank extra state (scheduler, RNG, actor extras)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from verl.utils.checkpoint import layout
from tests.helpers.distributed_testing import run_gloo_ranks

STEPS_BEFORE_SAVE = 2
LR = 1e-2


def _init_group(rank: int, world_size: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return init_device_mesh("cpu", (world_size,))


def build_sharded_actor(model_dir: str, mesh, seed: int):
    """Tiny Qwen2 (re-initialised from ``seed``) sharded per layer + root, AdamW and a decaying LR."""
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(model_dir), dtype=torch.float32, attn_implementation="sdpa"
    )
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0 / (1 + s))
    return model, optim, sched


def train_step(model, optim, sched, rank: int, world_size: int, step: int) -> None:
    """One AdamW step on a fixed global batch of 4 rows; each rank takes its contiguous share."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(3, model.config.vocab_size, (4, 12), generator=g)
    rows = ids.chunk(world_size)[rank]
    loss = model(input_ids=rows, labels=rows).loss
    loss.backward()
    optim.step()
    sched.step()
    optim.zero_grad(set_to_none=True)


def full_states(model, optim):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optim, options=opts)
    # On one rank the "full" tensors are the live parameters themselves: snapshot them.
    clone = lambda v: v.detach().clone() if torch.is_tensor(v) else v  # noqa: E731
    if "state" in optim_sd:  # ranks other than 0 get empty dicts
        optim_sd["state"] = {p: {k: clone(v) for k, v in st.items()} for p, st in optim_sd["state"].items()}
    return {k: clone(v) for k, v in model_sd.items()}, optim_sd


class Counter:
    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _save_then_reload(rank, world_size, port, model_dir, ckpt):
    """2 ranks: train, save (with HF weights), keep training as reference; a fresh model loads and matches."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from verl.utils.checkpoint import FSDPCheckpointManager

    mesh = _init_group(rank, world_size)
    model, optim, sched = build_sharded_actor(model_dir, mesh, seed=0)
    for step in range(STEPS_BEFORE_SAVE):
        train_step(model, optim, sched, rank, world_size, step)
    counter = Counter()
    counter.value = 7 + rank
    tok = AutoTokenizer.from_pretrained(model_dir)
    mgr = FSDPCheckpointManager(model, optim, sched, tokenizer=tok, extra_states={"counter": counter})
    stats = mgr.save_checkpoint(ckpt, global_step=STEPS_BEFORE_SAVE, save_hf=True)
    saved_model, saved_optim = full_states(model, optim)
    draw_after_save = torch.rand(3)
    train_step(model, optim, sched, rank, world_size, STEPS_BEFORE_SAVE)
    next_model, _ = full_states(model, optim)

    fresh, fresh_optim, fresh_sched = build_sharded_actor(model_dir, mesh, seed=123)
    fresh_counter = Counter()
    torch.rand(5)  # move the RNG so restoring it is observable
    FSDPCheckpointManager(fresh, fresh_optim, fresh_sched, extra_states={"counter": fresh_counter}).load_checkpoint(
        ckpt
    )
    draw_after_load = torch.rand(3)
    loaded_model, loaded_optim = full_states(fresh, fresh_optim)
    lr_loaded = fresh_sched.get_last_lr()[0]
    train_step(fresh, fresh_optim, fresh_sched, rank, world_size, STEPS_BEFORE_SAVE)
    fresh_next, _ = full_states(fresh, fresh_optim)
    result = {
        "draw_equal": torch.equal(draw_after_save, draw_after_load),
        "counter": fresh_counter.value,
        "lr_loaded": lr_loaded,
        "stats": stats,
    }
    if rank == 0:
        result.update(
            saved_model=saved_model,
            saved_optim=saved_optim,
            loaded_model=loaded_model,
            loaded_optim=loaded_optim,
            next_model=next_model,
            fresh_next=fresh_next,
        )
    dist.destroy_process_group()
    return result


def _reload_on_one_rank(rank, world_size, port, model_dir, ckpt):
    import torch.distributed as dist

    from verl.utils.checkpoint import FSDPCheckpointManager

    mesh = _init_group(rank, world_size)
    model, optim, sched = build_sharded_actor(model_dir, mesh, seed=99)
    counter = Counter()
    FSDPCheckpointManager(model, optim, sched, extra_states={"counter": counter}).load_checkpoint(ckpt)
    loaded_model, loaded_optim = full_states(model, optim)
    train_step(model, optim, sched, rank, world_size, STEPS_BEFORE_SAVE)
    next_model, _ = full_states(model, optim)
    dist.destroy_process_group()
    return {
        "loaded_model": loaded_model,
        "loaded_optim": loaded_optim,
        "next_model": next_model,
        "counter": counter.value,
    }


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _optim_tensors(osd: dict) -> dict:
    return {f"{p}/{k}": v.float() for p, st in osd["state"].items() for k, v in st.items() if torch.is_tensor(v)}


@pytest.fixture(scope="module")
def two_rank_run(tiny_model_dir, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("fsdp_ckpt") / "actor")
    r0, r1 = run_gloo_ranks(_save_then_reload, 2, tiny_model_dir, ckpt, timeout_s=600)
    return ckpt, r0, r1


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_two_rank_round_trip_restores_weights_and_adam_state_exactly(two_rank_run):
    _ckpt, r0, _r1 = two_rank_run
    assert _max_diff(r0["saved_model"], r0["loaded_model"]) <= 1e-7
    saved, loaded = _optim_tensors(r0["saved_optim"]), _optim_tensors(r0["loaded_optim"])
    assert len(saved) == 3 * len(r0["saved_model"])  # step, exp_avg, exp_avg_sq per parameter
    assert _max_diff(saved, loaded) <= 1e-7


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_training_after_load_continues_like_uninterrupted(two_rank_run):
    _ckpt, r0, _r1 = two_rank_run
    assert _max_diff(r0["next_model"], r0["fresh_next"]) <= 1e-7


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_scheduler_rng_and_extras_are_restored_per_rank(two_rank_run):
    _ckpt, r0, r1 = two_rank_run
    for rank, r in enumerate((r0, r1)):
        assert r["draw_equal"], f"rank {rank} RNG stream not restored"
        assert r["counter"] == 7 + rank
    # LambdaLR 1/(1+s) after 2 steps: lr = LR/3
    assert r0["lr_loaded"] == pytest.approx(LR / 3, rel=1e-12)


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_layout_has_dcp_shards_extra_files_meta_and_hf_folder(two_rank_run):
    ckpt, r0, _r1 = two_rank_run
    for sub in (layout.MODEL_DIR, layout.OPTIM_DIR):
        files = sorted(os.listdir(os.path.join(ckpt, sub)))
        assert ".metadata" in files and sum(f.endswith(".distcp") for f in files) == 2
    assert {layout.extra_state_file(2, 0), layout.extra_state_file(2, 1)} <= set(os.listdir(ckpt))
    meta = json.load(open(os.path.join(ckpt, layout.META_FILE)))
    assert meta["world_size"] == 2 and meta["global_step"] == STEPS_BEFORE_SAVE and meta["hf_weights"] is True
    hf = os.listdir(os.path.join(ckpt, layout.HF_DIR))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(hf)
    assert r0["stats"]["bytes"] > 0 and r0["stats"]["seconds"] > 0


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_hf_weights_written_at_save_time_equal_the_sharded_model(two_rank_run):
    from safetensors.torch import load_file

    ckpt, r0, _r1 = two_rank_run
    hf = load_file(os.path.join(ckpt, layout.HF_DIR, "model.safetensors"))
    assert _max_diff({k: hf[k] for k in r0["saved_model"]}, r0["saved_model"]) == 0.0


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_two_rank_checkpoint_loads_on_one_rank(two_rank_run, tiny_model_dir):
    ckpt, r0, _r1 = two_rank_run
    (one,) = run_gloo_ranks(_reload_on_one_rank, 1, tiny_model_dir, ckpt, timeout_s=600)
    assert _max_diff(one["loaded_model"], r0["saved_model"]) <= 1e-7
    assert _max_diff(_optim_tensors(one["loaded_optim"]), _optim_tensors(r0["saved_optim"])) <= 1e-7
    assert one["counter"] == 7  # rank 0's extras when the old rank does not exist
    # one rank sees the whole batch; only the gradient reduction order differs from 2 ranks
    assert _max_diff(one["next_model"], r0["next_model"]) <= 1e-5


def test_load_names_a_pruned_checkpoint(tmp_path):
    from verl.utils.checkpoint import FSDPCheckpointManager

    actor = tmp_path / "actor"
    actor.mkdir()
    (actor / layout.META_FILE).write_text(json.dumps({"world_size": 1, "contents": ["model", "optimizer", "extra"]}))
    model = torch.nn.Linear(2, 2)
    mgr = FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters()))
    with pytest.raises(FileNotFoundError, match="max_optim_to_keep"):
        mgr.load_checkpoint(str(actor))


def test_unknown_checkpoint_content_is_named():
    model = torch.nn.Linear(2, 2)
    from verl.utils.checkpoint import FSDPCheckpointManager

    with pytest.raises(ValueError, match="weights"):
        FSDPCheckpointManager(model, None, contents=["model", "weights"])


def test_manager_retention_drops_shards_of_its_older_saves(tmp_path):
    from verl.utils.checkpoint import FSDPCheckpointManager

    model = torch.nn.Linear(3, 2)
    mgr = FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters()))
    for step in (1, 2, 3):
        mgr.save_checkpoint(str(tmp_path / f"s{step}"), global_step=step, max_ckpt_to_keep=2)
    assert [layout.has_sharded_model(str(tmp_path / f"s{s}")) for s in (1, 2, 3)] == [False, True, True]
    assert (tmp_path / "s1" / layout.extra_state_file(1, 0)).exists()


def _one_rank_refuses(rank, world_size, port, model_dir, root):
    """G1: rank 0's extra-state file holds a planted pickle, rank 1's is fine. Both ranks must get the same
    error within seconds (no rank left in a barrier), and the next load (a good checkpoint) must work."""
    import datetime
    import time as _time

    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.utils.checkpoint import FSDPCheckpointManager
    from verl.utils.checkpoint.fsdp_checkpoint_manager import CheckpointLoadError

    mesh = _init_group(rank, world_size)
    model, optim, sched = build_sharded_actor(model_dir, mesh, seed=0)
    train_step(model, optim, sched, rank, world_size, 0)
    counter = Counter()
    counter.value = 5 + rank
    mgr = FSDPCheckpointManager(model, optim, sched, extra_states={"counter": counter})
    for name in ("good", "bad"):
        mgr.save_checkpoint(os.path.join(root, name), global_step=1)
    if rank == 0:
        torch.save({"rng": datetime.date(2020, 1, 1)}, os.path.join(root, "bad", layout.extra_state_file(2, 0)))
    dist.barrier()
    fresh, fresh_optim, fresh_sched = build_sharded_actor(model_dir, mesh, seed=1)
    fresh_counter = Counter()
    fresh_mgr = FSDPCheckpointManager(fresh, fresh_optim, fresh_sched, extra_states={"counter": fresh_counter})
    start = _time.monotonic()
    try:
        fresh_mgr.load_checkpoint(os.path.join(root, "bad"))
        refused = None
    except CheckpointLoadError as exc:
        refused = str(exc)
    refused_s = _time.monotonic() - start
    fresh_mgr.load_checkpoint(os.path.join(root, "good"))  # the next attempt: no deadlock against a waiting rank
    # G2: the same checkpoint into a model with one layer fewer is refused naming both.
    config = AutoConfig.from_pretrained(model_dir)
    config.num_hidden_layers -= 1
    smaller = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    from torch.distributed.fsdp import fully_shard

    for layer in smaller.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(smaller, mesh=mesh)
    small_optim = torch.optim.AdamW(smaller.parameters())
    try:
        FSDPCheckpointManager(smaller, small_optim, contents=("model", "optimizer")).load_checkpoint(
            os.path.join(root, "good")
        )
        mismatch = None
    except CheckpointLoadError as exc:
        mismatch = str(exc)
    dist.destroy_process_group()
    return {"refused": refused, "refused_s": refused_s, "counter": fresh_counter.value, "mismatch": mismatch}


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_a_file_refused_on_one_rank_fails_every_rank_at_once_and_the_next_load_works(tiny_model_dir, tmp_path):
    results = run_gloo_ranks(_one_rank_refuses, 2, tiny_model_dir, str(tmp_path), timeout_s=600)
    for rank, r in enumerate(results):
        assert r["refused"] is not None and "rank 0:" in r["refused"], r
        assert layout.extra_state_file(2, 0) in r["refused"] and "datetime" in r["refused"]
        assert r["refused_s"] < 60  # seconds, not a hang (generous for a loaded machine)
        assert r["counter"] == 5 + rank  # the good checkpoint loaded afterwards
        assert r["mismatch"] is not None and "2 layers" in r["mismatch"] and "1 layer," in r["mismatch"], r
        assert str(tmp_path / "good") in r["mismatch"]


def test_a_checkpoint_of_another_model_is_refused_in_one_line_naming_both(tmp_path):
    from verl.utils.checkpoint import FSDPCheckpointManager
    from verl.utils.checkpoint.fsdp_checkpoint_manager import check_model_matches

    class Tiny(torch.nn.Module):
        def __init__(self, layers, hidden, vocab=11):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(vocab, hidden)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))

    saved = Tiny(2, 4)
    FSDPCheckpointManager(saved, contents=("model",)).save_checkpoint(str(tmp_path / "actor"), global_step=1)
    for other, expected in (
        (Tiny(1, 4), "2 checkpoint tensor(s) the model lacks, e.g. layers.1.bias"),
        (Tiny(2, 8), "embed_tokens.weight is [11, 4] in the checkpoint, [11, 8] in the model"),
        (Tiny(2, 4, vocab=13), "embed_tokens.weight is [11, 4] in the checkpoint, [13, 4]"),
    ):
        with pytest.raises(ValueError) as err:
            FSDPCheckpointManager(other, contents=("model",)).load_checkpoint(str(tmp_path / "actor"))
        line = str(err.value)
        assert "\n" not in line and expected in line and str(tmp_path / "actor") in line and "Tiny" in line, line
    assert "(2 layers, hidden 4, vocab 11, 5 tensors) does not match the model m (1 layer, hidden 4" in str(
        pytest.raises(
            ValueError,
            check_model_matches,
            {k: tuple(v.shape) for k, v in saved.state_dict().items()},
            {k: tuple(v.shape) for k, v in Tiny(1, 4).state_dict().items()},
            "ck",
            "m",
        ).value
    )
    FSDPCheckpointManager(Tiny(2, 4), contents=("model",)).load_checkpoint(str(tmp_path / "actor"))  # same shape: loads


def _load_in_a_one_rank_group(rank, world, port, path):
    import torch.distributed as dist

    from verl.utils.checkpoint import FSDPCheckpointManager

    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Linear(2, 2)
    try:
        FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters())).load_checkpoint(path)
        return None
    except Exception as exc:  # noqa: BLE001 - its type is what the test checks
        return type(exc).__name__, str(exc)
    finally:
        dist.destroy_process_group()


def test_a_one_rank_group_raises_the_ranks_own_error(tmp_path):
    """No one to agree with: the refusal keeps its type, as without a process group (a group of one is what an
    in-process vLLM engine leaves in a test worker)."""
    actor = tmp_path / "actor"
    actor.mkdir()
    (actor / layout.META_FILE).write_text(json.dumps({"world_size": 1, "contents": ["model", "optimizer", "extra"]}))
    name, message = run_gloo_ranks(_load_in_a_one_rank_group, 1, str(actor), timeout_s=300)[0]
    assert name == "FileNotFoundError" and "max_optim_to_keep" in message
