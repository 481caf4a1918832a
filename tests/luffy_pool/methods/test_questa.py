"""QuestA (``algorithm.method=questa``) against the authors' functions and METHODS_SPEC_2026 §6's check values: the
hint rule and the answer filter, the reward and the batch-wide token normalisation of the advantage, the
success-rate gate, the decoupled PPO loss and its token weighting over micro-batches; then the hook on the tiny
task (hinted prompts, the stage table, the gate, the advantage it writes), the train-file checks, the knob rules
and the launch script.

Reference values: foreverlasting1202/QuestA at commit 3c7be00157eb249d839b1045dd96ce74efaf5c55, run outside this
project (a scratch script importing their files, with stubs for the cluster modules they import): ``AReaL/datasets/
add_prefix.py`` ``main`` (line 13; run as a program with ``--ratio 10 / 25 / 50`` on a jsonl of the rows below),
``AReaL/arealite/engine/ppo/actor.py`` line 62 ``PPOActor.compute_advantages`` (reward_scaling 5, reward_clip 20,
kl_ctl 0, adv_norm, γ = λ = 1) and ``AReaL/arealite/utils/functional.py`` line 81 ``masked_normalization`` and
line 122 ``ppo_actor_loss_fn`` (eps_clip 0.2, behav_imp_weight_cap 5), ``AReaL/arealite/workflow/rlvr.py`` line 43
``RLVRWorkflow.arun_episode`` (the filter of lines 109, 138-142, with a fake engine and fixed rewards).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.questa import (
    TOKEN_SCALE,
    TRAINABLE,
    QuestaKnobs,
    answer_in_solution,
    check_solution_column,
    decoupled_ppo_token_losses,
    global_token_advantages,
    hinted_problem,
    questa_loss,
    questa_rewards,
    solution_of,
    stage_of,
    success_gate,
)
from tests.helpers.float_compare import assert_float_close

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
D = torch.float64

# ---------------------------------------------------------------- the hint (add_prefix.py main)
ROWS = [  # (problem, generation, answer)
    ("Solve 2x+1=7.", "<think>scratch work</think>Let x=3. Then 2x+1=7, so the answer is \\boxed{7}.", "7"),
    ("P2", '"<think>a</think>quoted solution with answer 12 here"', "12"),  # a leading quote: both ends cut
    ("P3", "no think block: the sum is 1+1=2, answer 2", "2"),  # no </think>: all of it is the solution
    ("P4", "<think>x</think>mid</think>√2·√8 = 4, so \\boxed{4}", "4"),  # the last </think>; characters, not bytes
    ("P5", "<think>t</think>The answer is 5.", "17"),  # 17 is not in the solution: dropped
    ("P6", "<think>t</think>0123456789ABCDEFGHIJ 42", "42"),
]
# their output file's prompts (the rows they kept, in order) for --ratio 10, 25, 50
AUTHORS_PROMPTS = {
    0.10: ["Solve 2x+1=7.\n\n", "P2\n\n", "P3\n\n", "P4\n\n", "P6\n\n"],
    0.25: ["Solve 2x+1=7.\n\n## Hint.Let x=3. The", "P2\n\n", "P3\n\n## Hint.no think b", "P4\n\n", "P6\n\n"],
    0.50: [
        "Solve 2x+1=7.\n\n## Hint.Let x=3. Then 2x+1=7, so",
        "P2\n\n## Hint.quoted solution w",
        "P3\n\n## Hint.no think block: the s",
        "P4\n\n## Hint.√2·√8 = 4, ",
        "P6\n\n## Hint.0123456789A",
    ],
}


@pytest.mark.parametrize("ratio", sorted(AUTHORS_PROMPTS))
def test_hinted_prompts_and_dropped_rows_equal_add_prefix(ratio):
    kept = [(p, solution_of(g)) for p, g, a in ROWS if answer_in_solution(a, solution_of(g))]
    assert [hinted_problem(p, s, ratio) for p, s in kept] == AUTHORS_PROMPTS[ratio]


def test_spec_check_values_of_the_hint():
    solution = solution_of(ROWS[0][1])
    assert solution == "Let x=3. Then 2x+1=7, so the answer is \\boxed{7}."
    # p = 0.5: 24 characters; 0.25: 12; 0.1: 4 < 10, no hint (the two newlines stay)
    assert hinted_problem("Solve 2x+1=7.", solution, 0.5) == "Solve 2x+1=7.\n\n## Hint." + solution[:24]
    assert hinted_problem("Solve 2x+1=7.", solution, 0.25).endswith("## Hint.Let x=3. The")
    assert hinted_problem("Solve 2x+1=7.", solution, 0.1) == "Solve 2x+1=7.\n\n"
    assert hinted_problem("Q", "0123456789ABCDEFGHIJ", 0.5) == "Q\n\n## Hint.0123456789"  # exactly 10: a hint
    assert hinted_problem("Q", "0123456789ABCDEFGHI", 0.5) == "Q\n\n"  # 9 characters: none
    assert answer_in_solution(["9", "7"], solution) and not answer_in_solution(["9"], solution)


# ---------------------------------------------------------------- reward, advantage, gate (actor.py, rlvr.py)
def _mask(lengths, width):
    m = torch.zeros(len(lengths), width, dtype=D)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


# compute_advantages' advantage on each row's response tokens (their float32 output of float64 arithmetic)
ADVANTAGE_CASES = [
    # (r per row, response lengths, authors' advantage per row)
    ([1, 0, 0, 1], [3, 2, 4, 1], [1.224739909172058, -0.8164932727813721, -0.8164932727813721, 1.224739909172058]),
    ([5.0, -1.0, 0.0], [2, 3, 1], [1.3969064950942993, -0.8087353706359863, -0.3676069974899292]),  # 25 -> 20
    ([1, 1, 1, 1], [3, 2, 4, 1], [0.0, 0.0, 0.0, 0.0]),
]


@pytest.mark.golden
@pytest.mark.parametrize("r,lengths,expected", ADVANTAGE_CASES)
def test_advantage_equals_compute_advantages(r, lengths, expected):
    mask = _mask(lengths, 5)
    adv = global_token_advantages(questa_rewards(torch.tensor(r, dtype=D)), mask, torch.ones(len(r), dtype=torch.bool))
    want = torch.tensor(expected, dtype=D).unsqueeze(-1) * mask
    assert_float_close(adv.float(), want.float())


@pytest.mark.golden
def test_spec_check_values_of_the_advantage():
    # rewards [1, 0, 0, 1]·5 on 3, 2, 4, 1 tokens: 1.224745 / -0.816497 without eps; 1.224740 / -0.816493 with 1e-5
    r = questa_rewards(torch.tensor([1.0, 0, 0, 1], dtype=D))
    mask, keep = _mask([3, 2, 4, 1], 4), torch.ones(4, dtype=torch.bool)
    adv = global_token_advantages(r, mask, keep)
    assert adv[0, 0].item() == pytest.approx(1.224740, abs=5e-7)
    assert adv[1, 0].item() == pytest.approx(-0.816493, abs=5e-7)
    no_eps = global_token_advantages(r, mask, keep, eps=0.0)
    assert no_eps[3, 0].item() == pytest.approx(1.224745, abs=5e-7)
    assert no_eps[2, 3].item() == pytest.approx(-0.816497, abs=5e-7)


@pytest.mark.golden
def test_normalisation_is_over_the_kept_rows_tokens_only():
    r = questa_rewards(torch.tensor([1.0, 0, 0, 1, 1, 1], dtype=D))
    mask, keep = _mask([3, 2, 4, 1, 2, 2], 4), torch.tensor([True] * 4 + [False] * 2)
    adv = global_token_advantages(r, mask, keep)
    assert_float_close(adv[:4], global_token_advantages(r[:4], mask[:4], keep[:4]))
    assert torch.equal(adv[4:], torch.zeros(2, 4, dtype=D))
    assert torch.equal(global_token_advantages(r, mask, torch.zeros(6, dtype=torch.bool)), torch.zeros(6, 4, dtype=D))


def test_success_gate_equals_rlvr_workflow():
    # arun_episode's rejected success counts with n = 16, 8 and 4 samples: {0, n} each time
    for n in (16, 8, 4):
        assert [c for c, kept in enumerate(success_gate(range(n + 1), [n] * (n + 1))) if not kept] == [0, n]
    assert success_gate([1, 19, 20], [20, 20, 20]) == [True, True, False]  # 0.05 and 0.95 themselves are kept
    assert success_gate([1, 2], [4, 4], lb=0.3) == [False, True]


# ---------------------------------------------------------------- the loss (functional.py ppo_actor_loss_fn)
LP = torch.tensor([[-0.5, -1.2, -0.3, -2.0], [-0.9, -0.1, -1.5, -0.7]], dtype=D)
PROX = torch.tensor([[-0.7, -1.0, -0.3, -1.0], [-1.0, -0.4, -1.1, -0.7]], dtype=D)
BEHAV = torch.tensor([[-0.6, -1.0, -2.0, -1.0], [-1.2, -0.2, -1.1, -0.5]], dtype=D)  # row 0 token 2: w = e^1.7 > 5
ADV = torch.tensor([[1.5] * 4, [-0.8] * 4], dtype=D)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=D)


@pytest.mark.golden
def test_decoupled_loss_equals_ppo_actor_loss_fn_with_a_behaviour_policy():
    losses, clipped = decoupled_ppo_token_losses(LP, PROX, ADV, MASK, 0.2, BEHAV, 5.0)
    authors = torch.tensor(
        [
            [-1.628707352464727, -1.228096129616973, 0.0, 0.0],
            [1.0798870460608023, 0.8841367344605181, 0.64, 0.6549846024623855],
        ],
        dtype=D,
    )
    assert_float_close(losses, authors)
    assert clipped.tolist() == [[True, False, False, False], [False, False, True, False]]
    assert (losses.sum() / MASK.sum()).item() == pytest.approx(0.05745784298600086, rel=1e-12)  # their loss


@pytest.mark.golden
def test_synchronous_loss_and_its_token_weighting_over_micro_batches_equal_the_authors():
    """Without a behaviour policy the weight is 1 (their call with old_logprobs = proximal_logprobs); the step's
    loss over two micro-batches and two ranks' worth of scaling is the token mean of the whole step."""
    losses, _ = decoupled_ppo_token_losses(LP, PROX, ADV, MASK, 0.2)
    authors = torch.tensor(
        [[-1.7999999999999998, -1.228096129616973, -1.5, 0.0], [0.884136734460518, 1.0798870460608025, 0.64, 0.8]],
        dtype=D,
    )
    assert_float_close(losses, authors)
    # their train_batch: each micro-batch's token mean weighted by its token count over the step: -0.16058176415652176
    grad_accum, tokens = 2, float(MASK.sum())
    step = 0.0
    for row in range(2):  # one micro-batch per row; one rank, one mini-batch: scale = 1 x 1 / tokens
        inputs = _loss_inputs(slice(row, row + 1), grad_accum, {TOKEN_SCALE: 1 / tokens})
        loss, metrics = questa_loss(inputs, QuestaKnobs(), 0)
        step += float(loss) / grad_accum  # what the actor backpropagates
    assert step == pytest.approx(-0.16058176415652176, rel=1e-12)
    assert float(metrics["questa/pg_loss"]) == pytest.approx(float(authors[1].sum() / 4), rel=1e-12)


def _loss_inputs(rows, grad_accum, update_state, log_prob=LP):
    return FamilyLossInputs(
        log_prob=log_prob[rows],
        old_log_prob=PROX[rows],
        advantages=ADV[rows],
        response_mask=MASK[rows],
        settings=SimpleNamespace(clip_ratio=0.2),
        batch_sizes=SimpleNamespace(gradient_accumulation=grad_accum),
        update_state=update_state,
    )


@pytest.mark.golden
def test_the_loss_gradient_is_the_step_token_mean_and_it_needs_the_hooks_scale():
    lp = LP.clone().requires_grad_(True)
    loss, _ = questa_loss(_loss_inputs(slice(None), 1, {TOKEN_SCALE: 1 / float(MASK.sum())}, lp), None, 0)
    loss.backward()
    ref = LP.clone().requires_grad_(True)
    (decoupled_ppo_token_losses(ref, PROX, ADV, MASK, 0.2)[0].sum() / MASK.sum()).backward()
    assert_float_close(lp.grad, ref.grad)
    with pytest.raises(ValueError, match="update_state"):
        questa_loss(_loss_inputs(slice(None), 1, {}), None, 0)


def test_stages_switch_at_their_fraction_of_the_run():
    assert [stage_of(t, 2, [0.5]) for t in (1, 2)] == [0, 1]
    assert [stage_of(t, 1000, [0.5]) for t in (1, 500, 501, 1000)] == [0, 0, 1, 1]
    assert [stage_of(t, 10, [0.3, 0.8]) for t in (3, 4, 8, 9)] == [0, 1, 1, 2]
    assert stage_of(7, 10, []) == 0
    assert [stage_of(t, 100, [0.29]) for t in (29, 30)] == [0, 1]  # 0.29 x 100 is 28.999... in floats


def test_knob_rules():
    assert QuestaKnobs().validate() == []
    assert QuestaKnobs(hint_ratios=[0.5, 0.3, 0.1], stage_starts=[0.5]).validate() == [
        "'algorithm.questa.stage_starts'=[0.5] must give one start per stage after the first "
        "(2 for 'algorithm.questa.hint_ratios'=[0.5, 0.3, 0.1])"
    ]
    assert QuestaKnobs(hint_ratios=[0.5, 0.3, 0.1], stage_starts=[0.6, 0.4]).validate() == [
        "'algorithm.questa.stage_starts'=[0.6, 0.4] must increase"
    ]
    assert QuestaKnobs(success_lb=0.9, success_ub=0.2).validate() == [
        "'algorithm.questa.success_lb'=0.9 exceeds 'algorithm.questa.success_ub'=0.2"
    ]


# ---------------------------------------------------------------- the hook on the tiny task
@pytest.fixture
def hook_of(tiny_model_dir, tiny_task_dir, compose_config, luffy_overrides, tmp_path):
    """``hook_of(*overrides)`` -> (QuestaHints on the tiny task's train file, its dataset, collate_fn)."""
    from luffy_pool.config.sections import ConfigSections
    from luffy_pool.methods import get_method
    from luffy_pool.methods.hooks import StepContext
    from luffy_pool.methods.questa import QuestaHints
    from luffy_pool.run.launcher import build_dataloader
    from verl.utils.tokenizer import hf_tokenizer

    def make(*extra, steps=2):
        preset = [f"{k}={v}" for k, v in get_method("questa").preset_keys().items()]
        overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), steps=steps)
        sections = ConfigSections.from_config(
            compose_config(overrides + ["algorithm.method=questa"] + preset + list(extra))
        )
        tokenizer = hf_tokenizer(tiny_model_dir)
        loader, _, _, collate = build_dataloader(sections, tokenizer)
        context = StepContext(sections, None, tokenizer, loader.dataset, collate, 2, 48, steps, sections.knobs)
        return QuestaHints(context), loader.dataset, collate

    return make


def _prompt_batch(dataset, collate, items):
    from verl.protocol import DataProto

    batch = DataProto.from_single_dict(collate([dataset[i] for i in items]))
    return batch, batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])


def test_the_hook_writes_each_stages_hinted_prompt_into_the_engines_input(hook_of):
    hook, dataset, collate = hook_of("algorithm.questa.hint_ratios=[1.0,0.5]")
    tok = hook.tokenizer
    for step, ratio, hinted in ((1, 1.0, 1.0), (2, 0.5, 0.0)):  # the tiny solutions ("\n\boxed{58}") have 11 chars
        batch, gen = _prompt_batch(dataset, collate, [0, 1, 2])
        _, metrics = hook.plan_slots(batch, gen, np.zeros((3, 4)), step)
        assert (metrics["questa/hint_ratio"], metrics["questa/stage"], metrics["questa/hinted_share"]) == (
            ratio,
            step - 1,
            hinted,
        )
        for b in range(3):
            record = dataset.dataframe.iloc[b]
            messages = [dict(m) for m in record["prompt"]]
            solution = solution_of(record["target"][0]["content"])
            messages[-1]["content"] = hinted_problem(messages[-1]["content"], solution, ratio)
            want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            got = gen.batch["input_ids"][b][gen.batch["attention_mask"][b].bool()]
            assert tok.decode(got) == want
            assert gen.batch["position_ids"][b][-1].item() == len(got) - 1  # left-padded positions
        assert batch.non_tensor_batch[TRAINABLE].tolist() == [True] * 3
    assert "## Hint.\n\\boxed{" in hook.hinted_prompt(0, 1.0)[0]


def test_the_hook_gates_groups_and_writes_the_advantage_and_the_token_scale(hook_of):
    from verl.protocol import DataProto

    hook, _, _ = hook_of()
    n, width = 4, 3
    scores = [[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1], [1, 0, 0, 0]]  # group 4: answer rule dropped
    lengths = [[3, 2, 1, 3], [1, 1, 1, 1], [2, 2, 2, 2], [1, 3, 2, 2], [3, 3, 3, 3]]
    rows = len(scores) * n
    tls = torch.zeros(rows, width)
    att = torch.zeros(rows, 2 + width, dtype=torch.long)
    att[:, :2] = 1
    for g, (s, ls) in enumerate(zip(scores, lengths)):
        for j in range(n):
            tls[g * n + j, ls[j] - 1] = s[j]
            att[g * n + j, 2 : 2 + ls[j]] = 1
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": tls,
            "attention_mask": att,
            "responses": torch.zeros(rows, width, dtype=torch.long),
            "advantages": torch.zeros(rows, width),
        },
        non_tensors={"uid": np.repeat([f"p{g}" for g in range(5)], n), TRAINABLE: np.repeat([True] * 4 + [False], n)},
    )
    metrics, state = hook.before_update(batch)
    keep = [1.0] * 4 + [0.0] * 8 + [1.0] * 4 + [0.0] * 4  # groups 1 (all solved) and 2 (none) fail the gate
    assert batch.batch["loss_row_mask"].tolist() == keep
    kept = torch.tensor(keep, dtype=torch.bool)
    r = torch.tensor([s for g in scores for s in g], dtype=D)
    want = global_token_advantages(questa_rewards(r), att[:, 2:].to(D), kept).float()
    assert_float_close(batch.batch["advantages"], want)
    tokens = float(att[:, 2:][kept].sum())
    assert state == {TOKEN_SCALE: 2 * 1 / tokens}  # 2 ranks x 1 mini-batch (train_batch_size = mini = 4)
    assert metrics["questa/kept_groups"] == pytest.approx(2 / 5) and metrics["questa/kept_tokens"] == tokens
    assert metrics["questa/success_rate"] == pytest.approx(np.mean([0.25, 1.0, 0.0, 0.75]))


def test_rows_without_their_answer_in_the_solution_keep_their_plain_prompt(hook_of, tiny_task_dir, tmp_path):
    import pandas as pd

    frame = pd.read_parquet(os.path.join(tiny_task_dir, "train.parquet"))
    frame.at[1, "reward_model"] = {"ground_truth": "999", "style": "rule"}  # not in row 1's solution
    frame.to_parquet(tmp_path / "train.parquet")
    hook, dataset, collate = hook_of(f"data.train_files={tmp_path}/train.parquet")
    assert hook.eligible.tolist() == [True, False] + [True] * (len(frame) - 2)
    batch, gen = _prompt_batch(dataset, collate, [0, 1])
    plain = gen.batch["input_ids"][1].clone()
    _, metrics = hook.plan_slots(batch, gen, np.zeros((2, 4)), 1)
    assert torch.equal(gen.batch["input_ids"][1], plain) and metrics["questa/untrained_prompts"] == 1
    assert batch.non_tensor_batch[TRAINABLE].tolist() == [True, False]


def test_an_overlong_hinted_prompt_is_refused_at_start_unless_overlong_prompts_are_filtered(hook_of):
    # the tiny prompts are <= 66 tokens; with the whole solution as hint (p = 1) they pass 70
    hint, short = "algorithm.questa.hint_ratios=[1.0,0.5]", "data.max_prompt_length=70"
    with pytest.raises(
        ValueError, match=r"row 0: its prompt with QuestA's hint at p=1.0 has \d+ tokens > data.max_prompt_length=70"
    ):
        hook_of(hint, short, "data.filter_overlong_prompts=False")
    hook, dataset, collate = hook_of(hint, short)  # filtered: they keep their plain prompt, untrained
    batch, gen = _prompt_batch(dataset, collate, [0, 1])
    plain = gen.batch["input_ids"].clone()
    _, metrics = hook.plan_slots(batch, gen, np.zeros((2, 4)), 1)
    assert torch.equal(gen.batch["input_ids"], plain) and metrics["questa/untrained_prompts"] == 2
    _, metrics = hook.plan_slots(*_prompt_batch(dataset, collate, [0, 1]), np.zeros((2, 4)), 2)  # p = 0.5 fits
    assert metrics["questa/untrained_prompts"] == 0


# ---------------------------------------------------------------- the train file
def _write(tmp_path, rows, **columns):
    import pandas as pd

    path = str(tmp_path / "train.parquet")
    pd.DataFrame(rows if not columns else columns).to_parquet(path)
    return path


def _sections(**knobs):
    return SimpleNamespace(data=SimpleNamespace(target_key="target", off_policy_files=[]), knobs=QuestaKnobs(**knobs))


def test_the_train_file_needs_its_demonstrations_and_one_usable_row(tmp_path):
    target = [{"role": "assistant", "content": "<think>x</think>so 42"}]
    ok = _write(tmp_path, None, target=[target], reward_model=[{"ground_truth": "42"}])
    assert check_solution_column(ok, _sections()) is None
    path = _write(tmp_path, None, prompt=["p"], reward_model=[{"ground_truth": "42"}])
    assert (
        "no column 'target' (data.target_key), the demonstrations algorithm.method=questa cuts"
        in check_solution_column(path, _sections())
    )
    path = _write(tmp_path, None, target=[[{"role": "assistant", "text": "x"}]], reward_model=[{"ground_truth": "42"}])
    assert (
        "row 0: column 'target' must be a list of messages whose first has a 'content' string"
        in check_solution_column(path, _sections())
    )
    path = _write(tmp_path, None, target=[target], reward_model=[{"ground_truth": "41"}])
    assert (
        "no row's solution (column 'target', the text after its last </think>) contains its final answer"
        in check_solution_column(path, _sections())
    )
    assert check_solution_column(path, _sections(require_answer_in_solution=False)) is None
    off = SimpleNamespace(
        data=SimpleNamespace(target_key="target", off_policy_files=["x.parquet"]), knobs=QuestaKnobs()
    )
    assert "unset data.off_policy_files" in check_solution_column(ok, off)


# ---------------------------------------------------------------- the launch script
def test_the_launch_script_states_the_authors_recipe():
    from luffy_pool.run.recipe import read_recipe

    env = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    v = read_recipe(os.path.join(REPO, "exp_scripts", "train_questa.sh"), env).values
    A = "actor_rollout_ref.actor"
    assert {
        "algorithm.method": "questa",
        "algorithm.questa.hint_ratios": "[0.5,0.25]",
        "algorithm.questa.reward_scale": "5.0",
        "algorithm.questa.success_lb": "0.05",
        "algorithm.questa.success_ub": "0.95",
        "actor_rollout_ref.rollout.n": "16",
        "actor_rollout_ref.rollout.n_prefix": "0",
        "data.train_batch_size": "128",
        f"{A}.ppo_mini_batch_size": "128",
        "data.max_response_length": "24000",
        "data.max_prompt_length": "4096",
        f"{A}.optim.lr": "2e-5",
        f"{A}.optim.weight_decay": "0.05",
        f"{A}.optim.betas": "[0.9,0.95]",
        f"{A}.clip_ratio": "0.2",
        f"{A}.entropy_coeff": "0.0",
        f"{A}.use_kl_loss": "False",
        f"{A}.use_off_policy_loss": "False",
        f"{A}.optim.zero_lr_first_step": "False",
        "trainer.stop_one_step_early": "False",
    }.items() <= v.items()
