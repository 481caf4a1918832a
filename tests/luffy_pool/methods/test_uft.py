"""algorithm.method=uft without Ray: the hint draw as the group's shared prefix (exactly the hint's tokens
through the slot plan), its checkpointed RNG and step, the hint-column input check and the pre-processor."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from luffy_pool.methods.uft import UftConfig
from luffy_pool.methods.uft import UftHintSampler, check_hint_column
from luffy_pool.rollout.slot_plan import SLOT_ON, SLOT_PARTIAL, build_slot_plan
from verl.protocol import DataProto

SEGMENTS = ["ab\n", "cd\n", "ef\n", "gh\n", "ij\n", "kl"]


class CharTokenizer:
    """One token per character (ids = code points), pad 0, EOS 1."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _batch(hints, width=32, prompt="q?"):
    ids = torch.tensor([[0] * 2 + [ord(c) for c in prompt]] * len(hints))
    return DataProto.from_single_dict(
        {
            "tgt_input_ids": torch.zeros(len(hints), width, dtype=torch.long),
            "input_ids": ids,
            "attention_mask": (ids > 0).long(),
            "hint": np.array(hints + [None], dtype=object)[:-1],
        }
    )


def _sampler(schedule="cosine", seed=0, n=3):
    return UftHintSampler(n, UftConfig(schedule=schedule), "hint", CharTokenizer(), seed)


def test_every_slot_of_a_prompt_starts_with_exactly_its_hint():
    sampler = _sampler("stage")  # stage at t = 1: all 5 cut points, the whole solution
    batch = _batch([SEGMENTS, []])
    ratios, metrics = sampler.draw_batch(batch, global_step=1)
    hint = [ord(c) for c in "".join(SEGMENTS)]
    assert batch.batch["tgt_input_ids"][0, : len(hint)].tolist() == hint
    assert ratios[1].tolist() == [0.0] * 3  # an empty hint list: no hint (UFT divides by zero)
    plan = build_slot_plan(
        torch.ones(2, 2, dtype=torch.long),
        torch.ones(2, 2, dtype=torch.long),
        batch.batch["tgt_input_ids"].unsqueeze(1).expand(2, 3, 32),
        ratios,
        0,
        1,
        64,
    )
    assert plan.prefixes[:3] == [hint] * 3 and plan.kinds == [SLOT_PARTIAL] * 3 + [SLOT_ON] * 3
    assert metrics["uft/hint_share"] == 0.5 and metrics["uft/hint_tokens"] == len(hint) / 2


def test_a_hint_opening_the_think_block_after_a_prompt_that_opens_it_drops_it():
    think = ["<think>\nab\n", "cd"]
    for prompt, expected in (("q?<think>\n", "ab\ncd"), ("q?", "<think>\nab\ncd")):
        batch = _batch([think], prompt=prompt)
        ratios, _ = _sampler("stage").draw_batch(batch, global_step=1)
        assert batch.batch["tgt_input_ids"][0, : len(expected)].tolist() == [ord(c) for c in expected]
        assert ratios[0, 0] == pytest.approx((len(expected) + 0.5) / (len(expected) + 1))


def test_past_t_hint_no_prompt_gets_a_hint_and_the_cosine_probability_is_logged():
    ratios, metrics = _sampler().draw_batch(_batch([SEGMENTS] * 4), global_step=301)
    assert not ratios.any() and metrics["uft/hint_probability"] == 0.0
    _, metrics = _sampler().draw_batch(_batch([SEGMENTS] * 4), global_step=150)
    assert metrics["uft/hint_probability"] == pytest.approx(0.5)


def test_a_hint_longer_than_the_trace_width_is_cut_and_counted():
    batch = _batch([SEGMENTS], width=4)
    ratios, metrics = _sampler("stage").draw_batch(batch, global_step=1)
    assert metrics["uft/hints_cut"] == 1 and batch.batch["tgt_input_ids"][0].tolist() == [ord(c) for c in "ab\nc"]
    assert ratios[0, 0] == pytest.approx(4.5 / 5)


def test_the_draw_resumes_from_its_checkpointed_rng():
    uninterrupted = _sampler()
    uninterrupted.draw_batch(_batch([SEGMENTS] * 8), global_step=40)
    state = uninterrupted.state_dict()
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)  # the checkpoint's data.pt is read back with weights_only
    resumed = _sampler(seed=123)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    a, b = _batch([SEGMENTS] * 8), _batch([SEGMENTS] * 8)
    assert np.array_equal(uninterrupted.draw_batch(a, 41)[0], resumed.draw_batch(b, 41)[0])
    assert torch.equal(a.batch["tgt_input_ids"], b.batch["tgt_input_ids"])
    with pytest.raises(ValueError, match="not algorithm.method=uft's"):
        resumed.load_state_dict({"bit_generator_state": {}})


def _sections(off_policy_files=None):
    from luffy_pool.methods import get_method
    from luffy_pool.methods.uft import UftKnobs

    return SimpleNamespace(
        knobs=UftKnobs(**{**get_method("uft").knob_defaults(), "hint_key": "hint"}),
        data=SimpleNamespace(off_policy_files=off_policy_files),
    )


def test_input_check_names_file_row_and_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.table({"prompt": ["q1", "q2"]}), path)
    error = check_hint_column(path, _sections())
    assert error.startswith(f"data.train_files: {path}: no column 'hint' (algorithm.uft.hint_key)")
    assert "data/prepare_uft_hints.py --input" in error
    pq.write_table(pa.table({"hint": [["a", "b"], None]}), path)
    assert check_hint_column(path, _sections()) is None
    assert "off_policy_files" in check_hint_column(path, _sections(off_policy_files=["x.parquet"]))
    pq.write_table(pa.table({"hint": ["a whole solution", "b"]}), path)
    assert check_hint_column(path, _sections()).startswith(f"data.train_files: {path}: row 0: column 'hint' must be")


def test_preprocessor_cuts_each_solution_into_segments_losslessly(tmp_path):
    from data.prepare_uft_hints import main
    from luffy_pool.methods.uft import add_hints
    from verl.utils.data_format import read_records, write_records

    rows = [
        {"prompt": "q", "target": [{"role": "assistant", "content": "x = 1\n\ny = 2\nanswer 3"}]},
        {"prompt": "r", "target": None},
        {"prompt": "s", "target": "<think>\nx\n</think>\n"},
    ]
    out = add_hints(rows, "in.parquet")
    assert out[0]["hint"] == ["x = 1\n\n", "y = 2\n", "answer 3"] and out[1]["hint"] == []
    assert out[2]["hint"] == ["<think>\nx\n", "</think>\n"]  # the opening alone is no step
    assert out[0]["target"] == rows[0]["target"]
    write_records(rows[:2], str(tmp_path / "in.parquet"))  # one type per parquet column: the message lists
    main(["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.parquet")])
    assert [list(r["hint"]) for r in read_records(str(tmp_path / "out.parquet"))] == [h["hint"] for h in out[:2]]
    assert check_hint_column(str(tmp_path / "out.parquet"), _sections()) is None


def test_a_train_file_without_hints_is_refused_before_ray(
    tmp_path, compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir
):
    from luffy_pool.run.launcher import build_trainer
    from luffy_pool.run.preflight import PreflightError

    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path / "out"), steps=2)
    # LUFFY's off-policy switch contradicts uft's preset (refused by itself): leave it at the YAML default
    overrides = [o for o in overrides if o != "actor_rollout_ref.actor.use_off_policy_loss=True"]
    config = compose_config(overrides + ["algorithm.method=uft"])
    with pytest.raises(
        PreflightError,
        match=f"data.train_files: {tiny_task_dir}/train.parquet: no column 'hint' "
        r"\(algorithm.uft.hint_key\)",
    ):
        build_trainer(config)


# ---------------------------------------------------------------------- entropy bonus and KL loss: continuation only
def _regularised(method, prefix):
    """The MIX actor's entropy bonus + low-var KL loss (coefficients 0.01 and 0.5) on one micro-batch, with
    ``method`` selected: (loss, metrics). Row 0: 2 hint tokens then 2 continuation tokens; row 1: 3 continuation
    tokens and padding."""
    from luffy_pool.config.compose import actor_config
    from luffy_pool.methods import MethodSelection
    from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor

    cfg = actor_config(entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.5)
    module = torch.nn.Linear(1, 1)
    actor = MIXDataParallelPPOActor(cfg, module, actor_optimizer=torch.optim.SGD(module.parameters(), lr=0.1))
    actor.set_method(MethodSelection(method))
    log_prob = torch.tensor([[-1.0, -2.0, -0.5, -0.3], [-0.3, -1.2, -0.7, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -2.0, -0.2, -0.3], [-0.3, -0.2, -0.7, 0.0]], dtype=torch.float64)
    entropy = torch.tensor([[9.0, 7.0, 1.0, 2.0], [3.0, 4.0, 5.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float64)
    metrics = {}
    micro = {"ref_log_prob": ref, "prefix_mask": prefix}
    return actor._regularisers(micro, log_prob, entropy, mask, metrics), metrics


def _k3(d):  # low_var_kl of policy - reference log-prob d: exp(-d) + d - 1
    return np.exp(-d) + d - 1


def test_uft_entropy_bonus_and_kl_loss_leave_the_hint_tokens_out_as_its_authors():
    """liumy2010/UFT @ ad3c8ec7 verl/workers/actor/dp_actor.py update_policy: entropy (line 281) and KL (289-292)
    are masked means over response_mask, the continuation (the hint is prompt there)."""
    prefix = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    loss, metrics = _regularised("uft", prefix)
    # continuation tokens: row 0 positions 2-3, row 1 positions 0-2
    entropy = (1.0 + 2.0 + 3.0 + 4.0 + 5.0) / 5
    kl = (_k3(-0.3) + _k3(0.0) + _k3(0.0) + _k3(-1.0) + _k3(0.0)) / 5
    assert metrics["actor/entropy_loss"] == pytest.approx(entropy, rel=1e-12)
    assert metrics["actor/kl_loss"] == pytest.approx(kl, rel=1e-12)
    assert float(loss) == pytest.approx(-0.01 * entropy + 0.5 * kl, rel=1e-12)
    # LUFFY's traces are trained tokens: its regularisers keep them (all 7 response tokens)
    _, luffy = _regularised("luffy", prefix)
    assert luffy["actor/entropy_loss"] == pytest.approx((9.0 + 7.0 + 1.0 + 2.0 + 3.0 + 4.0 + 5.0) / 7, rel=1e-12)
    kl_all = (_k3(0.5) + _k3(0.0) + _k3(-0.3) + _k3(0.0) + _k3(0.0) + _k3(-1.0) + _k3(0.0)) / 7
    assert luffy["actor/kl_loss"] == pytest.approx(kl_all, rel=1e-12)


def test_uft_micro_batch_of_hint_tokens_only_adds_no_regulariser():
    loss, metrics = _regularised("uft", torch.ones(2, 4, dtype=torch.bool))
    assert float(loss) == 0.0 and metrics["actor/entropy_loss"] == 0.0 and "actor/kl_loss" not in metrics
