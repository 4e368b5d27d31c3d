"""Claims of the chapters that a source test can see, checked against their sources.

Chapter 10's "what changed since 2017" table (truth review 2026-12-03, N10-2) prints
columns built as ``TransformerConfig``s in its code: the 2017 base model and LLaMA's
7B model. Their recipe fields are checked against what the papers and the reference
code say (``PAPER``, each with its source), and the chapter's summary may not call
tied embeddings part of the Llama recipe. Chapter 10's "no chat template" pitfall
(N10-1) must decode with the control tokens shown, since hiding them hid what the
model does. Each check keeps the old, false version of the page as a known-wrong input.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from transformer_course.model import TransformerConfig

ROOT = Path(__file__).resolve().parents[2]
CHAPTER_10 = ROOT / "book" / "10_modern_llm.md"
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# field -> value, per column variable of chapter 10's table cell, with the source
PAPER = {
    "paper_2017": {  # Vaswani et al. 2017
        "norm_first": False,  # section 3.1: LayerNorm(x + Sublayer(x))
        "norm": "layer",  # section 3.1
        "activation": "relu",  # section 3.3, equation 2
        "positional": "sinusoidal",  # section 3.5
        "tie_embeddings": True,  # section 3.4: one matrix for both embeddings and
        # the pre-softmax linear transformation
        "scale_embeddings": True,  # section 3.4: embeddings times sqrt(d_model)
        "n_kv_heads": None,  # section 3.2.2: multi-head attention, a key per head
    },
    "llama_7b": {  # Touvron et al. 2023 (LLaMA 1) and Meta's reference code
        "norm_first": True,  # section 2.2: pre-normalisation
        "norm": "rms",  # section 2.2: RMSNorm
        "activation": "swiglu",  # section 2.2
        "positional": "rope",  # section 2.2: rotary embeddings
        "tie_embeddings": False,  # model.py: output beside tok_embeddings
        "scale_embeddings": False,  # model.py: h = self.tok_embeddings(tokens)
        "bias": False,  # model.py: bias=False in every projection
        "n_kv_heads": None,  # no GQA in LLaMA 1 (Llama 2, table 1): H_kv = H
    },
}


def table_columns(text: str) -> dict[str, TransformerConfig]:
    """The ``name = TransformerConfig(...)`` assignments of the code cell that prints
    chapter 10's table, each built from its literal keyword arguments."""
    cell = next(c for c in CELL.findall(text) if "paper_2017 = " in c)
    code = re.sub(r"\A(?::\w[\w-]*:.*\n)+", "", cell)  # the cell's options
    columns = {}
    for node in ast.parse(code).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "TransformerConfig"
        ):
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
            columns[node.targets[0].id] = TransformerConfig(**kwargs)
    return columns


def column_problems(name: str, cfg: TransformerConfig) -> list[str]:
    """Where column ``name``'s config disagrees with ``PAPER``."""
    problems = []
    for field, expected in PAPER[name].items():
        got = getattr(cfg, field)
        if field == "n_kv_heads":  # one key/value head per query head
            got = None if got in (None, cfg.n_heads) else got
        if got != expected:
            problems.append(f"{name}.{field} is {got!r}, the source says {expected!r}")
    return problems


def test_the_2017_and_llama_columns_are_the_papers():
    columns = table_columns(CHAPTER_10.read_text())
    assert set(columns) >= set(PAPER), f"columns found: {sorted(columns)}"
    problems = [p for name in PAPER for p in column_problems(name, columns[name])]
    assert not problems, problems


def test_the_column_check_rejects_the_old_2017_column():
    # the table of b4e74ea labelled the library's defaults "2017": pre-norm, untied
    problems = column_problems("paper_2017", TransformerConfig())
    assert any("norm_first" in p for p in problems), problems
    assert any("tie_embeddings" in p for p in problems), problems
    tied_llama = TransformerConfig(
        norm_first=True, norm="rms", activation="swiglu", positional="rope",
        bias=False, scale_embeddings=False, tie_embeddings=True, n_kv_heads=2,
    )  # fmt: skip
    problems = column_problems("llama_7b", tied_llama)
    assert [p.split(" ")[0] for p in problems] == [
        "llama_7b.tie_embeddings",
        "llama_7b.n_kv_heads",
    ], problems


def summary_of(text: str) -> str:
    return text.split("## Summary", 1)[1].split("\n## ", 1)[0]


def llama_recipe_sentences(text: str) -> list[str]:
    """The summary's sentences that say what a Llama model is and also call its
    embeddings tied."""
    sentences = re.split(r"(?<=[.:;])\s+", " ".join(summary_of(text).split()))
    return [
        s
        for s in sentences
        if re.search(r"Llama-family model is|LLaMA's decoder", s)
        and re.search(r"\btied\b", s)
    ]


def test_the_summary_does_not_give_llama_tied_embeddings():
    assert not llama_recipe_sentences(CHAPTER_10.read_text())


def test_the_summary_check_rejects_the_old_summary():
    old = (
        "## Summary\n\n- A Llama-family model is the 2017 Transformer's decoder with "
        "pre-norm, RMSNorm,\n  SwiGLU, RoPE, grouped-query attention, no biases and "
        "tied, unscaled embeddings: a\n  handful of config fields.\n"
    )
    assert llama_recipe_sentences(old)


def pitfall_cell(text: str) -> str:
    section = text.split("### Pitfall: no chat template", 1)[1]
    return CELL.findall(section)[0]


def shows_control_tokens(cell: str) -> bool:
    """Every ``decode`` call of the cell that decodes the whole output shows the
    control tokens."""
    calls = re.findall(r"tokenizer\.decode\(([^()]*(?:\([^()]*\)[^()]*)*)\)", cell)
    whole = [c for c in calls if not c.startswith("out[:")]
    return bool(whole) and all("skip_special_tokens=False" in c for c in whole)


def test_the_pitfall_decodes_with_the_control_tokens_shown():
    assert shows_control_tokens(pitfall_cell(CHAPTER_10.read_text()))


def test_the_pitfall_check_rejects_the_old_cell():
    old = (
        "### Pitfall: no chat template\n\n```{code-cell} ipython3\n"
        "continued = generate(model, bare, 20)[0, bare.shape[1]:].tolist()\n"
        "print(repr(tokenizer.decode(continued)))\n```\n"
    )
    assert not shows_control_tokens(pitfall_cell(old))
