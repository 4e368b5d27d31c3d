"""Chapter 7's exercise checks: a right answer passes, the stub is "not attempted",
and each typical mistake is rejected with its own message."""

import math

import pytest
import torch

from transformer_course.attention import repeat_kv
from transformer_course.exercises import (
    CheckError,
    _language,
    ch07,
    check_online_softmax,
    check_quantize_int8,
    check_repeat_kv,
    check_streaming_attention,
    pitfalls,
    set_language,
)
from transformer_course.flash import online_softmax
from transformer_course.quantize import quantize_int8


def stub(*args):
    raise NotImplementedError("your code here")


def streaming(q, k, v, keep, block):  # the chapter's solution
    m, l, acc = -math.inf, 0.0, torch.zeros(v.shape[-1])
    s = (k @ q / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
    for j in range(0, len(s), block):
        m_new = max(m, s[j : j + block].max().item())
        shift = m_new if m_new > -math.inf else 0.0
        p = torch.exp(s[j : j + block] - shift)
        alpha = math.exp(m - shift)
        l = l * alpha + p.sum().item()
        acc = acc * alpha + p @ v[j : j + block]
        m = m_new
    return acc / l if l > 0 else acc


def repeat_heads(x, n_rep):
    B, H, S, d = x.shape
    return x[:, :, None].expand(B, H, n_rep, S, d).reshape(B, H * n_rep, S, d)


def quantize(w, group):  # the chapter's solution
    d_out, d_in = w.shape
    blocks = w.reshape(d_out, d_in // group, group)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    w_int8 = torch.round(blocks / scale).clamp(-127, 127).to(torch.int8)
    return w_int8.reshape(d_out, d_in), scale.squeeze(-1)


def _groupwise(quantize_blocks):
    """A per-block recipe ``quantize_blocks(blocks) -> (codes, scale)`` over
    (d_out, n_groups, group) blocks, made to take ``(w, group)``."""

    def fn(w, group):
        d_out, d_in = w.shape
        codes, scale = quantize_blocks(w.reshape(d_out, d_in // group, group))
        return codes.reshape(d_out, d_in), scale.squeeze(-1)

    return fn


def merge(m_a, l_a, m_b, l_b):  # the chapter's solution
    m = torch.maximum(m_a, m_b)
    shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m, l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)


def merge_unguarded(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)


def merge_unrescaled(m_a, l_a, m_b, l_b):
    return torch.maximum(m_a, m_b), l_a + l_b


def merge_wrong_sign(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m, l_a * torch.exp(shift - m_a).nan_to_num(0) + l_b * torch.exp(
        shift - m_b
    ).nan_to_num(0)


def test_online_softmax_check(capsys):
    assert check_online_softmax(merge)
    assert check_online_softmax(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(CheckError, match="without rescaling"):
        check_online_softmax.strict(merge_unrescaled)
    with pytest.raises(CheckError, match="NaN"):
        check_online_softmax.strict(merge_unguarded)


def test_streaming_attention_check():
    assert check_streaming_attention(streaming)
    assert check_streaming_attention(stub) is False
    with pytest.raises(CheckError, match="partial output is not rescaled"):
        check_streaming_attention.strict(pitfalls.streaming_attention_no_output_rescale)


@pytest.mark.parametrize("block", [1, 2, 3, 5, 7, 13])
def test_streaming_attention_check_accepts_any_block(block, monkeypatch):
    """The check's inputs with another block size: a right answer passes whether or
    not the block divides S (the check's own blocks 3, 4 and 8 do not all divide)."""
    cases = [(*case[:3], block, case[4]) for case in ch07._STREAMING_CASES]
    monkeypatch.setattr(ch07, "_STREAMING_CASES", cases)
    assert check_streaming_attention(streaming)


def test_repeat_kv_check():
    assert check_repeat_kv(repeat_heads)
    assert check_repeat_kv(stub) is False
    with pytest.raises(CheckError, match="tiled"):
        check_repeat_kv.strict(lambda x, n: x.repeat(1, n, 1, 1))
    with pytest.raises(CheckError, match="dimension 1"):
        check_repeat_kv.strict(lambda x, n: x)


def test_quantize_int8_check():
    assert check_quantize_int8(quantize)
    assert check_quantize_int8(stub) is False

    def per_tensor(w, group):
        n_groups = w.shape[1] // group
        scale = w.abs().max() / 127 * torch.ones(w.shape[0], n_groups)
        return torch.round(w / w.abs().max() * 127).to(torch.int8), scale

    truncating = _groupwise(
        lambda b: (
            (b / (b.abs().amax(-1, keepdim=True) / 127)).to(torch.int8),
            b.abs().amax(-1, keepdim=True) / 127,
        )
    )

    def no_int8(w, group):
        w_int8, scale = quantize(w, group)
        return w_int8.float(), scale

    with pytest.raises(CheckError, match="per-tensor"):
        check_quantize_int8.strict(per_tensor)
    with pytest.raises(CheckError, match="truncated"):
        check_quantize_int8.strict(truncating)
    with pytest.raises(CheckError, match="torch.int8"):
        check_quantize_int8.strict(no_int8)


# ------------------------------------------- the learner trial of 2026-12-01, chapter 7


def _streaming_variant(
    *,
    guard=True,
    factor="old",
    scale=True,
    per_block=False,
    mask="kept",
    fill=-math.inf,
    empty="zeros",
):
    """The chapter's solution with one mistake: ``guard=False`` is the exercise's
    buggy code (no shift of 0 while the running maximum is -inf)."""

    def fn(q, k, v, keep, block):
        s = k @ q / (math.sqrt(q.shape[0]) if scale else 1.0)
        hide = {"kept": ~keep, "inverted": keep, "ignored": torch.zeros_like(keep)}
        s = s.masked_fill(hide[mask], fill)
        if per_block:
            outs = [
                torch.softmax(s[j : j + block], 0) @ v[j : j + block]
                for j in range(0, len(s), block)
            ]
            return torch.stack(outs).mean(0)
        m, l, acc = -math.inf, 0.0, torch.zeros(v.shape[1])
        for j in range(0, len(s), block):
            m_new = max(m, s[j : j + block].max().item())
            shift = 0.0 if guard and m_new == -math.inf else m_new
            p = torch.exp(s[j : j + block] - shift)
            exponent = m - shift if factor == "old" else shift - m
            alpha = math.exp(exponent)
            l = l * alpha + p.sum().item()
            acc = acc * alpha + p @ v[j : j + block]
            m = m_new
        if l > 0 or empty == "zeros":
            return acc / l if l > 0 else acc
        return acc / l if empty == "divide" else torch.ones_like(acc)

    return fn


def _two_pass(q, k, v, keep, block):
    s = (k @ q / math.sqrt(q.shape[0])).masked_fill(~keep, -math.inf)
    w = torch.exp(s - s.max())
    return w / w.sum() @ v


def _heads_loop(x, n_rep):
    return torch.cat(
        [x[:, h : h + 1].expand(-1, n_rep, -1, -1) for h in range(x.shape[1])], 1
    )


def _per_row(w, group):  # the page's recipe: the groups are ignored
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    return torch.round(w / scale).to(torch.int8), scale


def _scale_1d(w, group):
    w_int8, scale = _per_row(w, group)
    return w_int8, scale[:, 0]  # (d_out,)


_no_clamp_128 = _groupwise(
    lambda b: (
        torch.round(b / (b.abs().amax(-1, keepdim=True) / 128)).to(torch.int8),
        b.abs().amax(-1, keepdim=True) / 128,
    )
)


def _per_column(w, group):
    scale = w.abs().amax(dim=0, keepdim=True) / 127
    return torch.round(w / scale).to(torch.int8), scale


# the mistakes of the masked variant (issue 27): the exercise's own code first
STREAMING_MASK_MISTAKES = [
    (
        check_streaming_attention,
        _streaming_variant(guard=False),
        "the first block is all masked",
    ),
    (check_streaming_attention, _streaming_variant(mask="ignored"), "had no effect"),
    (check_streaming_attention, _streaming_variant(mask="inverted"), "is inverted"),
    (check_streaming_attention, _streaming_variant(empty="divide"), "0 / 0"),
    (
        check_streaming_attention,
        _streaming_variant(fill=-1e9),
        "gets the average of the values",
    ),
    (
        check_streaming_attention,
        _streaming_variant(empty="ones"),
        "values of output with no kept key differ",
    ),
]


TRIAL = [
    (check_online_softmax, merge_unrescaled, "without rescaling"),
    (check_online_softmax, merge_unguarded, "exp(-inf + inf)"),
    (check_online_softmax, merge_wrong_sign, "exponents are reversed"),
    (
        check_online_softmax,
        lambda m_a, l_a, m_b, l_b: (
            torch.minimum(m_a, m_b),
            merge(m_a, l_a, m_b, l_b)[1],
        ),
        "over both halves",
    ),
    (
        check_online_softmax,
        lambda m_a, l_a, m_b, l_b: online_softmax(torch.stack((m_a, m_b)), 1)[1:],
        "calls the library's",
    ),
    (
        check_streaming_attention,
        pitfalls.streaming_attention_no_output_rescale,
        "partial output is not rescaled",
    ),
    (check_streaming_attention, _streaming_variant(factor="new"), "Which way round"),
    (check_streaming_attention, _streaming_variant(scale=False), "1/sqrt(d)"),
    (check_streaming_attention, _streaming_variant(per_block=True), "average"),
    (check_streaming_attention, _two_pass, "reads all 12 scores together"),
    *STREAMING_MASK_MISTAKES,
    (check_repeat_kv, lambda x, n: x.repeat(1, n, 1, 1), "tiled"),
    (check_repeat_kv, lambda x, n: torch.cat([x] * n, 1), "tiled"),
    (
        check_repeat_kv,
        lambda x, n: x[:, None].expand(-1, n, -1, -1, -1).flatten(1, 2),
        "tiled",
    ),
    (check_repeat_kv, lambda x, n: x.repeat_interleave(n, dim=2), "dimension 1"),
    (check_repeat_kv, _heads_loop, "loops over the heads"),
    (check_repeat_kv, repeat_kv, "calls the library's"),
    (check_quantize_int8, _per_column, "one per group"),
    (check_quantize_int8, _per_row, "groups were ignored"),
    (check_quantize_int8, _no_clamp_128, "wrapped around"),
    (check_quantize_int8, _scale_1d, "(6,)"),
    (check_quantize_int8, lambda w, g: quantize_int8(w), "calls the library's"),
]


@pytest.mark.parametrize(
    "check, wrong, message", TRIAL, ids=[str(i) for i in range(len(TRIAL))]
)
def test_each_trial_mistake_of_chapter_7_gets_its_own_message(
    check, wrong, message, capsys
):
    assert check(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert "Traceback" not in printed
    assert len(printed.strip().splitlines()) == 2, printed


@pytest.mark.parametrize(
    "wrong",
    [case[1] for case in STREAMING_MASK_MISTAKES],
    ids=[str(i) for i in range(len(STREAMING_MASK_MISTAKES))],
)
def test_the_masked_streaming_mistakes_speak_chinese(wrong, capsys):
    set_language("zh")
    _language.MISSING.clear()
    try:
        assert check_streaming_attention(wrong) is False
    finally:
        set_language(None)
    assert not _language.MISSING, _language.MISSING
    text, hint = capsys.readouterr().out.strip().splitlines()
    assert text.startswith("✗ ") and hint.startswith("提示：")
    assert any("\u4e00" <= c <= "\u9fff" for c in text + hint), text
    assert "Hint" not in hint


# ------------------------------------------------ learner trial 2026-12-03 (issue 39)


@pytest.mark.parametrize(
    "wrong, message",
    [
        # finding 3b: both got "l is NaN for row ..., one of whose halves is all -inf"
        (pitfalls.merge_halves_reversed, "the exponents are reversed"),
        (pitfalls.merge_halves_absolute, "no -inf: a number such as exp(m_a)"),
        # the all -inf row keeps its own message; a half that is all -inf its own
        (merge_unguarded, "which is all -inf"),
    ],
    ids=["reversed", "absolute-sums", "unguarded"],
)
def test_each_merge_mistake_of_the_2026_12_03_trial_gets_its_own_message(
    wrong, message, capsys
):
    assert check_online_softmax(wrong) is False
    printed = capsys.readouterr().out
    assert message in printed and "Hint: " in printed, printed
    assert len(printed.strip().splitlines()) == 2, printed


def _with_scale(scale_of):
    """int8 codes rounded with the scale ``scale_of(w, group)`` (d_out, n_groups)."""

    def fn(w, group):
        scale = scale_of(w, group)
        step = scale.repeat_interleave(group, dim=1)
        codes = torch.round(w / step).clamp(-128, 127).to(torch.int8)
        return codes, scale

    return fn


def _blocks(w, group):
    return w.reshape(w.shape[0], w.shape[1] // group, group)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (
            _with_scale(lambda w, g: w.reshape(w.shape[0], g, -1).abs().amax(1) / 127),
            "groups are strided",
        ),
        (
            _with_scale(
                lambda w, g: (w.abs().amax(-1, keepdim=True) / 127).expand(
                    -1, w.shape[1] // g
                )
            ),
            "the row's scale",
        ),
        (_with_scale(lambda w, g: _blocks(w, g).amax(-1) / 127), "not max(|w|)"),
        (_with_scale(lambda w, g: _blocks(w, g).abs().mean(-1) / 127), "mean |w|"),
    ],
    ids=["strided", "row-scale", "no-abs", "mean"],
)
def test_the_int8_group_answers_of_the_2026_12_03_trial_are_named(wrong, message):
    """Learner trial 2026-12-03, finding 5: these got "exceeds half a step" (max/128,
    the fifth, is named by the codes that wrap around, tested above)."""
    with pytest.raises(CheckError, match=message):
        check_quantize_int8.strict(wrong)


def _streaming_variant(
    *,
    on_empty="skip",
    masked_score=-math.inf,
    zero_values=False,
    drop_last=False,
    nan_at_end=False,
):
    """The chapter's streaming solution with one of the trial's changes."""

    def fn(q, k, v, keep, block):
        m, l, acc = -math.inf, 0.0, torch.zeros(v.shape[-1])
        s = k @ q / math.sqrt(q.shape[-1])
        if not zero_values:
            s = s.masked_fill(~keep, masked_score)
        vals = v * keep[:, None] if zero_values else v
        stop = len(s) - len(s) % block if drop_last else len(s)
        for j in range(0, stop, block):
            if on_empty == "break" and not keep[j : j + block].any():
                break
            m_new = max(m, s[j : j + block].max().item())
            shift = m_new if (m_new > -math.inf or nan_at_end) else 0.0
            p = torch.exp(s[j : j + block] - shift)
            alpha = math.exp(m - shift) if not math.isnan(m - shift) else math.nan
            l = l * alpha + p.sum().item()
            acc = acc * alpha + p @ vals[j : j + block]
            m = m_new
        out = acc / l if l > 0 else acc
        return torch.nan_to_num(out, nan=0.0) if nan_at_end else out

    return fn


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_streaming_variant(on_empty="break"), r"break instead of skipping it\)"),
        (_streaming_variant(masked_score=0.0), "set to 0, not -inf"),
        (_streaming_variant(zero_values=True), "values were zeroed"),
        (_streaming_variant(drop_last=True), "last, shorter block"),
        (_streaming_variant(nan_at_end=True), "replaced only at the end"),
    ],
    ids=["break", "scores-0", "values-0", "last-block", "nan-at-end"],
)
def test_the_streaming_answers_of_the_2026_12_03_trial_are_named(wrong, message):
    """Finding 5: all five got a generic message."""
    with pytest.raises(CheckError, match=message):
        check_streaming_attention.strict(wrong)
