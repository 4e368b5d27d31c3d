"""No number that a cell computes is typed into a chapter's prose.

The preface promises that every number in the text is printed by the code beside it. This
test scans the prose of every chapter (book/NN_*.md: the markdown between the code cells,
including exercise and solution text) for digits, and accepts a digit only where it cannot
be a computed outcome:

- inside a code cell, a fenced or indented code block, inline code or a formula ($...$);
- inside a role: {glue:text}`name`, {cite}`key`, {numref}, ...;
- in a name that contains letters (float32, int8, 2-D, all-MiniLM-L6-v2, P12);
- after "section", "equation", "chapter", "figure", "theorem", "table", "issue", "PR"
  (and their plurals), with the numbers that follow them ("sections 3 and 5",
  "equations 13-16");
- 0 and 1 (constants: mean 0, variance 1, sums to 1, position 0);
- in a phrase of ALLOWED below, each with the reason it is not a computed outcome.

Everything else fails, with the chapter, the line and the sentence, so that a number
either moves into a cell (printed, or glued with myst-nb's `glue`) or gets an entry here
with its reason.

Outcomes can also be written in words ("tiled is not a faster one", "changes little",
"rarely changes which hypothesis wins"): the truth review of 2026-12-01 (section 3b)
found such sentences contradicted by the build. A second scan looks, sentence by
sentence, for the comparative and outcome words of ``OUTCOME_WORDS``; a sentence that
uses one must glue something (a measured number or a verdict computed by a cell), or be
in ``ALLOWED_OUTCOMES`` with the reason its truth does not depend on a run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))

# phrase (as it reads in the prose; line breaks and runs of spaces match any whitespace,
# and inline code, roles and formulas inside it are already blank) -> why the number in it
# is not an outcome a cell computes.
ALLOWED: dict[str, str] = {
    # years of a cited work
    "the 2017 paper": "the year of the cited paper",
    "The 2017 paper": "the year of the cited paper",
    # versions and identifiers
    "Since version 2.5": "the PyTorch release that changed the behaviour (PR 133882)",
    "Mistral 7B": "a model's name",
    "since Python 3.12 neither": "the Python release that made hash(None) a constant "
    "(chapter 11's pitfall P19)",
    # chapter 1
    "passes about 88 in float32": "a property of float32 (ln of its largest value), "
    "printed by the cell below",
    "the first 16 numbers of the output vector": "a parameter of the view below",
    "2. **Sequential computation.**": "the number of a list item",
    "a random sequence of 4 to 24 symbols": "the task's lengths, parameters of the "
    "cells below",
    "fixed-size state, hidden size 64": "a parameter of the model, printed with its "
    "parameter count below",
    "on batches of 32 sequences whose length is drawn from 4 to 24": "training "
    "parameters of the cell below",
    "64 numbers each": "the hidden size, a parameter of the model",
    "a batch of 8 sequences": "a parameter of the timing cell below",
    # chapter 2
    "10,000 random pairs": "a parameter of the cell below",
    "scores around 1000": "a parameter of the exercise's check",
    # chapter 3
    "with 6 layers of 12 heads": "the model's configuration, printed by the cell below",
    "trained on batches of 32 made": "the story of a find-the-bug exercise, not a "
    "measurement",
    # chapter 4
    "barely change over 100 positions": "a property of the formula: the slowest pairs "
    "have wavelengths of thousands of positions (printed in the table above it)",
    "run it on 7 tokens at once": "a parameter of the cell below",
    "layer with 4 heads": "a parameter of the experiment",
    "copy from 2 back": "the name of a task of the experiment",
    "(head size 16)": "a parameter of the cell below",
    # chapter 5
    "(queries 4 and 5)": "the padded positions of the example batch defined above",
    "for the last 3 of our 6 tokens": "parameters of the cell below",
    "the keys stay at 8; the last 2 of them": "parameters of the view below",
    "then 3 new tokens": "a parameter of the cell below",
    "over all 8 tokens": "a parameter of the cell below",
    # chapter 6
    "The numbers 1 to 99,999 are split 80/10/10": "the data set's definition "
    "(make_translation_data), not a measurement",
    "with 80 tokens": "the vocabulary size, a parameter",
    "(id 2)": "a fixed token id of the tokenizer",
    "below 1,000": "the limit that defines the small numbers, a parameter",
    "warmup 200, label smoothing 0.1, dropout 0.1 and the gradient norm clipped at 1. "
    "Every 100 steps": "hyperparameters of the training cell below",
    "(500 numbers)": "a parameter: every twentieth of the validation numbers",
    "whether 42 is a training number": "the input the cell translates; the cell prints "
    "its split",
    "30 steps": "a parameter of the runs below",
    "A warmup of 200 here, rather than the paper's 4,000 for 100,000 steps": "the "
    "training cell's warmup, a parameter, and the paper's (Vaswani et al., 5.3, 6.1)",
    "(beam size 4)": "a parameter of the exercise",
    "is 4 x 20 + 10 + 9": "a fact about French numerals",
    "cross-attention of 97": "the input the exercise asks about",
    # chapter 7
    "that is 128 times more": "arithmetic on the two sizes given in the same sentence",
    "the 32 heads of a mid-sized model": "a parameter of the cell below",
    "a sequence of 64 tokens": "a parameter of the view below",
    "64 to 128 rows": "typical block sizes of FlashAttention implementations",
    "about 3 decimal digits": "a property of float16 (10 mantissa bits)",
    "near 2 or more": "the exponent that theory predicts, not a measurement",
    "(beyond 2 once": "the exponent that theory predicts, not a measurement",
    "One generation of 512 tokens": "a parameter of the cell below",
    "up to 512": "a parameter of the cell below",
    "uses 32 query heads and 8 key/value heads": "from the Mistral paper, section 2",
    "about 5% of the original training steps": "from Ainslie et al. 2023, section 2",
    "stored in 32 or 16 bits": "the sizes of float32 and float16",
    "A model has 32 layers, 32 query heads": "the exercise's given numbers",
    "with 8 key/value heads": "the exercise's given numbers",
    "A GPU has 40 GiB left": "the exercise's given numbers",
    "(512 KiB)": "the exercise solution's arithmetic",
    "a quarter of that, 128 KiB": "the exercise solution's arithmetic",
    "for example 10 sequences": "the exercise solution's arithmetic",
    "instead of 2.": "the exercise solution's arithmetic",
    # chapter 8
    "ships 1,797 real handwritten digits, 8 x 8 pixels": "facts of the data set "
    "(scikit-learn's load_digits); the cell prints the split sizes",
    "written by 13 of its 43 writers": "facts of the data set (its description in "
    "scikit-learn)",
    "the same 13 writers": "a fact of the data set (scikit-learn's description)",
    "four cells of 8 x 8 pixels": "the layout of a number image, a parameter",
    "The numbers 1 to 9,999 are split by value": "the data set's definition "
    "(split_numbers(10_000)), not a measurement",
    "each 8 x 8 digit is 2 x 2 patches and a number image of 8 x 32 pixels is a grid "
    "of 2 x 8 = 16 patches": "arithmetic on the image size and the patch size of the "
    "example",
    "is 16 consecutive pixels of one pixel row, a 1 x 16 strip": "the patch size of "
    "the example, p * p = 16",
    "beam size 4 with the GNMT": "a parameter of the cell below",
    "would put 1 / 4 there": "one cell in four, by construction; the cell prints it",
    "clips at 100": "from the CLIP paper, section 2.5",
    "numbers 0 to 99 as number images": "the data set's definition",
    "the numbers 10 to 20 and the round tens": "a fact about English numerals",
    "CLIP used 32,768": "from the CLIP paper, section 2.5",
    "(2 x 2 patches per digit": "arithmetic on the exercise's patch size",
    "of size 64 and compare": "a parameter of the exercise",
    "frequent (64 draws from": "the exercise's batch size",
    # chapter 9
    '"40% fewer parameters at 90% of the performance"': "the tutorials' claim, quoted "
    "(the chapter measures its own numbers)",
    "(6 layers of 12 heads": "the pretrained model's configuration (teacher.cfg)",
    "2. **Nearest-neighbour agreement**": "the number of a list item",
    "and has 2 Transformer layers": "the student's depth, a parameter of make_student",
    "with 6 layers and 2 to fill, we take one in three (the teacher's layers 3 and 6)": (
        "the teacher's and the student's depths and the layers they imply, parameters "
        "of the recipes below"
    ),
    "Remove 0, 12, 24, ... of the 72 heads": "the grid of the cell below; 72 is 6 "
    "layers x 12 heads",
    "of the 72 heads (": "the head count: 6 layers x 12 heads",
    "(such as 2:4 sparsity": "the name of a structured-sparsity pattern",
    "to 60, then 240 (or run on a GPU)": "the exercise's given training times",
    "the first and the last layer (1 and 6": "the teacher's first and last layer, "
    "a recipe of the cell below",
    "the target of a Spearman of 0.9": "the chapter's given target (issue 16)",
    "the target of removing 30% of the heads at a Spearman of at least 0.95": (
        "the chapter's given target (issue 16)"
    ),
    "in steps of two, before the Spearman correlation first falls below 0.95": (
        "the step and the threshold, parameters of the cell above"
    ),
    "72 forward passes": "one per head: 6 layers x 12 heads",
    "72 in all": "one per head: 6 layers x 12 heads",
    "at Spearman 0.95": "the exercise's given threshold",
    "but only about 20 to 40% together": "from Michel et al. 2019, section 4.2 (WMT "
    "and BERT)",
    # chapter 10
    "the 2017 Transformer": "the year of the cited paper (Vaswani et al.)",
    "the 2017 design": "the year of the cited paper (Vaswani et al.)",
    "since 2017": "the year of the cited paper (Vaswani et al.)",
    "the 2017 recipe": "the year of the cited paper (Vaswani et al.)",
    "the 2017 behaviour": "the year of the cited paper (Vaswani et al.)",
    "the 2017 post-norm block": "the name of a variant trained in the cell above",
    "Llama 3 8B's shape": "a model's name",
    "The 2017 Transformer": "the year of the cited paper (Vaswani et al.)",
    "the 2017 base model": "the year of the cited paper (Vaswani et al.)",
    "The 2017 layer": "the year of the cited paper (Vaswani et al.)",
    "the 2017 one": "the year of the cited paper (Vaswani et al.)",
    "the 2017 model": "the year of the cited paper (Vaswani et al.)",
    "The 2017 model": "the year of the cited paper (Vaswani et al.)",
    "the 2017 feed-forward network": "the year of the cited paper (Vaswani et al.)",
    "Llama 2's": "a model family's name (Touvron et al. 2023, Llama 2)",
    "Llama 3 uses": "a model family's name (Grattafiori et al. 2024, Llama 3)",
}

KEYWORDS = (
    r"(?:sections?|§|equations?|eqs?\.|chapters?|figures?|figs?\.|theorems?|tables?|"
    r"issues?|PR|algorithms?|appendix|footnotes?|pitfalls?|lines?)"
)
_REF = r"[#(]?\d+(?:\.\d+)*\)?"
# a keyword followed by numbers joined with -, ., ,, "and", "to", "or"
NUMBERED = re.compile(
    KEYWORDS + r"\s+" + _REF + r"(?:\s*(?:-|–|,|and|to|or)\s*" + _REF + r")*",
    re.IGNORECASE,
)
YEAR_AFTER_NAME = re.compile(r"et al\.,? \(?\d{4}\)?")
ROLE = re.compile(r"\{[\w:.-]+\}`[^`]*`")
INLINE_CODE = re.compile(r"``.+?``|`(?:[^`\n]|\n(?!\s*\n))+`")
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$|\\begin\{(\w+\*?)\}.*?\\end\{\1\}", re.DOTALL)
INLINE_MATH = re.compile(r"(?<!\\)\$[^$\n]+?(?<!\\)\$")
LINK_TARGET = re.compile(r"\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# a number as a whole token: not part of a word that has letters (float32, 2-D, v2)
NUMBER = re.compile(r"(?<![\w.\-/])\d+(?:[.,]\d+)*(?:%|x\b)?(?![\w\-])")
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
# 0 and 1 as constants of the mathematics (mean 0, variance 1, weight 0, sums to 1,
# position 0): not outcomes of a cell
CONSTANTS = {"0", "1"}


def prose_of(text: str) -> str:
    """The prose of a MyST notebook: code cells, code blocks and directive options
    blanked out (line numbers are kept, so failures can point at the line)."""
    lines = text.split("\n")
    if lines and lines[0].strip() == "---":  # jupytext front matter
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
        lines[: end + 1] = [""] * (end + 1)
    out: list[str] = []
    stack: list[tuple[str, bool]] = []  # (fence, is_code)
    prev_blank = True
    for line in lines:
        fence = FENCE.match(line.strip())
        if fence and stack and fence.group(1) == stack[-1][0] and not fence.group(2):
            stack.pop()
            out.append("")
            continue
        if fence and fence.group(2) and not (stack and stack[-1][1]):
            info = fence.group(2).strip()
            is_code = not info.startswith("{") or info.startswith(
                ("{code-cell}", "{code-block}", "{code}", "{literalinclude}")
            )
            stack.append((fence.group(1), is_code))
            out.append("")
            continue
        if fence and not fence.group(2) and not (stack and stack[-1][1]):
            stack.append((fence.group(1), True))  # a bare ``` opens a code block
            out.append("")
            continue
        in_code = any(code for _, code in stack)
        option = stack and re.match(r"^\s*:[\w-]+:", line)  # :label:, :class:
        indented = (
            prev_blank
            and line.startswith("    ")
            or (out and out[-1] == "\0" and line.startswith("    "))
        )
        if in_code or option:
            out.append("")
        elif indented:
            out.append("\0")  # an indented code block, continued while indented
        else:
            out.append(line)
        prev_blank = not line.strip() or (out[-1] == "\0")
    return "\n".join("" if line == "\0" else line for line in out)


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def _phrase(phrase: str) -> re.Pattern:
    return re.compile(r"\s+".join(re.escape(word) for word in phrase.split()))


def scan(prose: str) -> tuple[list[tuple[int, str, str]], set[str]]:
    """(line, number, context) for every digit the rules above do not allow, and the
    ALLOWED phrases that were used."""
    text = COMMENT.sub(_blank, prose)
    for pattern in (DISPLAY_MATH, ROLE, INLINE_CODE, INLINE_MATH, LINK_TARGET):
        text = pattern.sub(_blank, text)
    used = set()
    for phrase in ALLOWED:
        text, n = _phrase(phrase).subn(_blank, text)
        if n:
            used.add(phrase)
    text = YEAR_AFTER_NAME.sub(_blank, NUMBERED.sub(_blank, text))
    found = []
    for match in NUMBER.finditer(text):
        if match.group(0) in CONSTANTS:
            continue
        line = text.count("\n", 0, match.start()) + 1
        start = max(0, match.start() - 50)
        context = " ".join(text[start : match.end() + 30].split())
        found.append((line, match.group(0), context))
    return found, used


def typed_numbers(prose: str) -> list[tuple[int, str, str]]:
    return scan(prose)[0]


# words whose truth is an outcome of a run when they compare measured things
OUTCOME_WORDS = re.compile(
    r"\b(?:faster|slower|cheaper|more expensive|twice as \w+|no (?:better|worse)|"
    r"far (?:less|more|fewer)|changes? (?:little|nothing)|rarely|say otherwise|"
    r"happens? to be|\w+ times (?:faster|slower|larger|smaller|more|less|longer|"
    r"shorter)|buys? no|costs? (?:little|nothing)|(?:in|for) every (?:seed|round|run)|"
    r"(?:did|does) (?:best|worst)|barely (?:moves?|changes?)|outperform\w*)\b",
    re.IGNORECASE,
)
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`[^`]*`")
# a sentence ends at . ! ? ; : before whitespace, or at a blank line
SENTENCE = re.compile(r"(?:[^.!?;:\n]|[.!?;:](?!\s)|\n(?!\s*\n))+")

# phrase -> why the sentence that contains it does not state the outcome of a run
ALLOWED_OUTCOMES: dict[str, str] = {
    # chapter 2
    "(whether it is also faster depends on the hardware": "says the speed is not "
    "fixed and points at the measurement",
    # chapter 3
    "with one item the order happens to be right": "how the bug works, true for any "
    "input",
    # chapter 4
    "on sequences four times longer than any seen": "a learning goal: the "
    "experiment's test lengths, parameters",
    "holds for every seed (the worst seed": "the rule the cell applies to what it "
    "prints",
    "the high ones barely change over 100 positions": "a property of the formula "
    "(the wavelengths are printed above it)",
    # chapter 5
    "which ordinary tests rarely contain": "a remark about test inputs, not a result",
    # chapter 6
    "does not measure how much faster": "says what the book does not measure",
    "earlier on a slower": "describes the time guard, not a result",
    "a model that has rarely seen a short target": "describes the data's balance, "
    "which the cell below prints",
    "with a denoising objective did best": "T5's result (Raffel et al. 2020, section "
    "3.2.4, Table 2), not this page's",
    # chapter 7
    "that is 128 times more": "arithmetic on the two sizes given in the sentence",
    '"faster" or "slower" only when every round agrees': "the rule by which the "
    "cell computes the glued verdict",
    "They can well be *slower* here, because": "a hedged reason; the measured "
    "verdict is glued in the sentence before",
    "also make it faster than naive attention": "Dao et al.'s GPU result, cited "
    "in the same line",
    "should be no worse than about twice": "the test the cell applies, stated before it",
    "FlashAttention is also *faster*": "Dao et al.'s A100 measurement, cited, and "
    "said not to be measured here",
    "mean proportionally faster steps": "the mechanism, cited (Shazeer 2019, Pope "
    "et al. 2023), not a measurement",
    "whether they are faster depends on the hardware": "says the speed is not fixed",
    # chapter 8
    "it shows which design learns faster, not how far": "says what the comparison "
    "can show; the numbers are glued in the paragraph above",
    "The KV cache changes nothing in the output": "an equivalence the library's tests "
    "check; the cell below prints it",
    "so each step is slower too": "exercise solution, a stated expectation for the "
    "learner's run; left to the exercise pass (truth review 2026-12-01, 3b)",
    # chapter 9
    "see which of them make the model faster": "a learning goal",
    "to be smaller and faster the heads must go": "the reason for removing heads, "
    "measured in the cell below",
    "as in head and neuron removal, are faster anywhere": "a general fact about "
    "dense matrix products (less arithmetic), measured in the head-removal cell",
}


def typed_outcomes(prose: str) -> tuple[list[tuple[int, str, str]], set[str]]:
    """(line, word, sentence) for every sentence that uses an outcome word, glues
    nothing and matches no ALLOWED_OUTCOMES phrase; and the phrases that were used."""
    text = GLUE_ROLE.sub(lambda m: "\0" * len(m.group(0)), COMMENT.sub(_blank, prose))
    for pattern in (DISPLAY_MATH, ROLE, INLINE_CODE, INLINE_MATH, LINK_TARGET):
        text = pattern.sub(_blank, text)
    found, used = [], set()
    for match in SENTENCE.finditer(text):
        sentence = match.group(0)
        word = OUTCOME_WORDS.search(sentence)
        if not word or "\0" in sentence:
            continue
        allowed = [p for p in ALLOWED_OUTCOMES if _phrase(p).search(sentence)]
        if allowed:
            used.update(allowed)
            continue
        line = text.count("\n", 0, match.start() + word.start()) + 1
        found.append((line, word.group(0), " ".join(sentence.split())))
    return found, used


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_number_is_typed_into_the_prose(chapter):
    found = typed_numbers(prose_of(chapter.read_text()))
    report = "\n".join(
        f"  {chapter.name}:{line}: {num!r} in '...{ctx}...'" for line, num, ctx in found
    )
    assert not found, (
        f"{len(found)} number(s) typed into the prose; print them from a cell, glue "
        f"them, or add the phrase to ALLOWED with a reason:\n{report}"
    )


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_outcome_is_typed_in_words(chapter):
    found = typed_outcomes(prose_of(chapter.read_text()))[0]
    report = "\n".join(
        f"  {chapter.name}:{line}: {word!r} in '{ctx}'" for line, word, ctx in found
    )
    assert not found, (
        f"{len(found)} sentence(s) state a run's outcome in words without gluing it; "
        f"glue the verdict from the cell, or add the phrase to ALLOWED_OUTCOMES with "
        f"the reason it does not depend on a run:\n{report}"
    )


def test_the_outcome_scan_finds_a_typed_verdict():
    # the sentence of chapter 2 that the 2026-12-01 build contradicted (finding 1.16)
    text = (
        'Some prose.\n\n"tiled" is the memory-saving version (not a faster one: '
        "chapter 7 measures both).\n\nOne key instead of four changes little in a "
        "step.\n\nIt was {glue:text}`verdict` naive, so it is faster or slower.\n"
    )
    found = typed_outcomes(prose_of(text))[0]
    assert [(line, word) for line, word, _ in found] == [
        (3, "faster"),
        (5, "changes little"),
    ]


def test_the_scan_finds_a_typed_number():
    text = (
        "Some prose.\n\n```{code-cell} ipython3\nprint(0.4)\n```\n\n"
        "The accuracy is 0.93 at length 64, about 5x faster.\n"
    )
    found = typed_numbers(prose_of(text))
    assert [num for _, num, _ in found] == ["0.93", "64", "5x"]
    assert found[0][0] == 7  # the line of the sentence


def test_allowed_places_for_digits_pass():
    text = (
        "Section 3.2.1 and equations 13-16 of {cite}`su2021roformer`, chapters 3 and 5, "
        "a float32 tensor, `x[0, 1]`, $d_k = 64$, {glue:text}`acc:.2f`, "
        "the 2-D case, pitfall P12, [a link](https://example.com/7).\n\n"
        "$$\nO(T^2)\n$$\n\n    def f(): return 3\n\n"
        "```{exercise} Title 7\n:label: ex-1\nText.\n```\n"
    )
    assert typed_numbers(prose_of(text)) == []


def test_allow_list_entries_are_used_and_have_reasons():
    used = set()
    for chapter in CHAPTERS:
        used |= scan(prose_of(chapter.read_text()))[1]
    assert all(reason.strip() for reason in ALLOWED.values())
    unused = sorted(set(ALLOWED) - used)
    assert not unused, f"ALLOWED phrases found in no chapter (remove them): {unused}"


def test_allowed_outcomes_are_used_and_have_reasons():
    used = set()
    for chapter in CHAPTERS:
        used |= typed_outcomes(prose_of(chapter.read_text()))[1]
    assert all(reason.strip() for reason in ALLOWED_OUTCOMES.values())
    unused = sorted(set(ALLOWED_OUTCOMES) - used)
    assert not unused, f"ALLOWED_OUTCOMES phrases found in no chapter: {unused}"
