"""Golden generator for UFT (test tooling; never imported by the package).

Extracts ``verl/utils/torch_functional.py`` (``tokenize_and_postprocess_data``, ``pad_sequence_to_length``) and,
by AST, ``RLHFDataset.__getitem__`` from ``verl/utils/dataset/rl_dataset.py`` of a liumy2010/UFT checkout and
runs ``__getitem__`` on a stand-in dataset object (a pandas frame with ``prompt`` and ``hint`` columns and the
``trainer`` config keys it reads) with the project's tiny byte-level BPE tokenizer, saved next to the golden
file. ``compute_position_id_with_mask`` is their one-line body. Global ``np.random`` is seeded per item.

Usage: python uft_gen.py GIT_DIR WORK_DIR OUT_DIR
"""
import ast
import os
import sys
import textwrap
import types

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _authors  # noqa: E402

git_dir, work, out_dir = sys.argv[1:4]
COMMIT = "ad3c8ec7d258d4e4cf3f359dd75925d0f127a520"


def show(path):
    return _authors.show(git_dir, COMMIT, path)


write = _authors.write


os.makedirs(os.path.join(work, "uft_verl"), exist_ok=True)
with open(os.path.join(work, "uft_verl", "uft_torch_functional.py"), "w") as f:
    f.write(show("verl/utils/torch_functional.py"))
sys.path.insert(0, os.path.join(work, "uft_verl"))
import uft_torch_functional as verl_F  # noqa: E402

source = show("verl/utils/dataset/rl_dataset.py")
node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "__getitem__")
namespace = {"np": np, "verl_F": verl_F,
             "compute_position_id_with_mask": lambda mask: torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0, max=None)}
exec(compile(textwrap.dedent(" " * node.col_offset + ast.get_source_segment(source, node)), "__getitem__", "exec"),
     namespace)
getitem = namespace["__getitem__"]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
from luffy_pool.tiny.model import build_tokenizer  # noqa: E402

tok_dir = os.path.join(out_dir, "uft_tokenizer")
tokenizer = build_tokenizer(tok_dir)

solutions = [["Compute 12 + 30.\n", "12 + 30 = 42.\n", "So the answer is 42."],
             ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"],
             ["Step one: 7 * 6 = 42\n", "Step two: 42 - 2 = 40\n"],
             ["only one segment"],
             [f"line {i}: {i} * {i} = {i * i}\n" for i in range(8)]]
prompts = ["What is 12 + 30?", "Spell the alphabet", "Compute 7 * 6 - 2.", "Say it.", "List squares."]
frame = pd.DataFrame({"prompt": [[{"role": "user", "content": p}] for p in prompts],
                      "hint": [np.array(s, dtype=object) for s in solutions]})
out = {"commit": COMMIT, "items": []}
for schedule in ("cosine", "stage", "uniform"):
    for timestep in (1, 40, 75, 150, 233, 299, 300, 301, 500):
        for item in range(len(frame)):
            seed = 1000 * timestep + 10 * item + len(schedule)
            cfg = types.SimpleNamespace(trainer=types.SimpleNamespace(
                uniform_sampling=schedule == "uniform", stage=schedule == "stage", total_training_steps_hint=300,
                lower_prob=0.05, upper_prob=0.95))
            dataset = types.SimpleNamespace(dataframe=frame, prompt_key="prompt", tokenizer=tokenizer,
                                            max_prompt_length=96, truncation="right", is_eval=False,
                                            timestep=timestep, config=cfg, return_raw_chat=False)
            np.random.seed(seed)
            row = getitem(dataset, item)
            out["items"].append({"schedule": schedule, "timestep": timestep, "item": item, "seed": seed,
                                 "prompt": prompts[item], "hint": solutions[item],
                                 "input_ids": row["input_ids"], "attention_mask": row["attention_mask"],
                                 "hint_mask": row["hint_mask"], "hint_slice_prop": float(row["hint_slice_prop"])})
# truncation paths of tokenize_and_postprocess_data
for truncation, max_length in [("left", 12), ("right", 12), ("right", 40)]:
    ids, mask, hint_ids, hint_mask = verl_F.tokenize_and_postprocess_data(
        prompt="What is 12 + 30?", tokenizer=tokenizer, max_length=max_length, pad_token_id=tokenizer.pad_token_id,
        left_pad=True, truncation=truncation, hint_prompt="12 + 30 = 42. So 42.")
    out.setdefault("tokenize", []).append({"truncation": truncation, "max_length": max_length, "input_ids": ids,
                                           "attention_mask": mask, "hint_ids": hint_ids, "hint_mask": hint_mask})
# the hint cross-entropy lines of verl/workers/actor/dp_actor.py update_policy, restated, with their masked_mean
loss_fct = torch.nn.CrossEntropyLoss(reduction="none")
g = torch.Generator().manual_seed(31)
for rows, width, vocab_size in ((3, 20, 64), (2, 12, 50), (4, 16, 64)):
    # hint on the last `h` prompt tokens: the mask layout tokenize_and_postprocess_data builds
    input_ids = torch.randint(0, vocab_size, (rows, width), generator=g)
    hint_mask_full = torch.zeros(rows, width, dtype=torch.long)
    for r in range(rows):
        h = int(torch.randint(0, width // 2, (1,), generator=g))
        if h and r != rows - 1:  # the last row carries no hint
            hint_mask_full[r, -h - 1:-1] = 1
    prompt_logits = torch.randn(rows, width, vocab_size, generator=g) * 60.0
    pl = prompt_logits.clone().requires_grad_(True)
    hint_mask = hint_mask_full[:, :-1]
    shift_logits = pl[:, :-1, :].contiguous()
    shift_labels = input_ids[:, 1:].contiguous()  # their input_ids[:, 1:-response_length] with no response here
    shift_logits = shift_logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_logits_clamp = torch.clamp(shift_logits, min=-100, max=100)
    sft_loss = loss_fct(shift_logits_clamp, shift_labels)
    sft_loss = verl_F.masked_mean(sft_loss, hint_mask.reshape(-1))
    sft_loss.backward()
    out.setdefault("hint_nll", []).append({"prompt_logits": prompt_logits, "input_ids": input_ids,
                                           "hint_mask": hint_mask_full, "loss": sft_loss.detach(),
                                           "grad": pl.grad.clone()})
torch.save(out, os.path.join(out_dir, "uft_golden.pt"))
print("wrote", len(out["items"]), len(out["tokenize"]))
