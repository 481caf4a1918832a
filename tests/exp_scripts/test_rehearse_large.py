"""The large-model recipes (train_32b.sh, train_moe.sh): the memory plan of each fits an 80 GB GPU and prints the TP / PP
/ MoE lines, and a layout that does not fit is answered with the smallest one that does. Their 2-step rehearsals (on
their published configs shrunk; train_32b.sh as tp 2 x pp 2 x dp 2 on 8 ranks) run with the others
(tests/exp_scripts/test_rehearse.py)."""

from __future__ import annotations

import os

from luffy_pool.memory_plan.__main__ import main as plan_cli

EXP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "exp_scripts")


def test_32b_plan_fits_80_gb_and_prints_the_tp_and_pp_lines(capsys, monkeypatch):
    for name in ("MODEL_PATH", "ACTOR_PP"):
        monkeypatch.delenv(name, raising=False)
    assert plan_cli([os.path.join(EXP, "train_32b.sh"), "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "actor TP 4, PP 1" in out and "\nTP 4: per rank 10/40 heads, 2/8 kv heads, MLP 6912/27648" in out
    assert "\nPP 1: no pipeline stages" in out and "actor fp32 params / (TP 4 x PP 1 x FSDP 4)" in out
    # ACTOR_PP=2 (the script's pipeline switch): 32 of 64 layers a stage, two micro-batches in flight, still fits
    monkeypatch.setenv("ACTOR_PP", "2")
    assert plan_cli([os.path.join(EXP, "train_32b.sh"), "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "\nPP 2: a stage holds 32 of 64 layers" in out and "x 2 micro-batches in flight (PP 2, 1F1B)" in out
    assert "actor fp32 params / (TP 4 x PP 2 x FSDP 2)" in out


def test_moe_plan_fits_80_gb_and_prints_total_and_active_parameters(capsys, monkeypatch):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    assert plan_cli([os.path.join(EXP, "train_moe.sh"), "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "\nMoE memory: 30.53 B params (every one of the 128 experts of 48 layers is held" in out
    assert "\nMoE compute: 3.35 B active params per token (top-8 routed experts)" in out
    # on one node the update does not fit, and no (tp, pp) layout of 8 GPUs does: the plan says so
    assert plan_cli([os.path.join(EXP, "train_moe.sh"), "--gpu-memory", "80", "--", "trainer.nnodes=1"]) == 1
    assert "no actor (tp, pp) layout on these 8 GPUs fits either" in capsys.readouterr().out


def test_a_layout_that_does_not_fit_names_the_smallest_one_that_does(capsys, monkeypatch):
    for name in ("MODEL_PATH", "ACTOR_PP"):
        monkeypatch.delenv(name, raising=False)
    # 4 nodes, no actor TP, 49152 tokens per GPU: the update's layer working set (full MLP columns) does not fit;
    # tp 2 and pp 2 (the candidates before it) do not either; tp 4 splits the MLP's activations by 4 and fits
    args = ["trainer.nnodes=4", "actor_rollout_ref.actor.tensor_model_parallel_size=1"]
    args.append("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=49152")
    assert plan_cli([os.path.join(EXP, "train_32b.sh"), "--gpu-memory", "80", "--", *args]) == 1
    out = capsys.readouterr().out
    assert "memory plan: the smallest layout that fits on these 32 GPUs is actor TP 4 x PP 1 x DP 8" in out
    assert out.rstrip().endswith(
        "actor_rollout_ref.actor.tensor_model_parallel_size=4 actor_rollout_ref.actor.pipeline_model_parallel_size=1"
    )
