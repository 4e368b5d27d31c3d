"""Each common mistake gets its own message (issue 18): the known-wrong functions of
``transformer_course.exercises.pitfalls`` are fed to the checks, and each must be
rejected with the message that names that mistake, as two lines (message and hint)
and a return value of False, without a traceback. The same messages in Chinese
(issue 31): every template translated, with its placeholders, and shown in Chinese
when the learner's language is "zh"."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import exercise_messages  # tools/, on pytest's pythonpath
import pytest
import torch
import yaml

from transformer_course.attention import masked_softmax, scaled_dot_product_attention
from transformer_course.exercises import (
    CheckError,
    ShapeError,
    _language,
    check_attention_bthd,
    check_attention_properties,
    check_causal_mask,
    check_decoder_mask,
    check_dot_product_attention,
    check_gqa_cache_bytes,
    check_masked_attention,
    check_mean_pool,
    check_merge_folded_heads,
    check_merge_heads,
    check_multi_head_attention,
    check_noam_lr,
    check_padding_mask,
    check_patchify,
    check_repeat_kv,
    check_rotary_half,
    check_split_heads,
    check_split_qkv,
    check_stable_softmax,
    get_language,
    public_test,
    set_language,
)
from transformer_course.exercises import pitfalls as P

param = pytest.mark.parametrize


def _any_dim(softmax):
    """A pitfall softmax over the last axis, made to take ``dim`` as the exercise asks."""

    def fn(scores, mask=None, dim=-1):
        if mask is not None:
            mask = mask.expand_as(scores).movedim(dim, -1)
        return softmax(scores.movedim(dim, -1), mask).movedim(-1, dim)

    fn.__name__ = softmax.__name__
    return fn


def _last_axis_softmax(scores, mask=None):
    """Right along the last axis: a learner's own softmax that takes no ``dim``."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    peak = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - torch.where(torch.isfinite(peak), peak, 0.0))
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def _bthd(attention):
    """A (B, H, T, d) pitfall attention, called in the (B, T, H, d) layout."""

    def fn(q, k, v, key_padding_mask=None):
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        out, w = attention(*(x.transpose(1, 2) for x in (q, k, v)), mask)
        return out.transpose(1, 2), w

    return fn


def _bthd_layout_kept(q, k, v, key_padding_mask=None):  # (B, H, T, d) returned
    out, w = _bthd(P.attention_mask_after_softmax)(q, k, v)
    return out.transpose(1, 2), w


def _mha_out_only(*args, **kwargs):
    return P._multi_head(*args, **kwargs)[0]


CASES = [
    # chapter 1
    (check_dot_product_attention, P.attention_unscaled, "without the 1/sqrt(d) scale"),
    (check_dot_product_attention, P.attention_softmax_over_queries, "query axis"),
    (check_dot_product_attention, P.attention_out_only, "expected the tuple"),
    # chapter 2, exercise 1
    (check_stable_softmax, _any_dim(P.softmax_no_max_shift), "overflowed"),
    (check_stable_softmax, _any_dim(P.softmax_unguarded), "gives NaN (pitfall P1)"),
    (check_stable_softmax, _any_dim(P.softmax_large_negative), "uniform row"),
    (check_stable_softmax, _any_dim(P.softmax_inverted_mask), "mask is inverted"),
    (check_stable_softmax, _any_dim(P.softmax_then_zero), "zeroed after the softmax"),
    (check_stable_softmax, _any_dim(P.softmax_over_queries), "ran over the queries"),
    (
        check_stable_softmax,
        lambda s, mask=None, dim=-1: _last_axis_softmax(s, mask),
        "dim argument was ignored",
    ),
    (
        check_stable_softmax,
        lambda s, mask=None: _last_axis_softmax(s, mask),
        "unexpected keyword argument",
    ),
    (check_stable_softmax, masked_softmax, "calls the library's"),
    (
        check_stable_softmax,
        lambda s, mask=None, dim=-1: masked_softmax(s, mask, dim),
        "calls the library's",
    ),
    (check_masked_attention, scaled_dot_product_attention, "calls the library's"),
    # chapter 2, exercises 2 and 3
    (check_masked_attention, P.attention_unscaled, "P12"),
    (check_masked_attention, P.attention_scaled_by_d_k, "divided by d_k"),
    (check_masked_attention, P.attention_softmax_over_queries, "over the queries"),
    (check_masked_attention, P.attention_softmax_over_batch, "over the batch axis"),
    (check_masked_attention, P.attention_buggy, "over the batch axis"),
    (check_masked_attention, P.attention_inverted_mask, "mask is inverted"),
    (check_masked_attention, P.attention_ignores_mask, "mask had no effect"),
    (check_masked_attention, P.attention_no_guard, "gives NaN (pitfall P1)"),
    (check_masked_attention, P.attention_large_negative, "uniform row"),
    (check_masked_attention, P.attention_mask_after_softmax, "after the softmax"),
    (check_masked_attention, P.attention_ignores_qk, "do not depend on q and k"),
    (check_masked_attention, P.attention_out_only, "expected the tuple"),
    (check_attention_bthd, _bthd(P.attention_unscaled), "P12"),
    (check_attention_bthd, _bthd(P.attention_inverted_mask), "mask is inverted"),
    (check_attention_bthd, _bthd(P.attention_no_guard), "gives NaN (pitfall P1)"),
    (check_attention_bthd, _bthd(P.attention_large_negative), "uniform row"),
    (check_attention_bthd, _bthd_layout_kept, "layout asked for"),
    # chapter 3
    (check_split_heads, P.split_heads_view_only, "P8"),
    (check_split_heads, P.split_heads_no_transpose, "still runs over the tokens"),
    (check_split_heads, P.split_heads_interleaved, "every H-th feature"),
    (check_split_qkv, P.split_qkv_per_head, "cut out of each head's slice"),
    (check_merge_heads, P.merge_heads_no_transpose, "P9"),
    (check_merge_heads, P.merge_heads_no_reshape, "not concatenated"),
    (check_merge_heads, P.merge_heads_interleaved, "alternate between heads"),
    (check_merge_folded_heads, P.merge_folded_heads_buggy, "different batch items"),
    (check_multi_head_attention, P.multi_head_x_at_w, "x @ w"),
    (check_multi_head_attention, P.multi_head_split_view_only, "P8"),
    (check_multi_head_attention, P.multi_head_merge_no_transpose, "P9"),
    (check_multi_head_attention, P.multi_head_inverted_mask, "mask is inverted"),
    (check_multi_head_attention, P.multi_head_scaled_by_d_model, "sqrt(d_model)"),
    (check_multi_head_attention, P.multi_head_no_out_proj, "w_o is missing"),
    (check_multi_head_attention, P.multi_head_averaged_weights, "P13"),
    (check_multi_head_attention, _mha_out_only, "expected the tuple"),
    # chapter 5
    (check_attention_properties, P.masked_attention_axis_renorm, "over the queries"),
    (check_attention_properties, P.attention_softmax_over_queries, "over the queries"),
    (check_attention_properties, P.attention_unscaled, "P12"),
    (check_attention_properties, P.attention_ignores_qk, "q and k are not used"),
    (check_attention_properties, P.attention_inverted_mask, "mask is inverted"),
    (check_attention_properties, P.attention_mask_after_softmax, "after the softmax"),
    (check_attention_properties, P.attention_ignores_mask, "mask had no effect"),
    (check_attention_properties, P.attention_no_guard, "gives NaN (pitfall P1)"),
    (check_attention_properties, P.attention_large_negative, "P6"),
    (check_causal_mask, P.causal_mask_top_left, "aligned top-left"),
    (check_causal_mask, P.causal_mask_inverted, "inverted"),
    (check_causal_mask, P.causal_mask_no_diagonal, "hides the diagonal"),
    (check_causal_mask, P.causal_mask_wrong_offset, "offset points the wrong way"),
    (check_padding_mask, P.padding_mask_query_axis, "P5"),
    (check_padding_mask, P.padding_mask_inverted, "inverted"),
    (check_decoder_mask, P.decoder_mask_buggy, "combined with 'or'"),
]


def _id(case):
    check, fn, _ = case
    return f"{check.__name__}-{getattr(fn, '__name__', 'lambda')}"


@param("check, wrong, message", CASES, ids=[_id(c) for c in CASES])
def test_each_mistake_gets_its_own_message(check, wrong, message, capsys):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    failure = printed[printed.index("✗") :]  # after any "passed" lines of sub-checks
    assert message in failure, failure
    assert "Hint: " in failure and "Traceback" not in printed
    assert len(failure.strip().splitlines()) == 2, "only the message and the hint"
    with pytest.raises(CheckError, match=None) as info:
        check.strict(wrong)
    assert message in info.value.message


def test_hints_do_not_print_the_fix():
    """A hint names where to look, never the line to write."""
    fixes = [
        "transpose(1, 2)",
        "[:, None, None, :]",
        "x @ w.T",
        "softmax(scores, dim=-1)",
        "masked_fill(~mask",
        "math.sqrt(q.shape[-1])",
    ]
    for check, wrong, _ in CASES:
        try:
            check.strict(wrong)
        except CheckError as err:
            for fix in fixes:
                assert fix not in (err.hint or ""), (check.__name__, err.hint)


def test_shape_mistakes_are_shape_errors_and_public_test_reports_only_those():
    with pytest.raises(ShapeError):
        check_split_heads.strict(P.split_heads_no_transpose)
    with pytest.raises(AssertionError, match="still runs over the tokens"):
        public_test(check_split_heads, P.split_heads_no_transpose)
    assert public_test(check_split_heads, P.split_heads_view_only)  # values: hidden


def test_sizes_all_differ_so_a_forgotten_transpose_is_named():
    """With T == H a split without the transpose has the shape asked for; the check's
    inputs keep T, H, d_k and B apart, so the message names the forgotten transpose
    instead of pitfall P8."""
    with pytest.raises(ShapeError, match="still runs over the tokens"):
        check_split_heads.strict(P.split_heads_no_transpose)


def test_a_crash_in_the_learners_code_shows_only_the_learners_frames(capsys):
    def attention(q, k, v):  # chapter 1's find-the-bug: transpose(0, 1) on a batch
        w = (q @ k.transpose(0, 1)).softmax(-1)
        return w @ v, w

    assert check_dot_product_attention(attention) is False
    printed = capsys.readouterr().out
    assert printed.startswith("✗ attention raised RuntimeError")
    assert "in attention" in printed and "transformer_course" not in printed
    with pytest.raises(RuntimeError):
        check_dot_product_attention.strict(attention)


def test_a_crash_inside_pytorch_shows_the_learners_line(capsys):
    """Regression (learner trial 2026-12-01, finding 5): an error raised deep inside
    PyTorch used to show only PyTorch's frames; the learner's own line comes first."""
    from transformer_course.exercises import check_teacher_forcing_loss

    def no_flatten(model, src, tgt, criterion):
        logits = model(src, tgt[:, :-1])
        return criterion(logits, tgt[:, 1:])  # (B, T, V) logits: the learner's line

    assert check_teacher_forcing_loss(no_flatten) is False
    printed = capsys.readouterr().out
    assert printed.startswith("✗ no_flatten raised RuntimeError")
    assert "in no_flatten" in printed and "return criterion(logits" in printed
    assert "raised inside PyTorch" in printed and "in cross_entropy" in printed
    assert "torch/nn/" not in printed  # PyTorch's frames themselves are not listed


# ------------------------------------------- the learner's language (issue 31)
# Every template a learner can see has a Chinese translation in the catalog; the
# templates are found in the source (tools/exercise_messages.py, with ast), so a new
# message without a translation fails here. The English text is the msgid: the tests
# above check the English messages as they were.

CJK = range(0x4E00, 0xA000)


def _has_chinese(text: str) -> bool:
    return any(ord(c) in CJK for c in text)


def _untranslated(templates, catalog: dict[str, str]) -> list[str]:
    return [t for t in templates if not catalog.get(t)]


def _stale(catalog: dict[str, str], templates) -> list[str]:
    return [t for t in catalog if t not in templates]


def _fields(template: str) -> list[tuple]:
    """The placeholders of a template with their format spec and conversion."""
    parsed = string.Formatter().parse(template)
    return sorted((f, spec, conv) for _, f, spec, conv in parsed if f is not None)


def _unmarked_prose(source: str) -> list[str]:
    """String literals of three words or more that are neither a docstring nor in a
    place the catalog tools read: a message that would stay English in Chinese."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring
    templates, _ = exercise_messages.templates_in(source)
    read = {t for t, _ in templates}
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and node.value not in read
        and len(node.value.split()) >= 3
    ]


@pytest.fixture
def catalog():
    return exercise_messages.read_catalog()


@pytest.fixture
def templates():
    found, problems = exercise_messages.extract()
    assert not problems, problems
    return found


@pytest.fixture(params=["set_language", "environment"])
def chinese(request, monkeypatch):
    """Messages in Chinese, chosen by ``set_language("zh")`` or by the environment
    variable the Chinese notebooks' install cell sets."""
    if request.param == "set_language":
        set_language("zh")
    else:
        monkeypatch.setenv("TRANSFORMER_COURSE_LANG", "zh")
    _language.MISSING.clear()
    yield
    set_language(None)
    assert not _language.MISSING, f"shown untranslated: {_language.MISSING}"


def test_every_message_template_has_a_chinese_translation(templates, catalog):
    assert len(templates) > 400
    assert _untranslated(templates, catalog) == []
    new, _ = exercise_messages.templates_in('fail("a brand-new message", "new hint")')
    assert _untranslated([t for t, _ in new], catalog) == [
        "a brand-new message",
        "new hint",
    ]


def test_catalog_has_no_stale_entry(templates, catalog):
    assert _stale(catalog, templates) == []
    assert _stale({**catalog, "a message since removed": "已删除"}, templates) == [
        "a message since removed"
    ]


def test_translations_keep_exactly_the_placeholders_of_their_template(catalog):
    wrong = [
        (en, zh) for en, zh in catalog.items() if zh and _fields(en) != _fields(zh)
    ]
    assert wrong == []
    assert _fields("got {got:.3f}, expected {want:.3f}") != _fields("得到 {got}")
    assert _fields("{a} and {b}") != _fields("{a}")


def test_a_formatted_string_in_a_message_place_is_refused():
    """An f-string is formatted before translation: no catalog entry can match it."""
    _, problems = exercise_messages.templates_in('fail(f"x is {x}", "a hint")')
    assert len(problems) == 1 and "f-string" in problems[0]


def test_every_prose_string_of_the_exercises_is_a_template():
    assert _unmarked_prose('fail(m, "a hint")\nTABLE = ("a message nobody marked",)')
    for path in sorted(exercise_messages.PACKAGE.glob("*.py")):
        assert _unmarked_prose(path.read_text(encoding="utf-8")) == [], path.name


def test_set_language_refuses_another_language(monkeypatch):
    with pytest.raises(ValueError, match=r"lang: expected one of \['en', 'zh'\]"):
        set_language("fr")
    monkeypatch.setenv("TRANSFORMER_COURSE_LANG", "fr")
    with pytest.raises(ValueError, match="TRANSFORMER_COURSE_LANG: expected one of"):
        get_language()
    monkeypatch.delenv("TRANSFORMER_COURSE_LANG")
    assert get_language() == "en"


CHAPTERS = [
    (check_dot_product_attention, P.attention_unscaled, "少了 1/sqrt(d) 的缩放"),
    (check_masked_attention, P.attention_inverted_mask, "掩码反了"),
    (check_split_heads, P.split_heads_view_only, "（陷阱 P8）"),
    (check_rotary_half, lambda x, positions: x.clone(), "什么都没有旋转"),
    (check_causal_mask, P.causal_mask_top_left, "左上角对齐"),
    (check_noam_lr, lambda s, d, w: d**0.5 * min(s**-0.5, s * w**-1.5), "指数反了"),
    (check_repeat_kv, lambda x, n: x.repeat(1, n, 1, 1), "整组头被整体重复了"),
    (check_patchify, lambda x, p: x.view(x.shape[0], -1, 3 * p * p), "内存顺序"),
    (check_mean_pool, lambda hidden, mask: hidden.mean(1), "填充的词元也被平均"),
    (check_gqa_cache_bytes, lambda *sizes: 0, "字节，得到 0"),
]


@param("check, wrong, message", CHAPTERS, ids=[f"ch{i:02d}" for i in range(1, 11)])
def test_each_chapter_speaks_chinese(check, wrong, message, chinese, capsys):
    assert check(wrong) is False
    failure = capsys.readouterr().out
    failure = failure[failure.index("✗") :].strip().splitlines()
    assert len(failure) == 2, failure
    assert failure[0].startswith("✗ ") and message in failure[0], failure
    assert failure[1].startswith("提示：") and _has_chinese(failure[1][3:]), failure
    with pytest.raises(CheckError) as info:
        check.strict(wrong)
    assert message in info.value.message and "\n提示：" in str(info.value)


@param("check, wrong, message", CASES, ids=[_id(c) for c in CASES])
def test_each_mistake_gets_a_chinese_message_and_hint(
    check, wrong, message, chinese, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    text, hint = printed[printed.index("✗") :].strip().splitlines()
    assert _has_chinese(text) and hint.startswith("提示：") and _has_chinese(hint)
    assert "Hint" not in printed and "passed" not in printed


def test_the_framing_lines_speak_chinese(chinese, capsys):
    def stub(q, k, v):
        raise NotImplementedError

    def crash(q, k, v):
        w = (q @ k.transpose(0, 1)).softmax(-1)
        return w @ v, w

    assert check_dot_product_attention(stub) is False
    assert capsys.readouterr().out.startswith("尚未作答：stub 抛出 NotImplementedError")
    assert check_dot_product_attention(crash) is False
    printed = capsys.readouterr().out
    assert printed.startswith("✗ crash 抛出了 RuntimeError：")
    assert "\n提示：上面你写的最后一行引发了错误" in printed
    with pytest.raises(AssertionError, match="尚未作答：stub 仍然抛出"):
        public_test(check_dot_product_attention, stub)


def test_english_is_the_default_and_passes_say_passed(capsys, monkeypatch):
    monkeypatch.delenv("TRANSFORMER_COURSE_LANG", raising=False)
    assert check_causal_mask(P.causal_mask_top_left) is False
    assert "Hint: query i sits" in capsys.readouterr().out
    set_language("zh")
    try:
        assert check_causal_mask(
            lambda t, s: torch.ones(t, s, dtype=torch.bool).tril(s - t)
        )
        assert capsys.readouterr().out.startswith("通过：因果掩码正确")
    finally:
        set_language(None)


# the glossary terms of book/zh/glossary.yml that the messages use (code names aside)
TERMS = {
    "query|queries": "查询",
    "keys?": "键",
    "values?": "值",
    "mask|masks|masked": "掩码",
    "padding|padded": "填充",
    "tokens?": "词元",
    "batch": "批量",
    "loss": "损失",
    "heads?": "头",
    "gradients?": "梯度",
    "patch|patches": "图像块",
    "embeddings?": "嵌入",
    "teacher": "教师",
    "student": "学生",
    "encoder": "编码器",
    "decoder": "解码器",
}
GLOSSARY = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "book" / "zh" / "glossary.yml").read_text()
)["terms"]
REJECTED = tuple(dict.fromkeys(r for t in GLOSSARY for r in t.get("reject", ())))


def test_message_terms_are_the_glossarys():
    chinese = {t["zh"] for t in GLOSSARY}
    assert {zh for zh in TERMS.values()} - chinese <= {"教师", "学生"}  # 教师模型, ...
    assert "令牌" in REJECTED and "遮罩" in REJECTED  # read from the glossary file


def _glossary_problems(en: str, zh: str) -> list[str]:
    """Terms of the English prose (code, placeholders and calls removed) whose
    Chinese term is missing from the translation, and rejected variants it uses."""
    prose = re.sub(r"`[^`]*`|\{[^}]*\}|~\w+|@ *\w+|\b\w+ = ", " ", en)
    while re.search(r"\w+\([^()]*\)", prose):
        prose = re.sub(r"\w+\([^()]*\)", " ", prose)
    missing = [
        term
        for words, term in TERMS.items()
        if re.search(rf"(?<![\w.\[=_/-])(?:{words})(?![\w(_=\[-])", prose)
        and term not in zh
    ]
    return missing + [r for r in REJECTED if r in zh]


def test_messages_follow_the_glossary(catalog):
    problems = {
        en: p for en, zh in catalog.items() if (p := _glossary_problems(en, zh))
    }
    assert problems == {}
    assert _glossary_problems("the mask is inverted", "遮罩反了") == ["掩码", "遮罩"]
    assert _glossary_problems("pad the batch", "填充批次") == ["批量", "批次"]


def test_the_grading_sandbox_passes_the_feedback_language(tmp_path, monkeypatch):
    """`TRANSFORMER_COURSE_LANG=zh make grade`: the learner code that the grader runs
    (and its self-check feedback) sees the language; other instructor variables not."""
    from course_grading.sandbox import Sandbox  # tools/, on pytest's pythonpath

    monkeypatch.setenv("TRANSFORMER_COURSE_LANG", "zh")
    monkeypatch.setenv("INSTRUCTOR_SECRET", "do-not-leak")
    env = Sandbox("none").env(tmp_path)
    assert env["TRANSFORMER_COURSE_LANG"] == "zh"
    assert "INSTRUCTOR_SECRET" not in env
