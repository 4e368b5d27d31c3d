"""Talking to a real chat model: its tokenizer, its chat template, and generation.

Derived in chapter 10 ("A modern LLM"). An instruction-tuned model was trained on
conversations written in one fixed format (ChatML for SmolLM2): each turn is
``<|im_start|>role\\n...<|im_end|>\\n``, and the prompt ends with the opening of the
assistant's turn. The model then writes the answer and closes its turn with
``<|im_end|>``, the end-of-turn token generation stops on.

The tokenizer is rebuilt from the GGUF file's metadata with Hugging Face
``tokenizers``: byte-level BPE (Sennrich et al. 2016; GPT-2's byte alphabet) with its
49,152 tokens and 48,900 merges, digits split one by one before BPE (llama.cpp's
"smollm" pre-tokenizer), control tokens kept whole.

Sources: Radford et al. 2019 (byte-level BPE); Sennrich et al. 2016 (BPE); OpenAI's
ChatML; Allal et al. 2025 (SmolLM2).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from transformer_course.decoding import generate

Tensor = torch.Tensor
CONTROL = 3  # GGUF token type of special tokens (<|im_start|>, <|im_end|>, ...)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def gguf_tokenizer(reader):
    """A ``tokenizers.Tokenizer`` equal to the model's, from a GGUF reader's
    ``tokenizer.ggml.*`` metadata (a "gpt2" byte-level BPE).

    Raises ValueError if the file's tokenizer is not byte-level BPE ("gpt2")."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    fields = reader.fields
    kind = fields["tokenizer.ggml.model"].contents()
    if kind != "gpt2":
        raise ValueError(
            f"reader: expected a 'gpt2' (byte-level BPE) tokenizer, got {kind!r}"
        )
    tokens = fields["tokenizer.ggml.tokens"].contents()
    kinds = fields["tokenizer.ggml.token_type"].contents()
    merges = [
        tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()
    ]
    vocab = {t: i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [t for t, k in zip(tokens, kinds) if k == CONTROL]
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tokenizer


def apply_chat_template(
    messages: Sequence[dict[str, str]],
    *,
    add_generation_prompt: bool = True,
    default_system: str = DEFAULT_SYSTEM,
) -> str:
    """The ChatML text of a conversation, as SmolLM2's own (Jinja) template writes it:
    a default system turn when the first message is not one, every message as
    ``<|im_start|>role\\ncontent<|im_end|>\\n``, then ``<|im_start|>assistant\\n``.

    Raises:
        TypeError / ValueError: messages that are not dicts with a "role" in
            (system, user, assistant) and a str "content", or no message at all.
    """
    if not messages:
        raise ValueError("messages: expected at least one message, got none")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise TypeError(f"messages: expected dicts with str 'content', got {m!r}")
        if m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(
                f"messages: expected role system, user or assistant, got {m.get('role')!r}"
            )
    turns = [] if messages[0]["role"] == "system" else [("system", default_system)]
    turns += [(m["role"], m["content"]) for m in messages]
    text = "".join(
        f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns
    )
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def encode_chats(tokenizer, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
    """Token ids (B, T) of each prompt as one user turn, left-padded with id 0, and
    the mask (B, T) bool, True = real token (``generate``'s ``attention_mask``)."""
    rows = [
        tokenizer.encode(apply_chat_template([{"role": "user", "content": p}])).ids
        for p in prompts
    ]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    keep = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, T - len(r) :] = torch.tensor(r)
        keep[b, T - len(r) :] = True
    return ids, keep


def chat(
    model,
    tokenizer,
    prompts: str | Sequence[str],
    max_new_tokens: int = 48,
    **sampling,
) -> str | list[str]:
    """The model's answers to one prompt (a str) or several (a list, one batch): each
    prompt becomes a user turn, ``decoding.generate`` continues it with the KV cache
    (greedy unless ``sampling`` sets temperature/top_k/top_p/generator) and stops at
    ``<|im_end|>``; the answer is the text before it.

    Raises:
        TypeError: prompts that are not a str or a list of str.
        ValueError: as ``generate``.
    """
    single = isinstance(prompts, str)
    batch = [prompts] if single else list(prompts)
    if not batch or not all(isinstance(p, str) for p in batch):
        raise TypeError(
            f"prompts: expected a str or a non-empty list of str, got {prompts!r}"
        )
    end = tokenizer.token_to_id("<|im_end|>")
    ids, keep = encode_chats(tokenizer, batch)
    device = next(model.parameters()).device
    out = generate(
        model,
        ids.to(device),
        max_new_tokens,
        attention_mask=keep.to(device),
        eos_token_id=end,
        **sampling,
    )
    answers = []
    for row in out[:, ids.shape[1] :].tolist():
        row = row[: row.index(end)] if end in row else row
        answers.append(tokenizer.decode(row))
    return answers[0] if single else answers
