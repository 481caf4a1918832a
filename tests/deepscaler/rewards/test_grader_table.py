"""Table test of the rule-based grader on answers shaped like the benchmark ground truths.

Ground truths are copied from data/benchmarks (AIME, AMC, MATH-500, Minerva, OlympiadBench,
ARC-c/GPQA letters); predictions are equivalent forms and near misses. Each case is a full response
graded through ``grade(..., grader="rule", split_think=True)``.
"""
import pytest

from deepscaler.rewards import grade


def boxed(answer: str) -> str:
    return f"<think>\nLet me work this out.\n</think>\nTherefore the final answer is $\\boxed{{{answer}}}$."


def raw(text: str) -> str:
    return f"<think>\nworking\n</think>\n{text}"


T, F = True, False

# (response, ground truth, expected)
CASES = [
    # --- AIME: zero-padded integers
    (boxed("204"), "204", T), (boxed("205"), "204", F), (boxed("25"), "025", T), (boxed("025"), "025", T),
    (boxed("73"), "073", T), (boxed("73.5"), "073", F), (boxed("33"), "033", T), (boxed("330"), "033", F),
    (boxed("204 \\text{ minutes}"), "204", T), (boxed("809"), "809", T),
    # --- AMC: float-like ground truths
    (boxed("142"), "142.0", T), (boxed("142.0"), "142.0", T), (boxed("-4"), "-4.0", T), (boxed("4"), "-4.0", F),
    (boxed("0"), "0.0", T), (boxed("3,159"), "3159.0", T), (boxed("8178"), "8178.0", T),
    (boxed("8187"), "8178.0", F), (boxed("\\frac{284}{2}"), "142.0", F),
    # --- MATH-500
    (boxed("(3, \\frac{\\pi}{2})"), "\\left( 3, \\frac{\\pi}{2} \\right)", T),
    (boxed("\\left(3,\\frac{\\pi}{2}\\right)"), "\\left( 3, \\frac{\\pi}{2} \\right)", T),
    (boxed("(3, \\pi/2)"), "\\left( 3, \\frac{\\pi}{2} \\right)", T),
    (boxed("(\\frac{\\pi}{2}, 3)"), "\\left( 3, \\frac{\\pi}{2} \\right)", F),
    (boxed("p-q"), "p - q", T), (boxed("-q + p"), "p - q", T), (boxed("q - p"), "p - q", F),
    (boxed("14/3"), "\\frac{14}{3}", T), (boxed("\\dfrac{14}{3}"), "\\frac{14}{3}", T),
    (boxed("4\\frac{2}{3}"), "\\frac{14}{3}", T), (boxed("4.67"), "\\frac{14}{3}", F),
    (boxed("\\frac{28}{6}"), "\\frac{14}{3}", F),
    (boxed("9.0"), "9", T), (boxed("\\text{9}"), "9", T), (boxed("-9"), "9", F),
    (boxed("Evelyn"), "\\text{Evelyn}", T), (boxed("\\text{evelyn}"), "\\text{Evelyn}", T),
    (boxed("\\text{Emily}"), "\\text{Evelyn}", F),
    (boxed("90"), "90^\\circ", T), (boxed("90^{\\circ}"), "90^\\circ", T), (boxed("90°"), "90^\\circ", T),
    (boxed("45^\\circ"), "90^\\circ", F),
    (boxed("\\sqrt{117}"), "3\\sqrt{13}", T), (boxed("3 \\sqrt {13}"), "3\\sqrt{13}", T),
    (boxed("13\\sqrt{3}"), "3\\sqrt{13}", F),
    (boxed("3/56"), "\\frac{3}{56}", T), (boxed("\\frac{6}{112}"), "\\frac{3}{56}", F),
    (boxed("0.0536"), "\\frac{3}{56}", F),
    (boxed("6-5i"), "6 - 5i", T), (boxed("-5i+6"), "6 - 5i", T), (boxed("6+5i"), "6 - 5i", F),
    (boxed("\\pi"), "\\pi", T), (boxed("3.14"), "\\pi", F),
    (boxed("5"), "x=5", T), (boxed("x = 5"), "x=5", T), (boxed("x=-5"), "x=5", F),
    (boxed("-2, 1"), "1,-2", T), (boxed("x=1, x=-2"), "1,-2", T), (boxed("1"), "1,-2", F),
    (boxed("1, 2"), "1,-2", F),
    (boxed("52_8"), "52_8", T), (boxed("52_{8}"), "52_8", T), (boxed("52"), "52_8", F), (boxed("42_8"), "52_8", F),
    (boxed("11\\sqrt{2}"), "11\\sqrt2", T), (boxed("\\sqrt{242}"), "11\\sqrt2", T), (boxed("11\\sqrt{3}"), "11\\sqrt2", F),
    (boxed("0.3888"), "\\frac{243}{625}", T), (boxed("243/625"), "\\frac{243}{625}", T),
    (boxed("7, 5, 3"), "3, 5, 7", T), (boxed("3, 5"), "3, 5, 7", F),
    (boxed("\\frac{5}{4}"), "1.25", T), (boxed("1.250"), "1.25", T), (boxed("1.2"), "1.25", F),
    (boxed("-x^4+x^5+x^3-x^2+x-1"), "x^5 - x^4 + x^3 - x^2 + x - 1", T),
    (boxed("x^5-x^4+x^3-x^2+x+1"), "x^5 - x^4 + x^3 - x^2 + x - 1", F),
    (boxed("-\\pi/6"), "-\\frac{\\pi}{6}", T), (boxed("\\frac{-\\pi}{6}"), "-\\frac{\\pi}{6}", T),
    (boxed("\\frac{\\pi}{6}"), "-\\frac{\\pi}{6}", F),
    (boxed("\\frac{3}{20}"), "0.15", T), (boxed("15\\%"), "0.15", T), (boxed("0.015"), "0.15", F),
    (boxed("(6, 31, -1)"), "(6,31,-1)", T), (boxed("(6,-1,31)"), "(6,31,-1)", F),
    (boxed("3x + x^3 - 6"), "x^3+3x-6", T), (boxed("x^3+3x+6"), "x^3+3x-6", F),
    (boxed("40_9"), "40_9", T), (boxed("36"), "40_9", F),
    (boxed("\\frac{3}{4}\\sqrt{3}"), "\\frac{3\\sqrt{3}}{4}", T),
    (boxed("\\frac{\\sqrt{27}}{4}"), "\\frac{3\\sqrt{3}}{4}", T),
    (boxed("\\frac{3\\sqrt{2}}{4}"), "\\frac{3\\sqrt{3}}{4}", F),
    (boxed("\\frac{\\cos x}{\\sin x}"), "\\cot x", T), (boxed("\\tan x"), "\\cot x", F),
    (boxed("(-2, 1)"), "(-2,1)", T), (boxed("(1,-2)"), "(-2,1)", F), (boxed("[-2,1)"), "(-2,1)", F),
    (boxed("1+\\sqrt{19}, 1-\\sqrt{19}"), "1 \\pm \\sqrt{19}", T), (boxed("1 \\pm \\sqrt{19}"), "1 \\pm \\sqrt{19}", T),
    (boxed("1+\\sqrt{19}"), "1 \\pm \\sqrt{19}", F),
    (boxed("East"), "\\text{east}", T), (boxed("\\text{west}"), "\\text{east}", F),
    (boxed("2(k+1)"), "2k+2", T), (boxed("2k+1"), "2k+2", F),
    (boxed("\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}"),
     "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", T),
    (boxed("\\begin{bmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{bmatrix}"), "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", T),
    (boxed("\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 4/3 \\end{pmatrix}"), "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", F),
    (boxed("(-1/3, 2/3, 5/3)"), "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", F),
    (boxed("\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}"), "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", T),
    (boxed("\\begin{pmatrix}-1&0\\\\0&1\\end{pmatrix}"), "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", F),
    (boxed("145"), "145^\\circ", T), (boxed("135^\\circ"), "145^\\circ", F),
    (boxed("(b+2)(a+5)"), "(a+5)(b+2)", T), (boxed("(a+2)(b+5)"), "(a+5)(b+2)", F),
    (boxed("(3, 4]"), "(3,4]", T), (boxed("(3,4)"), "(3,4]", F), (boxed("[3,4]"), "(3,4]", F),
    (boxed("\\frac{4}{3}"), "\\frac43", T), (boxed("1\\frac{1}{3}"), "\\frac43", T), (boxed("\\frac{3}{4}"), "\\frac43", F),
    (boxed("even"), "\\text{even}", T), (boxed("\\text{odd}"), "\\text{even}", F),
    (boxed("274i + 1"), "1+274i", T), (boxed("1-274i"), "1+274i", F),
    (boxed("4210_5"), "4210_{5}", T), (boxed("4210"), "4210_{5}", F),
    (boxed("3840/289"), "\\frac{3840}{289}", T), (boxed("\\frac{3840}{298}"), "\\frac{3840}{289}", F),
    (boxed("\\sqrt{45}"), "3 \\sqrt{5}", T), (boxed("(-29, 15)"), "(15,-29)", F), (boxed("(15, -29)"), "(15,-29)", T),
    (boxed("\\frac{1}{\\sqrt{3}}"), "\\frac{\\sqrt{3}}{3}", T), (boxed("\\frac{\\sqrt{3}}{2}"), "\\frac{\\sqrt{3}}{3}", F),
    (boxed("1.2"), "\\frac65", T), (boxed("\\frac{5}{6}"), "\\frac65", F),
    (boxed("3.210"), "3.21", T), (boxed("3.2"), "3.21", F),
    (boxed("0.34"), "\\dfrac{17}{50}", T), (boxed("\\frac{17}{5}"), "\\dfrac{17}{50}", F),
    (boxed("\\frac{270}{7}"), "\\frac{270}7\\text{ degrees}", T), (boxed("\\frac{270}{7}^\\circ"), "\\frac{270}7\\text{ degrees}", T),
    (boxed("38.57"), "\\frac{270}7\\text{ degrees}", F),
    (boxed("0.0000672"), ".0000672", T), (boxed("6.72 \\times 10^{-5}"), ".0000672", T), (boxed("0.000672"), ".0000672", F),
    (boxed("-5x+7y-11z-4=0"), "5x - 7y + 11z + 4 = 0", T), (boxed("5x-7y+11z-4=0"), "5x - 7y + 11z + 4 = 0", F),
    (boxed("10080"), "10,\\!080", T), (boxed("10,080"), "10,\\!080", T), (boxed("10800"), "10,\\!080", F),
    (boxed("11,111,111,100"), "11,\\! 111,\\! 111,\\! 100", T),
    (boxed("(2, \\infty)"), "(2,\\infty)", T), (boxed("[2,\\infty)"), "(2,\\infty)", F),
    (boxed("C"), "\\text{(C)}", T), (boxed("(C)"), "\\text{(C)}", T), (boxed("\\text{D}"), "\\text{(C)}", F),
    (boxed("288\\pi"), "288 \\pi", T), (boxed("904.78"), "288 \\pi", F),
    (boxed("32348"), "\\$32,\\!348", T), (boxed("\\$32,348"), "\\$32,\\!348", T), (boxed("32,438"), "\\$32,\\!348", F),
    (boxed("864"), "864 \\mbox{ inches}^2", T), (boxed("864 \\text{ square inches}"), "864 \\mbox{ inches}^2", T),
    (boxed("1.8"), "1\\frac{4}{5}", T), (boxed("\\frac{9}{5}"), "1\\frac{4}{5}", T), (boxed("\\frac{4}{5}"), "1\\frac{4}{5}", F),
    (boxed("2\\pi+18"), "18+2\\pi", T), (boxed("18+\\pi"), "18+2\\pi", F),
    (boxed("3+2\\sqrt{2}, 3-2\\sqrt{2}"), "3 \\pm 2 \\sqrt{2}", T), (boxed("3+2\\sqrt{2}"), "3 \\pm 2 \\sqrt{2}", F),
    (boxed("(3/5, 8/3]"), "\\left(\\frac{3}{5},\\frac{8}{3}\\right]", T),
    (boxed("(\\frac{3}{5}, \\frac{8}{3})"), "\\left(\\frac{3}{5},\\frac{8}{3}\\right]", F),
    (boxed("(-\\infty,0]"), "(-\\infty, 0]", T), (boxed("(-\\infty, 0)"), "(-\\infty, 0]", F),
    (boxed("\\frac{9a+11}{20}"), "\\frac{11+9a}{20}", T), (boxed("\\frac{11+9a}{2}"), "\\frac{11+9a}{20}", F),
    (boxed("58500"), "58,500", T), (boxed("2(3r^2-2r-12)"), "6r^2-4r-24", T), (boxed("6r^2-4r+24"), "6r^2-4r-24", F),
    (boxed("(1, -16, -4, 43)"), "(1,-16,-4,43)", T), (boxed("(1,-16,4,43)"), "(1,-16,-4,43)", F),
    (boxed("(0,9)\\cup(9,36)"), "(0,9) \\cup (9,36)", T), (boxed("(0,36)"), "(0,9) \\cup (9,36)", F),
    (boxed("[-2, 7]"), "x \\in [-2,7]", T), (boxed("(-2,7)"), "x \\in [-2,7]", F),
    (boxed("-2, 1+\\sqrt{5}, 1-\\sqrt{5}"), "\\{1\\pm\\sqrt{5},-2\\}", T),
    (boxed("1+\\sqrt{5}, -2"), "\\{1\\pm\\sqrt{5},-2\\}", F),
    (boxed("[\\pi^2/8, 5\\pi^2/4]"), "\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", T),
    (boxed("(3, \\infty) \\cup (-\\infty, 2)"), "(-\\infty, 2) \\cup (3, \\infty)", T),
    (boxed("(-\\infty,2]\\cup(3,\\infty)"), "(-\\infty, 2) \\cup (3, \\infty)", F),
    (boxed("2x+3"), "y = 2x + 3", T), (boxed("y = 3 + 2x"), "y = 2x + 3", T), (boxed("y=2x-3"), "y = 2x + 3", F),
    (boxed("18.9"), "\\$18.90", T), (boxed("\\$18.09"), "\\$18.90", F),
    (boxed("137.5"), "137 \\frac{1}{2}", T), (boxed("137"), "137 \\frac{1}{2}", F),
    (boxed("15"), "15\\mbox{ cm}^2", T), (boxed("5.4 \\text{ cents}"), "5.4 \\text{ cents}", T), (boxed("54"), "5.4 \\text{ cents}", F),
    (boxed("-2x"), "y = -2x", T), (boxed("y=2x"), "y = -2x", F),
    (boxed("\\text{Ellipse}"), "\\text{ellipse}", T), (boxed("hyperbola"), "\\text{ellipse}", F),
    # --- Minerva
    (boxed("4.5 \\times 10^{33}"), "4.5e33", T), (boxed("4.5\\cdot10^{33}"), "4.5e33", T),
    (boxed("4.6 \\times 10^{33}"), "4.5e33", F), (boxed("4.5 \\times 10^{32}"), "4.5e33", F),
    (boxed("1.60"), "1.6", T), (boxed("1.7"), "1.6", F),
    (boxed("\\arcsin\\left(\\frac{10}{13}\\right)"), "np.arcsin(10/13)", T), (boxed("\\arccos(10/13)"), "np.arcsin(10/13)", F),
    (boxed("-\\frac{1}{3}"), "-1./3", T), (boxed("-0.333"), "-1./3", F),
    (boxed("2.7778 \\times 10^{-6}"), "2.7778e-6", T), (boxed("75000000"), "7.5e7", T), (boxed("10^{-5}"), "1e-5", T),
    (boxed("\\frac{e^t}{3}"), "e^{t} / 3", T), (boxed("e^{3t}"), "e^{t} / 3", F),
    (boxed("\\ln(2) + \\frac{i\\pi}{3}"), "\\ln 2 + i\\pi / 3", T),
    (boxed("1 + i\\sqrt{3}"), "1+\\sqrt{3} i", T), (boxed("1-\\sqrt{3}i"), "1+\\sqrt{3} i", F),
    (boxed("\\frac{2\\pi}{\\omega}"), "2 \\pi / \\omega", T), (boxed("1/(s+a)"), "\\frac{1}{s+a}", T),
    (boxed("\\frac{1}{s-a}"), "\\frac{1}{s+a}", F),
    (boxed("\\cos(2t) + \\sin(2t)"), "\\sqrt{2} \\cos (2 t-\\pi / 4)", T),
    (boxed("\\cos(2t) - \\sin(2t)"), "\\sqrt{2} \\cos (2 t-\\pi / 4)", F),
    (boxed("0.1"), "0.10", T), (boxed("3 \\times 10^8"), "3e8", T), (boxed("100\\sqrt{p}"), "100 p^{\\frac{1}{2}}", T),
    (boxed("\\frac{1}{4}p^{-2}"), "\\frac{1}{4p^2}", T), (boxed("\\alpha"), "\\alpha", T),
    # --- OlympiadBench
    (boxed("\\frac{1}{2(n+1)}"), "$\\frac{1}{2 n+2}$", T), (boxed("\\frac{1}{2n+1}"), "$\\frac{1}{2 n+2}$", F),
    (boxed("2^{1009}"), "$2^{1009}$", T), (boxed("2^{1008}"), "$2^{1009}$", F), (boxed("2(n-1)"), "$2n-2$", T),
    (boxed("(4,5,7), (1,8,19), (2,7,13)"), "$(1,8,19), (2,7,13), (4,5,7)$", T),
    (boxed("(1,8,19), (2,7,13)"), "$(1,8,19), (2,7,13), (4,5,7)$", F),
    (boxed("\\frac{(2n)!}{(n!)^2}"), "$\\binom{2n}{n}$", T),
    (boxed("f(x)=2x"), "$f(x)=2 x$", T), (boxed("2x"), "$f(x)=2 x$", T), (boxed("f(x)=x"), "$f(x)=2 x$", F),
    (boxed("84, 69"), "$69$,$84$", T), (boxed("69"), "$69$,$84$", F), (boxed("1"), "$k=1$", T),
    (boxed("\\frac{3m-2}{2}"), "$\\frac{3 m}{2}-1$", T),
    (boxed("62.5\\%"), "62.5%", T), (boxed("0.625"), "62.5%", T), (boxed("6.25"), "62.5%", F),
    (boxed("0.08"), "$8 \\%$", T), (boxed("8"), "$8 \\%$", T),
    (boxed("(-\\infty,0)\\cup\\{1\\}"), "$(-\\infty, 0) \\cup\\{1\\}$.", T),
    (boxed("\\frac{9\\sqrt{2}}{32}"), "$M=\\frac{9}{32} \\sqrt{2}$", T),
    (boxed("100!/2^{50}"), "$\\frac{100!}{2^{50}}$", T), (boxed("343943885"), "$2021 \\cdot 505 \\cdot 337$", T),
    (boxed("343943886"), "$2021 \\cdot 505 \\cdot 337$", F), (boxed("8 \\cdot 7^{-1/3}"), "$\\frac{8}{\\sqrt[3]{7}}$", T),
    (boxed("147556443852"), "$\\frac{4 \\cdot 999^{4}}{27}$", T), (boxed("2^{1/2}"), "$\\sqrt{2}$", T),
    (boxed("1.414"), "$\\sqrt{2}$", F), (boxed("0, 2, -2"), "$-2,0,2$", T), (boxed("(2,3)"), "$(3,2)$", F),
    (boxed("k \\geq 2"), "$k \\geqslant 2$", T), (boxed("2 \\leq k"), "$k \\geqslant 2$", T), (boxed("k > 2"), "$k \\geqslant 2$", F),
    (boxed("7500, 2500"), "2500,7500", T), (boxed("(1-p^2)/3"), "$\\frac{1-p^{2}}{3}$", T),
    # --- extraction: several boxes, nesting, \fbox, TeX form, no box, unclosed box, missing </think>
    (raw("First \\boxed{3}, but correcting: \\boxed{5}."), "5", T),
    (raw("First \\boxed{3}, but correcting: \\boxed{5}."), "3", F),
    (boxed("\\frac{1}{\\sqrt{2}}"), "\\frac{\\sqrt{2}}{2}", T), (raw("\\fbox{7}"), "7", T), (raw("$\\boxed 7$"), "7", T),
    (raw("The answer is 7."), "7", T), (raw("\\boxed{7} and then \\boxed{8"), "7", T),
    ("no think block, \\boxed{7}", "7", F), (raw("\\boxed{}"), "7", F),
    # --- multiple choice (ARC-c, GPQA)
    (raw("Reasoning.\nANSWER: C"), "C", T), (raw("ANSWER: B"), "C", F), (boxed("C"), "C", T), (boxed("\\text{C}"), "C", T),
    (boxed("(C)"), "C", T), (boxed("C) Planetary days will become shorter."), "C", T), (boxed("D"), "C", F),
    (raw("The answer is a bit subtle.\nANSWER: A"), "A", T), (raw("I pick option B."), "B", F),
]


def test_table_has_at_least_150_cases_with_both_outcomes():
    assert len(CASES) >= 150
    assert sum(1 for *_, e in CASES if e) >= 60 and sum(1 for *_, e in CASES if not e) >= 60


@pytest.mark.parametrize("response,ground_truth,expected", CASES)
def test_rule_grader_agrees_with_table(response, ground_truth, expected):
    assert grade(response, ground_truth, grader="rule", split_think=True) is expected
