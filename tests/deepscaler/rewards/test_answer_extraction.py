"""Answer extraction: last boxed with brace matching, think splitting, option letters, linear time."""

import time

from deepscaler.rewards.math_utils import (
    choice_letter_of,
    extract_choice_letter,
    extract_final_answer,
    is_choice_ground_truth,
    last_boxed_content,
    split_after_think,
)


def test_last_boxed_takes_the_final_box_and_matches_nested_braces():
    text = r"draft \boxed{1} then \boxed{\frac{1}{\sqrt{2}}} done"
    assert last_boxed_content(text) == r"\frac{1}{\sqrt{2}}"


def test_last_boxed_skips_escaped_braces_and_unclosed_final_box():
    assert last_boxed_content(r"\boxed{\{1,2\}} and \boxed{3") == r"\{1,2\}"


def test_fbox_and_tex_style_box_are_extracted():
    assert last_boxed_content(r"\fbox{7}") == "7"
    assert last_boxed_content(r"$\boxed 42$") == "42"
    assert last_boxed_content(r"\boxedfoo{3}") is None


def test_no_box_gives_none_and_answer_statement_is_the_fallback():
    assert last_boxed_content("The answer is 12.") is None
    assert extract_final_answer("so the final answer is $\\frac{1}{2}$.") == r"\frac{1}{2}"


def test_split_after_think_keeps_text_between_first_and_second_close_tag():
    assert split_after_think("<think>a</think>b</think>c") == "b"
    assert split_after_think("<think>a</think>b") == "b"
    assert split_after_think("no tags") is None


def test_option_letters_from_boxes_and_answer_lines():
    assert choice_letter_of(r"\text{(C)}") == "C"
    assert choice_letter_of("C) Planetary days") == "C"
    assert choice_letter_of("Cat") is None
    assert extract_choice_letter("long reasoning\nANSWER: D") == "D"
    assert extract_choice_letter("the answer is a bit unclear") is None
    assert extract_choice_letter(r"\boxed{B} ... ANSWER: A") == "B"


def test_choice_ground_truths_are_lone_letters_only():
    assert is_choice_ground_truth("C") and is_choice_ground_truth(r"\text{(E)}")
    assert not is_choice_ground_truth("m") and not is_choice_ground_truth("I(0)")
    assert not is_choice_ground_truth("204")


def test_extraction_is_linear_on_pathological_inputs():
    cases = [
        "x" * 1_000_000 + r"\boxed{5}",
        r"\boxed{" * 150_000,  # a megabyte of unclosed boxes
        r"\boxed{" + "{" * 200_000 + "}" * 200_000 + "}",  # very deep nesting
        ("answer is " * 100_000),
    ]
    start = time.perf_counter()
    results = [extract_final_answer(c) for c in cases]
    assert results[0] == "5" and results[1] is None and results[2] is None
    assert time.perf_counter() - start < 10.0
