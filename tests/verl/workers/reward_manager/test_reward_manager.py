"""RewardManager: decode valid response tokens, score, place the score on the last valid token."""

import re
import types

import pytest
import torch
from omegaconf import OmegaConf

from deepscaler.rewards.orm import OrmConfig, OrmJudge
from verl.protocol import DataProto
from verl.workers.reward_manager import RewardManager


@pytest.fixture(scope="module")
def tokenizer():
    from luffy_pool.tiny import build_tokenizer

    return build_tokenizer()


def make_batch(tokenizer, prompts, responses, ground_truths, response_len=40, prompt_len=16):
    """Left-padded prompts ++ right-padded responses, like the rollout's output."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask, resp_ids, resp_mask = [], [], [], []
    for prompt, response in zip(prompts, responses):
        p = tokenizer(prompt)["input_ids"][-prompt_len:]
        r = tokenizer(response)["input_ids"][:response_len] if response else []
        prompt_ids.append([pad] * (prompt_len - len(p)) + p)
        prompt_mask.append([0] * (prompt_len - len(p)) + [1] * len(p))
        resp_ids.append(r + [pad] * (response_len - len(r)))
        resp_mask.append([1] * len(r) + [0] * (response_len - len(r)))
    n = len(prompts)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompt_ids),
            "responses": torch.tensor(resp_ids),
            "input_ids": torch.cat([torch.tensor(prompt_ids), torch.tensor(resp_ids)], dim=1),
            "attention_mask": torch.cat([torch.tensor(prompt_mask), torch.tensor(resp_mask)], dim=1),
        },
        non_tensors={
            "data_source": ["synthetic_arith"] * n,
            "reward_model": [{"ground_truth": gt, "style": "rule"} for gt in ground_truths],
            "extra_info": [{"index": i, "split": "train"} for i in range(n)],
        },
    )


RIGHT = "<think>\n12 + 30 = 42.\n</think>\nThe answer is \\boxed{42}.<|im_end|>"
WRONG = "<think>\n12 + 30 = 43.\n</think>\nThe answer is \\boxed{43}.<|im_end|>"
NO_CLOSE = "12 + 30 is \\boxed{42}<|im_end|>"


def test_score_sits_on_the_last_valid_token_and_everything_else_is_zero(tokenizer):
    data = make_batch(tokenizer, ["What is 12 + 30?"] * 4, [RIGHT, WRONG, NO_CLOSE, ""], ["42"] * 4)
    with RewardManager(tokenizer, reward_impl_version=1, num_workers=1, timeout_s=30.0) as manager:
        scores, metrics = manager(data)
    valid = data.batch["attention_mask"][:, -40:].sum(-1)
    assert scores.dtype == torch.float32 and scores.shape == (4, 40)
    expected = [1.0, -0.5, -1.0]  # version 1: correct, wrong, no </think>
    for i, value in enumerate(expected):
        assert scores[i, valid[i] - 1].item() == value
        assert torch.count_nonzero(scores[i]).item() == 1
    assert torch.count_nonzero(scores[3]).item() == 0  # empty response: no token to carry a score
    assert metrics["reward/parse_fail_count"] == 2.0 and metrics["reward/timeout_count"] == 0.0
    assert metrics["reward/score_time_s"] > 0.0


def test_decoding_keeps_special_tokens_and_only_valid_response_tokens(tokenizer):
    seen = []

    def record(data_source, text, ground_truth, extra_info=None):
        seen.append((data_source, text, ground_truth, extra_info["index"]))
        return 0.0

    data = make_batch(tokenizer, ["What is 12 + 30?"] * 2, [RIGHT, WRONG], ["42", "7"])
    with RewardManager(tokenizer, num_workers=0, compute_score=record) as manager:
        manager(data)
    assert seen == [("synthetic_arith", RIGHT, "42", 0), ("synthetic_arith", WRONG, "7", 1)]


def test_from_config_reads_the_reward_group_and_rejects_unknown_keys(tokenizer):
    cfg = OmegaConf.create(
        {
            "num_workers": 0,
            "timeout_s": 5.0,
            "grader": "rule",
            "format_reward": {"enable": True, "weight": 1.0, "mode": "multiply"},
            "orm": {
                "enable": False,
                "base_url": None,
                "model": None,
                "api_key_env": "OPENAI_API_KEY",
                "timeout_s": 30,
                "max_retries": 3,
                "requests_per_second": 5,
                "cache_path": None,
            },
        }
    )
    with RewardManager.from_config(cfg, reward_impl_version=3, tokenizer=tokenizer) as manager:
        assert manager.spec.grader == "rule" and manager.pool.timeout_s == 5.0
        scores, metrics = manager.score_texts(
            [("math", RIGHT[len("<think>\n") :], "42", None), ("math", "no think block \\boxed{42}", "42", None)]
        )
    # v3 prepends "<think>\n"; the first is well formed, the second fails format (and has no </think>).
    assert scores == [1.0, 0.0] and metrics["reward/format_ok_rate"] == 0.5
    with pytest.raises(ValueError, match="num_worker"):
        RewardManager.from_config({"num_worker": 2}, 3, tokenizer)
    with pytest.raises(ValueError, match=r"reward.orm.*base_ur"):
        RewardManager.from_config({"orm": {"base_ur": "x"}}, 3, tokenizer)
    with pytest.raises(ValueError, match="reward_impl_version"):
        RewardManager.from_config({}, 9, tokenizer)


class _YesCompletions:
    def __init__(self):
        self.messages = []

    def create(self, **kwargs):
        self.messages.append(kwargs["messages"])
        msg = types.SimpleNamespace(content="They agree. [[YES]]")
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=msg)])


def test_judge_turns_a_wrong_answer_right_and_sees_the_decoded_problem(tokenizer):
    data = make_batch(tokenizer, ["What is 12 + 30?"] * 2, [RIGHT, WRONG], ["42", "42"])
    with RewardManager(tokenizer, reward_impl_version=1, num_workers=0) as manager:
        completions = _YesCompletions()
        config = OrmConfig(enable=True, base_url="http://127.0.0.1:9/v1", model="judge", requests_per_second=1000)
        manager.judge = OrmJudge(
            config, client=types.SimpleNamespace(chat=types.SimpleNamespace(completions=completions))
        )
        scores, metrics = manager(data)
    valid = data.batch["attention_mask"][:, -40:].sum(-1)
    assert scores[1, valid[1] - 1].item() == 1.0  # v1 success value after a [[YES]]
    assert metrics["reward/orm_calls"] == 1.0 and metrics["reward/orm_yes"] == 1.0
    user = completions.messages[0][1]["content"]
    assert "What is 12 + 30?" in user and "\\boxed{43}" in user and "Reference answer:\n42" in user


def test_custom_compute_score_cannot_be_combined_with_the_judge(tokenizer):
    orm = {"enable": True, "base_url": "http://127.0.0.1:9/v1", "model": "judge"}
    with pytest.raises(ValueError, match="compute_score"):
        RewardManager(tokenizer, num_workers=0, orm=orm, compute_score=lambda *a: 0.0)


# ---------------------------------------------------------------------- a dead judge is loud
class _DeadCompletions:
    """An endpoint that refuses every connection."""

    def __init__(self):
        self.calls = 0

    def create(self, **kwargs):
        import httpx
        import openai

        self.calls += 1
        raise openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))


def _dead_judge_manager(tokenizer, **orm):
    manager = RewardManager(tokenizer, reward_impl_version=1, num_workers=0)
    config = OrmConfig(
        enable=True, base_url="http://127.0.0.1:9/v1", model="judge", requests_per_second=1000, max_retries=0, **orm
    )
    completions = _DeadCompletions()
    manager.judge = OrmJudge(config, client=types.SimpleNamespace(chat=types.SimpleNamespace(completions=completions)))
    return manager, completions


def test_dead_judge_raises_naming_endpoint_and_last_error(tokenizer):
    from deepscaler.rewards.orm import JudgeUnavailableError

    data = make_batch(tokenizer, ["What is 12 + 30?"] * 40, [WRONG] * 40, ["42"] * 40)
    manager, completions = _dead_judge_manager(tokenizer)
    with manager, pytest.raises(JudgeUnavailableError) as err:
        manager(data)
    msg = str(err.value)
    assert (
        re.search(
            r"40 of 40 judge calls failed this step \(\d+ skipped after repeated failures\) \(more than "
            r"max_failure_rate=0.5\)",
            msg,
        )
        and "\n" not in msg
    )
    assert "endpoint http://127.0.0.1:9/v1" in msg and "last error: APIConnectionError: Connection error." in msg
    assert completions.calls <= 2 * 16, "once the endpoint is seen down, the calls not yet started are skipped"


def test_dead_judge_in_warn_mode_logs_every_step_and_keeps_grader_scores(tokenizer, caplog):
    data = make_batch(tokenizer, ["What is 12 + 30?"] * 4, [RIGHT, WRONG, WRONG, WRONG], ["42"] * 4)
    manager, _ = _dead_judge_manager(tokenizer, on_failure="warn")
    with manager, caplog.at_level("WARNING", logger="deepscaler.rewards.orm"):
        for _ in range(2):
            scores, metrics = manager(data)
    warnings = [r.getMessage() for r in caplog.records if "judge calls failed" in r.getMessage()]
    assert len(warnings) == 2 and "3 of 3" in warnings[0] and "endpoint http://127.0.0.1:9/v1" in warnings[0]
    assert metrics["reward/orm_fail_rate"] == 1.0 and metrics["reward/orm_fail_count"] == 3.0
    assert scores.sum(-1).tolist() == [1.0, -0.5, -0.5, -0.5]  # v1 values: the grader's verdicts stand


def test_judge_failures_within_the_rate_pass_quietly(tokenizer, caplog):
    manager, _ = _dead_judge_manager(tokenizer, max_failure_rate=1.0)
    data = make_batch(tokenizer, ["What is 12 + 30?"] * 2, [WRONG, WRONG], ["42"] * 2)
    with manager, caplog.at_level("WARNING"):
        _, metrics = manager(data)
    assert metrics["reward/orm_fail_rate"] == 1.0 and "judge calls failed" not in caplog.text


def test_failure_policy_keys_are_validated():
    with pytest.raises(ValueError, match="reward.orm.on_failure must be one of"):
        OrmConfig(on_failure="ignore")
    with pytest.raises(ValueError, match=r"reward.orm.max_failure_rate must be in \[0, 1\]"):
        OrmConfig(max_failure_rate=2.0)


def test_a_judge_that_answers_is_never_skipped(tokenizer):
    import itertools
    import threading

    class Flaky(_DeadCompletions):  # every other call fails
        def __init__(self):
            super().__init__()
            self.turn = itertools.cycle([True, False])
            self.lock = threading.Lock()

        def create(self, **kwargs):
            with self.lock:
                ok = next(self.turn)
            if ok:
                self.calls += 1
                msg = types.SimpleNamespace(content="[[NO]]")
                return types.SimpleNamespace(choices=[types.SimpleNamespace(message=msg)])
            return super().create(**kwargs)

    manager, _ = _dead_judge_manager(tokenizer, max_failure_rate=0.6)
    manager.judge._client.chat.completions = flaky = Flaky()
    wrong = [WRONG.replace("43", str(100 + i)) for i in range(40)]  # distinct, so the verdict cache cannot answer
    data = make_batch(tokenizer, ["What is 12 + 30?"] * 40, wrong, ["42"] * 40)
    with manager:
        _, metrics = manager(data)
    assert flaky.calls == 40 and metrics["reward/orm_fail_rate"] == 0.5


def test_limit_hits_are_counted_in_the_training_metrics(tokenizer):
    tower = "x\n</think>\n\\boxed{9^{9^{9^{9^{9}}}}}"
    right = RIGHT[len("<think>\n") :]
    cfg = OmegaConf.create({"num_workers": 0, "grade_budget_s": 3.0})
    with RewardManager.from_config(cfg, reward_impl_version=3, tokenizer=tokenizer) as manager:
        scores, metrics = manager.score_texts([("math", tower, "2"), ("math", right, "42")])
    assert scores == [0.0, 1.0]
    assert (
        metrics["reward/unparseable_count"],
        metrics["reward/parse_fail_count"],
        metrics["reward/timeout_count"],
    ) == (1.0, 1.0, 0.0)
    # A spent in-process budget is a timeout, counted like the pool's own timeouts.
    with RewardManager(tokenizer, reward_impl_version=3, num_workers=0, grade_budget_s=1e-6) as manager:
        scores, metrics = manager.score_texts([("math", right, "42"), ("math", "no think tag", "42")])
    assert scores == [0.0, 0.0] and metrics["reward/timeout_count"] == 1.0


def test_null_num_workers_scales_with_the_nodes_cores_on_cuda_and_stays_2_on_cpu():
    from verl.workers.reward_manager.reward_manager import default_num_workers

    # a quarter of the cores, at least 2, at most 32
    assert [default_num_workers("cuda", cores) for cores in (2, 8, 9, 16, 100, 128, 256)] == [2, 2, 2, 4, 25, 32, 32]
    assert default_num_workers("cpu", 256) == 2  # a CPU run's cores are its ranks'


def test_from_config_takes_null_num_workers_from_the_device(tokenizer, monkeypatch):
    import verl.workers.reward_manager.reward_manager as rm

    started = []

    class RecordingPool:  # what the manager asks for, without starting 25 grader processes
        def __init__(self, scorer, num_workers, timeout_s, start_method):
            started.append(num_workers)

    monkeypatch.setattr(rm, "ScoringPool", RecordingPool)
    monkeypatch.setattr(rm, "available_cores", lambda: 100)
    rm.RewardManager.from_config({"num_workers": None}, 3, tokenizer, device="cuda")
    rm.RewardManager.from_config({}, 3, tokenizer, device="cuda")
    rm.RewardManager.from_config({"num_workers": None}, 3, tokenizer, device="cpu")
    rm.RewardManager.from_config({"num_workers": 7}, 3, tokenizer, device="cuda")  # a number is kept
    assert started == [25, 25, 2, 7]
