"""ReLIFT's SFT loss against the authors' ``compute_sft_loss`` (tests/data/family_golden/relift_golden.pt:
TheRoadQaQ/ReLIFT at eb95454f), and its hard-question buffer by hand."""

import os

import pytest
import torch

from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.relift import HardBuffer, ReliftSftConfig, hard_question_uids, relift_sft_loss
from tests.helpers.float_compare import assert_float_close

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

GOLDEN = torch.load(
    os.path.join(os.path.dirname(__file__), "../../data/family_golden/relift_golden.pt"), weights_only=False
)
# float32 losses and gradients are sums whose rounding follows the CPU's vector width: compared within a few ulps
# of their scale (tests/helpers/float_compare.py); ids, masks and schedule values stay exact (order-free).


@pytest.mark.parametrize("i", range(len(GOLDEN["sft"])))
def test_sft_loss_equals_authors(i):
    case = GOLDEN["sft"][i]
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss, metrics = relift_sft_loss(
        FamilyLossInputs(
            log_prob=log_prob, old_log_prob=None, advantages=None, response_mask=case["mask"], entropy=case["entropy"]
        ),
        ReliftSftConfig(entropy_coeff=case["entropy_coeff"]),
    )
    loss.backward()
    assert_float_close(loss.detach(), case["loss"], what="loss")
    assert_float_close(metrics["sft_loss"], case["sft_loss"], what="sft_loss")
    assert_float_close(log_prob.grad, case["grad"], what="grad")


def test_hand_value_sft_loss():
    log_prob = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = relift_sft_loss(
        FamilyLossInputs(log_prob=log_prob, old_log_prob=None, advantages=None, response_mask=mask, entropy=entropy),
        ReliftSftConfig(),
    )
    assert float(loss) == pytest.approx(3.5 / 3 - 0.001 * 2.0)


def test_hard_questions_and_newest_first_buffer():
    scores = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    uids = ["b", "b", "a", "a", "c", "c", "d", "d"]
    assert hard_question_uids(scores, uids) == ["b", "c", "d"]
    buffer = HardBuffer(sft_data_size=4)
    assert not buffer.ready()  # theirs: len(None) crashes on a step with no hard question
    buffer.add(["q1", "q2", "q3"])
    buffer.add([])
    buffer.add(["q4", "q5"])
    assert buffer.ready()
    assert buffer.take() == ["q4", "q5", "q1", "q2"]
    assert buffer.rows == ["q3"] and not buffer.ready()
    restored = HardBuffer(sft_data_size=4)
    restored.load_state_dict(buffer.state_dict())
    assert restored.rows == ["q3"]
    with pytest.raises(ValueError, match="needs 4"):
        restored.take()
    disabled = HardBuffer(sft_data_size=-1)
    disabled.add(["x"])
    assert disabled.rows == [] and not disabled.ready()
