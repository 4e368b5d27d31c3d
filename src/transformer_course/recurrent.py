"""Recurrent encoder-decoders, the models attention replaced, and a copy task to compare.

Derived in chapter 1 ("From recurrence to attention"). Shape letters: B batch, S source
length, T target length, E embedding size, H hidden (state) size, A attention size,
V vocabulary.

    LSTMSeq2Seq(attention=False): an LSTM reads the source; its last state (h, c), a
        fixed-size vector whatever the length, is all the decoder LSTM starts from
        (Sutskever et al. 2014).
    LSTMSeq2Seq(attention=True): the same, plus additive attention from each decoder
        state over all encoder states (Bahdanau et al. 2015), so nothing has to pass
        through the fixed-size state. As in Luong et al. 2015 the attention is computed
        from the current decoder state and its context goes into the output layer
        only, so the whole target runs through ``nn.LSTM`` in one call.

The copy task: the target is the source, token for token. The model must carry every
token from where it was read to where it is written, so what a fixed-size state has to
hold grows with the length.

Sources:
    Sutskever, Vinyals and Le 2014, "Sequence to Sequence Learning with Neural
    Networks" (LSTM encoder-decoder); Bahdanau, Cho and Bengio 2015, "Neural Machine
    Translation by Jointly Learning to Align and Translate", section 3.1 (additive
    attention over the encoder states); Luong, Pham and Manning 2015, "Effective
    Approaches to Attention-based Neural Machine Translation", section 3 (attention
    from the current decoder state); Hochreiter and Schmidhuber 1997 (LSTM).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.additive import additive_attention
from transformer_course.data import BOS_ID, EOS_ID
from transformer_course.training import evaluating

Tensor = torch.Tensor

FIRST_SYMBOL = EOS_ID + 1  # the copy task's symbols are FIRST_SYMBOL .. vocab_size - 1


def copy_batch(
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    generator: torch.Generator | None = None,
    device=None,
) -> tuple[Tensor, Tensor]:
    """A batch of the copy task: random symbols; the target repeats the source.

    Args:
        batch_size: B >= 1.
        length: L >= 1 symbols per sequence (no padding: one length per batch).
        vocab_size: V >= 4; symbols are drawn uniformly from ``FIRST_SYMBOL`` (3) to
            V - 1 (ids 0, 1, 2 are the library's padding, ``BOS_ID`` and ``EOS_ID``).
        generator: a ``torch.Generator`` (on the CPU) for repeatable batches.
        device: where the returned tensors live.

    Returns:
        ``(src, tgt)``: int64 tensors (B, L) and (B, L + 1); ``tgt`` is ``BOS_ID``
        followed by ``src``, so teacher forcing reads ``tgt[:, :-1]`` and predicts
        ``tgt[:, 1:]``.

    Raises:
        ValueError: a size below its minimum, naming the argument.
        TypeError: a size that is not an int.
    """
    _validation.positive_int("batch_size", batch_size)
    _validation.positive_int("length", length)
    _validation.positive_int("vocab_size", vocab_size, FIRST_SYMBOL + 1)
    src = torch.randint(
        FIRST_SYMBOL, vocab_size, (batch_size, length), generator=generator
    )
    tgt = torch.cat([torch.full((batch_size, 1), BOS_ID), src], dim=1)
    return src.to(device), tgt.to(device)


def copy_batches(
    batch_size: int,
    min_len: int,
    max_len: int,
    vocab_size: int,
    *,
    generator: torch.Generator | None = None,
    device=None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """An endless stream of ``copy_batch``es, each of one length drawn uniformly from
    ``min_len`` .. ``max_len`` (inclusive). Raises ValueError as ``copy_batch``, or when
    ``max_len < min_len``."""
    if max_len < min_len:
        raise ValueError(f"max_len: expected >= min_len = {min_len}, got {max_len}")
    while True:
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        yield copy_batch(
            batch_size, length, vocab_size, generator=generator, device=device
        )


class LSTMSeq2Seq(nn.Module):
    """LSTM encoder-decoder, with or without additive attention over the encoder states.

    Args:
        vocab_size: V, shared by source and target.
        d_embed: E, token embedding size.
        d_hidden: H, LSTM state size (the fixed-size state of the encoder).
        attention: add additive attention from each decoder state over the encoder
            states, with hidden size ``d_attn``.
        d_attn: A, hidden size of the additive attention's scoring network.
        n_layers: stacked LSTM layers in the encoder and in the decoder.

    ``encode(src)``: src ids (B, S) -> ``(memory (B, S, H), state)``, ``state`` the
    encoder's last ``(h, c)``, each (n_layers, B, H).
    ``decode(tgt, memory, state)``: tgt ids (B, T) -> logits (B, T, V). The decoder
    LSTM starts from ``state``; with attention, each of its outputs d_t is the query
    of ``additive_attention(d_t, memory, memory)`` and the output layer reads
    [d_t; context_t]; without attention it reads d_t only, and ``memory`` is unused.
    ``forward(src, tgt)``: teacher forcing, ``decode(tgt, *encode(src))``.
    The last attention weights (B, T, S) are kept in ``self.attn_weights``.

    Raises:
        TypeError / ValueError: ids that are not an integer (B, L) tensor, or ids
            outside [0, V).

    Sources: Sutskever et al. 2014 (section 2); Bahdanau et al. 2015 (section 3.1);
    Luong et al. 2015 (section 3.1, attention from the current state).
    """

    def __init__(
        self,
        vocab_size: int,
        d_embed: int,
        d_hidden: int,
        *,
        attention: bool = False,
        d_attn: int = 32,
        n_layers: int = 1,
    ):
        super().__init__()
        self.vocab_size, self.attention = vocab_size, attention
        self.embed = nn.Embedding(vocab_size, d_embed)
        self.encoder = nn.LSTM(d_embed, d_hidden, n_layers, batch_first=True)
        self.decoder = nn.LSTM(d_embed, d_hidden, n_layers, batch_first=True)
        d_out = 2 * d_hidden if attention else d_hidden
        self.out = nn.Linear(d_out, vocab_size)
        if attention:  # score(d, m) = w_score . tanh(w_q d + w_k m)
            self.w_q = nn.Parameter(torch.randn(d_attn, d_hidden) * d_hidden**-0.5)
            self.w_k = nn.Parameter(torch.randn(d_attn, d_hidden) * d_hidden**-0.5)
            self.w_score = nn.Parameter(torch.randn(d_attn) * d_attn**-0.5)
        self.attn_weights: Tensor | None = None

    def _check(self, name: str, ids) -> None:
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int32, torch.int64):
            what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
            raise TypeError(
                f"{name}: expected an integer tensor of token ids, got {what}"
            )
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(
                f"{name}: expected shape (B, L) with L >= 1, got {tuple(ids.shape)}"
            )
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(
                f"{name}: expected ids in [0, {self.vocab_size}), got ids "
                f"from {int(ids.min())} to {int(ids.max())}"
            )

    def encode(self, src: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        self._check("src", src)
        memory, state = self.encoder(self.embed(src))  # (B, S, H), 2 x (layers, B, H)
        return memory, state

    def decode(
        self, tgt: Tensor, memory: Tensor, state: tuple[Tensor, Tensor]
    ) -> Tensor:
        self._check("tgt", tgt)
        dec, _ = self.decoder(self.embed(tgt), state)  # (B, T, H)
        if not self.attention:
            return self.out(dec)  # (B, T, V): the state is all the decoder knows
        context, self.attn_weights = additive_attention(
            dec, memory, memory, self.w_q, self.w_k, self.w_score
        )  # (B, T, H), (B, T, S)
        return self.out(torch.cat([dec, context], dim=-1))  # (B, T, V)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.decode(tgt, *self.encode(src))


@torch.no_grad()
def greedy_copy(model: nn.Module, src: Tensor, length: int | None = None) -> Tensor:
    """Decode ``length`` tokens greedily (default: as many as the source has).

    Works for any model with ``encode(src) -> tuple`` and ``decode(tgt, *encoded) ->
    logits (B, T, V)``: ``LSTMSeq2Seq`` and the library's ``Transformer``. Each step
    re-reads the whole prefix (no cache: short sequences, clear code).

    Args:
        model: the seq2seq model (put in eval mode by the caller).
        src: source ids (B, S).
        length: how many tokens to produce (>= 1).

    Returns:
        int64 ids (B, length), without the leading ``BOS_ID``.
    """
    length = src.shape[1] if length is None else length
    encoded = model.encode(src)
    ys = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=src.device)
    for _ in range(length):
        logits = model.decode(ys, *encoded)  # (B, t, V)
        ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ys[:, 1:]


def copy_accuracy(
    model: nn.Module,
    length: int,
    vocab_size: int,
    *,
    batch_size: int = 64,
    generator: torch.Generator | None = None,
    device=None,
) -> float:
    """Per-token accuracy on fresh copy sequences of one length, with teacher forcing:
    the fraction of positions where the most likely next token is the right one, given
    the right tokens before it (how the models are trained). Runs ``model`` in eval
    mode without gradients, then gives every submodule back the mode it had.

    Returns:
        A float in [0, 1]; guessing gives about 1 / (vocab_size - FIRST_SYMBOL).
    """
    src, tgt = copy_batch(
        batch_size, length, vocab_size, generator=generator, device=device
    )
    with evaluating(model):  # eval mode, no graph; each module's mode given back
        predicted = model(src, tgt[:, :-1]).argmax(-1)  # (B, L)
    return (predicted == tgt[:, 1:]).float().mean().item()
