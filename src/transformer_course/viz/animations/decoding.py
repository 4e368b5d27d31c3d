"""Chapter 6: the translator decoding token by token, and beam search's hypotheses.

Both animations draw what the chapter's model computed: the cross-attention weights of
a greedy translation (Vaswani et al. 2017, section 3.2.3, "encoder-decoder
attention"), and the hypotheses a beam search kept at each step (Wu et al. 2016,
section 7, with the length penalty of equation 14).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.colors import LinearSegmentedColormap

from transformer_course.viz import style
from transformer_course.viz.animations._player import animation_html


def cross_attention_decode_animation(
    cross, src_tokens: Sequence[str], out_tokens: Sequence[str], *, interval: int = 900
) -> HTML:
    """Greedy decoding, one output token per frame, with the cross-attention row that
    token's query put on the source (chapter 6).

    Frame t shows rows 0..t of the (T, S) cross-attention map (the rows below are
    still empty: those tokens are not written yet) and, as the title, the German
    decoded so far. The first frame already shows the first token's row.

    Args:
        cross: (T, S) cross-attention weights (e.g. the last decoder layer's, averaged
            over the heads), one row per output token.
        src_tokens: S source tokens (the keys). out_tokens: T output tokens.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), T frames.

    Raises:
        ValueError: ``cross`` not 2-D, or token lists whose lengths do not match it.
    """
    if isinstance(cross, torch.Tensor):
        cross = cross.detach().float().cpu()
    w = np.asarray(cross, dtype=float)
    if w.ndim != 2 or w.shape != (len(out_tokens), len(src_tokens)):
        raise ValueError(
            "cross: expected shape (T, S) = (len(out_tokens), len(src_tokens)) = "
            f"{(len(out_tokens), len(src_tokens))}, got {w.shape}"
        )
    t_len, s_len = w.shape
    fig, ax = plt.subplots(
        figsize=(5.0, 1.8 + 0.3 * t_len), dpi=style.SAVE_DPI, layout="constrained"
    )
    cmap = LinearSegmentedColormap.from_list(
        "cross", ["white", style.ROLE_COLORS["attention"]]
    )
    image = ax.imshow(np.zeros_like(w), vmin=0, vmax=1, cmap=cmap, aspect="auto")
    ax.set_xticks(range(s_len), src_tokens, rotation=90)
    ax.set_yticks(range(t_len), out_tokens)
    ax.set_xlabel("source token (key)")
    ax.set_ylabel("output token (query)")
    fig.colorbar(image, ax=ax, label="cross-attention")
    title = ax.set_title("")

    def update(t: int):
        shown = np.zeros_like(w)
        shown[: t + 1] = w[: t + 1]
        image.set_data(shown)
        decoded = "".join(out_tokens[: t + 1]).replace("<eos>", " <eos>")
        title.set_text(f"step {t + 1} of {t_len}: {decoded}")
        return (image, title)

    anim = FuncAnimation(fig, update, frames=t_len, interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {t_len} frames: the translator writes "
            f"{' '.join(out_tokens)} token by token; each frame adds that token's "
            f"row of cross-attention over the source tokens {' '.join(src_tokens)}"
        ),
    )


def beam_search_animation(
    steps: Sequence, *, best: int | None = None, interval: int = 900
) -> HTML:
    """Beam search as a tree of hypotheses, one decoding step per frame (chapter 6).

    Column t holds the K tokens the beam kept at step t, one per hypothesis row, with
    a line to the parent hypothesis each one extends (a hypothesis that lost its
    place is simply not continued); each token is labelled with its hypothesis's
    log-probability so far. A finished hypothesis (it produced ``<eos>``) keeps its
    row and is extended by padding, drawn as a dot. In the last frame the hypothesis
    ``best`` (the one the length penalty ranks first) is traced back to the start.

    Args:
        steps: one entry per step: ``(parents, tokens, scores)``, each of length K:
            which row of the previous step each hypothesis extends, the token it
            appended (a string; "<pad>" for a finished one) and its log-probability.
        best: row of the winning hypothesis at the last step (default: none marked).
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), one frame per step.

    Raises:
        ValueError: no steps, steps of different beam sizes, a parent outside
            0..K-1, or ``best`` outside 0..K-1.
    """
    if not steps:
        raise ValueError("steps: expected at least one (parents, tokens, scores)")
    k = len(steps[0][0])
    for i, (parents, tokens, scores) in enumerate(steps):
        if not len(parents) == len(tokens) == len(scores) == k:
            raise ValueError(
                f"steps[{i}]: expected parents, tokens and scores of the beam size "
                f"{k}, got lengths {len(parents)}, {len(tokens)}, {len(scores)}"
            )
        if any(not 0 <= int(p) < k for p in parents):
            raise ValueError(
                f"steps[{i}]: expected parents in 0..{k - 1}, got {list(parents)}"
            )
    if best is not None and not 0 <= best < k:
        raise ValueError(f"best: expected a row in 0..{k - 1}, got {best}")
    n = len(steps)
    path = []  # (step, row) of the winner, traced back from the last step
    if best is not None:
        row = best
        for t in range(n - 1, -1, -1):
            path.append((t, row))
            row = int(steps[t][0][row])
    fig, ax = plt.subplots(figsize=(7.0, 1.2 + 0.7 * k), dpi=style.SAVE_DPI)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.14, top=0.82)
    ax.set_xlim(-1.5, n - 0.5)
    ax.set_ylim(k - 0.5, -0.6)
    ax.axis("off")
    ax.text(-1, 0, "<bos>", ha="center", va="center")
    artists = []
    for t, (parents, tokens, scores) in enumerate(steps):
        items = []
        for r in range(k):
            done = tokens[r] == "<pad>"
            x0, y0 = (t - 1, int(parents[r])) if t else (-1, 0)
            (line,) = ax.plot(
                [x0 + 0.4, t - 0.4], [y0, r], color=style.ROLE_COLORS["residual"], lw=1
            )
            label = ax.text(
                t,
                r,
                "\u00b7" if done else f"{tokens[r]}\n{float(scores[r]):.2f}",
                ha="center",
                va="center",
                color=style.ROLE_COLORS["query"],
            )
            items.append((line, label))
        artists.append(items)
    title = fig.suptitle("")

    def update(frame: int):
        for t, items in enumerate(artists):
            for r, (line, label) in enumerate(items):
                line.set_visible(t <= frame)
                label.set_visible(t <= frame)
                on_path = frame == n - 1 and (t, r) in path
                line.set_color(
                    style.ROLE_COLORS["attention" if on_path else "residual"]
                )
                line.set_linewidth(2.5 if on_path else 1)
                label.set_fontweight("bold" if on_path else "normal")
        title.set_text(
            f"step {frame + 1} of {n}: {k} hypotheses, log-probability below"
            + ("; bold: the winner" if path and frame == n - 1 else "")
        )
        return (title,)

    anim = FuncAnimation(fig, update, frames=n, interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: beam search with {k} hypotheses; each frame "
            "adds the tokens kept at one step, each linked to the hypothesis it "
            "extends and labelled with its log-probability"
            + ("; the last frame traces the winning hypothesis" if path else "")
        ),
    )
