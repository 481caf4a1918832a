"""``algorithm.method=relift`` without Ray: the SFT rows built from a demonstration, the driver stage (hard questions
into the buffer, newest first, the SFT stage when it is full, no crash on an empty step, its state in data.pt) on a
stub worker group, the SFT step on one in-process rank against a hand-written loop, and the second optimizer's
checkpoint (saved only once it stepped, restored exactly)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from luffy_pool.methods.relift import demonstration_batch
from verl.protocol import DataProto

PAD, EOS = 0, 9


def test_demonstration_rows_by_hand():
    prompt = torch.tensor([[0, 5, 6], [7, 8, 4]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    prompt_pos = torch.tensor([[0, 0, 1], [0, 1, 2]])
    demo = torch.tensor([[3, 3, 0, 0], [2, 2, 2, 2]])  # right-padded; the second fills the width
    out = demonstration_batch(prompt, prompt_mask, prompt_pos, demo, pad_token_id=PAD, eos_token_id=EOS)
    assert out["responses"].tolist() == [[3, 3, EOS, 0], [2, 2, 2, EOS]]
    assert out["input_ids"].tolist() == [[0, 5, 6, 3, 3, EOS, 0], [7, 8, 4, 2, 2, 2, EOS]]
    assert out["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]]
    assert out["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]]
    assert demo.tolist() == [[3, 3, 0, 0], [2, 2, 2, 2]]  # the buffer's rows stay as they were


# ---------------------------------------------------------------- the driver stage on a stub worker group
class StubWorkers:
    def __init__(self):
        self.init_calls, self.sft_batches = [], []

    def init_sft_optimizer(self, knobs):
        self.init_calls.append(knobs)

    def sft_update_actor(self, data):
        self.sft_batches.append(data)
        return DataProto(meta_info={"metrics": {"actor/sft_loss": [1.0, 3.0]}})


def _trainer(sft_data_size=4, world=2):
    """The StepContext the trainer builds the stage from (the stage's name keys its state in the trainer's)."""
    from luffy_pool.methods.hooks import StepContext
    from luffy_pool.methods.relift import ReliftKnobs

    knobs = ReliftKnobs(
        sft_data_size=sft_data_size,
        sft_mini_batch_size=sft_data_size,
        sft_micro_batch_size=1,
        sft_epochs=1,
        sft_lr=1e-6,
        sft_grad_clip=1.0,
        sft_entropy_coeff=0.001,
    )
    sections = SimpleNamespace(
        knobs=knobs,
        data=SimpleNamespace(reward_impl_version=3),
        workers=SimpleNamespace(actor=SimpleNamespace(optim=SimpleNamespace(betas=[0.9, 0.999], weight_decay=0.01))),
        trainer=SimpleNamespace(balance_batch=False),
    )
    return StepContext(
        sections=sections,
        wg=StubWorkers(),
        tokenizer=SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS),
        dataset=None,
        collate_fn=None,
        world_size=world,
        response_length=3,
        total_steps=4,
        knobs=knobs,
    )


def _prompts(indexes):
    """A step's prompt batch: prompt i is [i, i] with demonstration [i, PAD, PAD]."""
    b = len(indexes)
    ids = torch.tensor([[i, i] for i in indexes])
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": torch.ones(b, 2, dtype=torch.long),
            "position_ids": torch.tensor([[0, 1]] * b),
            "tgt_input_ids": torch.tensor([[i, PAD, PAD] for i in indexes]),
        }
    )
    batch.non_tensor_batch["index"] = np.array(indexes, dtype=object)
    return batch


def _scored(indexes, scores, n=2):
    """The updated batch: n rows per prompt, the rows' scores (on their last token), rows reversed (balancing)."""
    uids = np.array([f"u{i}" for i in indexes for _ in range(n)], dtype=object)
    index = np.array([i for i in indexes for _ in range(n)], dtype=object)
    tls = torch.zeros(len(uids), 3)
    tls[:, -1] = torch.tensor(scores, dtype=torch.float32)
    batch = DataProto.from_dict(tensors={"token_level_scores": tls})
    batch.non_tensor_batch.update(uid=uids, index=index)
    batch.reorder(torch.arange(len(uids) - 1, -1, -1))
    return batch


def _step(stage, indexes, scores):
    prompts = _prompts(indexes)
    assert stage.compose(prompts) == (prompts, {})  # the step's prompts are kept (with their demonstrations)
    timing = {}
    return stage.after_update(_scored(indexes, scores), timing), timing


def test_the_stage_buffers_hard_questions_newest_first_and_trains_when_full():
    from luffy_pool.methods.relift import ReliftStage

    trainer = _trainer()
    stage = ReliftStage(trainer)
    assert trainer.wg.init_calls == [
        dict(
            lr=1e-6,
            betas=(0.9, 0.999),
            weight_decay=0.01,
            grad_clip=1.0,
            mini_batch_size=4,
            micro_batch_size=1,
            epochs=1,
            entropy_coeff=0.001,
        )
    ]
    assert stage.name == "relift"  # its state's key in the trainer's state["hooks"]["state"]
    # no hard question while the buffer is empty: the authors' len(None) crash
    metrics, _ = _step(stage, [1, 2], [1, 0, 1, 1])
    assert metrics == {"relift/hard_questions": 0, "relift/sft_rows": 0, "relift/buffer_size": 0}
    # rows reversed by the balancing: first appearance is prompt 4, then 3
    metrics, _ = _step(stage, [3, 4, 5], [0, 0, 0, 0, 1, 0])
    assert metrics["relift/hard_questions"] == 2 and metrics["relift/buffer_size"] == 2
    assert [int(r["input_ids"][0]) for r in stage.buffer.rows] == [4, 3]
    metrics, timing = _step(stage, [6, 7, 8], [0, 0, 0, 0, 0, 0])
    assert metrics["relift/sft_rows"] == 4 and metrics["relift/buffer_size"] == 1
    assert metrics["actor/sft_loss"] == 2.0 and timing["sft_update_actor"] >= 0
    (sft,) = trainer.wg.sft_batches
    assert sft.batch["input_ids"][:, 0].tolist() == [8, 7, 6, 4]  # newest first
    assert sft.batch["responses"][0].tolist() == [8, EOS, PAD]
    assert sft.batch["attention_mask"][0].tolist() == [1, 1, 1, 1, 0]
    assert [int(r["input_ids"][0]) for r in stage.buffer.rows] == [3]


def test_the_buffer_survives_the_checkpoints_plain_data_file(tmp_path):
    from luffy_pool.methods.relift import ReliftStage
    from verl.utils.checkpoint.safe_io import load_state, save_state

    stage = ReliftStage(_trainer())
    _step(stage, [3, 4], [0, 0, 1, 0])
    save_state(str(tmp_path / "data.pt"), {"extras": {"relift": stage.state_dict()}})  # read back weights_only
    restored = ReliftStage(_trainer())
    restored.load_state_dict(load_state(str(tmp_path / "data.pt"))["extras"]["relift"])
    assert [{k: v.tolist() for k, v in r.items()} for r in restored.buffer.rows] == [
        {k: v.tolist() for k, v in r.items()} for r in stage.buffer.rows
    ]
    assert len(restored.buffer.rows) == 1


def test_a_data_size_the_ranks_cannot_share_is_refused_and_minus_one_builds_no_optimizer():
    from luffy_pool.methods.relift import ReliftStage

    with pytest.raises(ValueError, match="sft_data_size=3 must be a multiple of the 2 actor ranks"):
        ReliftStage(_trainer(sft_data_size=3))
    trainer = _trainer(sft_data_size=-1)
    stage = ReliftStage(trainer)
    assert trainer.wg.init_calls == [] and _step(stage, [1], [0, 0])[0]["relift/buffer_size"] == 0


# ---------------------------------------------------------------- the SFT step on one in-process rank
def _tiny_lm(seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    return Qwen2ForCausalLM(cfg).float()


def _sft_rows():
    prompt = torch.tensor([[0, 5, 6], [7, 8, 4]])
    demo = torch.tensor([[3, 3, 0, 0], [2, 1, 2, 2]])
    return demonstration_batch(
        prompt,
        torch.tensor([[0, 1, 1], [1, 1, 1]]),
        torch.tensor([[0, 0, 1], [0, 1, 2]]),
        demo,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )


def test_the_sft_step_equals_a_hand_written_loop_and_leaves_the_rl_optimizer_alone():
    from luffy_pool.workers.interleaved_sft import InterleavedSftConfig, build_sft_optimizer, sft_update
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    cfg = InterleavedSftConfig(
        lr=1e-2,
        betas=(0.9, 0.999),
        weight_decay=0.01,
        grad_clip=1.0,
        mini_batch_size=2,
        micro_batch_size=1,
        epochs=1,
        entropy_coeff=0.001,
    )
    model, ref = _tiny_lm(), _tiny_lm()
    rl_optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    actor = DataParallelPPOActor(None, model, None, logprob_chunk_size=0)
    optimizer = build_sft_optimizer(model, cfg, "auto")
    rows = _sft_rows()
    metrics = sft_update(actor, optimizer, DataProto.from_dict(tensors=rows), cfg)
    assert not rl_optimizer.state and optimizer.state  # only the SFT optimizer stepped
    assert len(metrics["actor/sft_loss"]) == 2 and len(metrics["actor/sft_grad_norm"]) == 1

    # the authors' loop by hand: per row NLL token mean - 0.001 * entropy token mean, / (mini / micro), one step
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    width = rows["responses"].size(1)
    for i in range(2):
        logits = (
            ref(
                input_ids=rows["input_ids"][i : i + 1],
                attention_mask=rows["attention_mask"][i : i + 1],
                position_ids=rows["position_ids"][i : i + 1],
            )
            .logits[:, -width - 1 : -1]
            .float()
        )
        logp = torch.log_softmax(logits, -1)
        token_logp = logp.gather(-1, rows["responses"][i : i + 1, :, None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        mask = rows["attention_mask"][i : i + 1, -width:].float()
        loss = (-(token_logp * mask).sum() / mask.sum()) - 0.001 * (entropy * mask).sum() / mask.sum()
        (loss / 2).backward()
        expected = metrics["actor/sft_loss"][i] - 0.001 * metrics["actor/sft_entropy_loss"][i]
        assert float(loss.detach()) == pytest.approx(expected, abs=1e-5)
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)


def test_the_second_optimizer_is_checkpointed_once_it_stepped_and_restored_exactly(tmp_path):
    from verl.utils.checkpoint import layout
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    def manager(model, sft):
        rl = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(input_ids=torch.tensor([[1, 2]])).logits.sum().backward()
        rl.step()  # the RL optimizer always stepped before a save
        rl.zero_grad()
        return FSDPCheckpointManager(model, rl, extra_optimizers={"sft": sft})

    model = _tiny_lm()
    sft = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh = manager(model, sft)
    fresh.save_checkpoint(str(tmp_path / "a"), global_step=1)
    assert not sft.state, "saving must not initialise an unused optimizer (its first step would change)"
    assert not (tmp_path / "a" / layout.extra_optim_dir("sft")).exists()

    model(input_ids=torch.tensor([[3, 4]])).logits.sum().backward()
    sft.step()
    fresh.save_checkpoint(str(tmp_path / "b"), global_step=2)
    assert (tmp_path / "b" / "optim_sft" / ".metadata").exists()

    other = _tiny_lm(seed=1)
    other_sft = torch.optim.AdamW(other.parameters(), lr=1e-3)
    loader = manager(other, other_sft)
    loader.load_checkpoint(str(tmp_path / "b"))
    for p, q in zip(sft.param_groups[0]["params"], other_sft.param_groups[0]["params"]):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sft.state[p][key], other_sft.state[q][key]), key
    loader.load_checkpoint(str(tmp_path / "a"))  # saved unused: it comes back fresh
    assert not other_sft.state

    without = FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters()))
    without.save_checkpoint(str(tmp_path / "c"), global_step=3)
    with pytest.raises(KeyError, match="has no state of the 'sft' optimizer"):
        loader.load_checkpoint(str(tmp_path / "c"))
