"""The MiniLM encoder built from this library's MultiHeadAttention equals Hugging Face's
BertModel (eager attention) with the same real weights, offline."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_chat_template_rejects_bad_messages():
    from transformer_course.chat import apply_chat_template

    with pytest.raises(ValueError, match="role"):
        apply_chat_template([{"role": "robot", "content": "Hi"}])
    with pytest.raises(TypeError, match="content"):
        apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match="at least one"):
        apply_chat_template([])
