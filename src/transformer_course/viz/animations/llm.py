"""Chapter 10: a modern LLM. The chat model writing its reply token by token, with its
KV cache growing and the next-token distribution cut by top-p (Holtzman et al. 2020,
"The Curious Case of Neural Text Degeneration", section 3.1), and grouped-query heads
sharing keys and values (Ainslie et al. 2023, "GQA", section 2)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML
from matplotlib.animation import FuncAnimation
from matplotlib.patches import Rectangle

from transformer_course import _validation
from transformer_course.decoding import filter_logits
from transformer_course.viz import style
from transformer_course.viz.animations._frames import as_array
from transformer_course.viz.animations._player import animation_html

_DPI = 80  # 8.5 in x 80 dpi = 680 px: the column's width, 10 pt text at 11 px


def generation_animation(
    probs,
    chosen,
    cache_lengths,
    token_text: Callable[[int], str],
    *,
    top_p: float = 0.9,
    top_k: int = 8,
    cache_bytes_per_token: int | None = None,
    interval: int = 700,
) -> HTML:
    """A reply written token by token, with the KV cache and the top-p cut (ch. 10).

    Frame f is decoding step f: on top the reply so far with the token chosen at this
    step underlined in the title; at the left the ``top_k`` most likely next tokens
    and their probabilities, the bars inside the nucleus of mass ``top_p`` coloured
    (``decoding.filter_logits`` decides which), the rest grey, the chosen one
    outlined; at the right the KV cache as one cell per cached token (the prompt's in
    the key colour, the reply's in the value colour). The first frame is the first
    step, whose distribution and cache (the prompt) are already drawn.

    Args:
        probs: (N, V) the next-token probabilities of the N steps.
        chosen: (N,) the token id chosen at each step.
        cache_lengths: (N,) tokens in the cache when step f's distribution was made
            (the prompt's length at step 0, then one more each step).
        token_text: maps a token id to its text (e.g. ``lambda i:
            tokenizer.decode([i])``).
        top_p: the nucleus mass in (0, 1]. top_k: bars drawn (>= 1).
        cache_bytes_per_token: when given, the cache's size is stated in KiB.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), N frames.

    Raises:
        ValueError: ``probs`` not (N, V) with N >= 1, ``chosen`` or
            ``cache_lengths`` not (N,), cache lengths that are not increasing, a
            top_p outside (0, 1].
        TypeError: a top_k that is not an int.
    """
    p = as_array("probs", probs, 2)
    n = p.shape[0]
    ids = as_array("chosen", chosen, 1).astype(int)
    lengths = as_array("cache_lengths", cache_lengths, 1).astype(int)
    if n == 0:
        raise ValueError("probs: expected at least one step, got shape (0, V)")
    for name, a in (("chosen", ids), ("cache_lengths", lengths)):
        if a.shape != (n,):
            raise ValueError(f"{name}: expected shape ({n},), got {a.shape}")
    if np.any(np.diff(lengths) <= 0) or lengths[0] < 1:
        raise ValueError(
            f"cache_lengths: expected increasing lengths >= 1, got {lengths.tolist()}"
        )
    _validation.nucleus_mass("top_p", top_p)
    _validation.positive_int("top_k", top_k)
    logp = torch.as_tensor(p).clamp_min(1e-30).log()
    kept = filter_logits(logp, top_p=top_p).isfinite().numpy()  # (N, V) nucleus
    top = np.argsort(-p, axis=1, kind="stable")[:, :top_k]  # (N, k)
    capacity = int(lengths[-1])
    prompt = int(lengths[0])
    fig = plt.figure(figsize=(8.5, 4.4), dpi=_DPI)
    ax_p = fig.add_axes([0.19, 0.13, 0.33, 0.55])
    ax_c = fig.add_axes([0.6, 0.13, 0.38, 0.55])
    text = fig.text(0.02, 0.97, "", va="top", fontsize=11, family="monospace")
    y = np.arange(top_k)
    bars = ax_p.barh(y, np.zeros(top_k), color="lightgrey", edgecolor="none")
    ax_p.set_xlim(0, 1)
    ax_p.set_ylim(top_k - 0.5, -0.5)
    ax_p.set_yticks(y, [""] * top_k)
    ax_p.set_xlabel("next-token probability")
    ax_p.set_title(f"top {top_k}; coloured: inside top-p {top_p:g}", fontsize=10)
    cols = 16
    rows = -(-capacity // cols)
    cells = []
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        cells.append(
            ax_c.add_patch(
                Rectangle((c, r), 0.9, 0.9, facecolor="white", edgecolor="lightgrey")
            )
        )
    ax_c.set_xlim(-0.2, cols)
    ax_c.set_ylim(rows + 0.2, -0.2)
    ax_c.set_axis_off()
    cache_title = ax_c.set_title("", fontsize=10)

    def shown(i: int) -> str:
        return repr(token_text(int(i)))[1:-1] or " "

    def update(frame: int):
        row, length = p[frame], int(lengths[frame])
        for b, tok in zip(bars, top[frame]):
            b.set_width(row[tok])
            inside = kept[frame, tok]
            b.set_color(style.ROLE_COLORS["attention"] if inside else "lightgrey")
            b.set_edgecolor("black" if tok == ids[frame] else "none")
            b.set_linewidth(2)
        ax_p.set_yticks(y, [shown(t)[:14] for t in top[frame]])
        for i, cell in enumerate(cells):
            role = "key" if i < prompt else "value"
            cell.set_facecolor(
                style.tint(style.ROLE_COLORS[role], 0.3) if i < length else "white"
            )
        size = ""
        if cache_bytes_per_token:
            size = f", {length * cache_bytes_per_token / 1024:,.0f} KiB"
        cache_title.set_text(f"KV cache: {length} tokens{size}")
        reply = "".join(token_text(int(i)) for i in ids[: frame + 1])
        lines = textwrap.wrap(reply.replace("\n", " "), 72)[-3:]
        text.set_text(
            f"step {frame + 1} of {n}: chose {shown(ids[frame])!r}\n" + "\n".join(lines)
        )
        return (*bars, *cells, text, cache_title)

    anim = FuncAnimation(fig, update, frames=n, interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {n} frames: the model writes its reply one token a step; "
            f"each frame shows the {top_k} most likely next tokens with the ones "
            f"inside the top-p {top_p:g} nucleus coloured and the chosen one "
            f"outlined, and the KV cache growing from {prompt} to {capacity} tokens"
        ),
    )


def grouped_query_animation(
    weights,
    n_kv_heads: int,
    tokens=None,
    *,
    layer: int | None = None,
    interval: int = 900,
) -> HTML:
    """Grouped-query attention: which key/value head each query head reads (ch. 10).

    Frame h is query head h: at the left the H query heads (query colour) above the
    ``n_kv_heads`` key/value heads (key and value colours), with a line from each
    query head to the key/value head of its group (head h reads key/value head
    ``h // (H / n_kv_heads)``, as ``repeat_interleave`` lays them out), head h and its
    group drawn bold; at the right head h's attention weights. The first frame is
    head 0 with its map.

    Args:
        weights: (H, T, T) one layer's attention weights (rows sum to 1).
        n_kv_heads: key/value heads, a divisor of H.
        tokens: T labels (optional; the first is named in the title).
        layer: the layer's index, for the title.
        interval: milliseconds between frames.

    Returns:
        Animation HTML (see ``animation_html``), H frames.

    Raises:
        ValueError: ``weights`` not (H, T, T), n_kv_heads not a divisor of H,
            ``tokens`` not of length T.
        TypeError: n_kv_heads not an int.
    """
    w = as_array("weights", weights, 3)
    h_q, t, t2 = w.shape
    if t != t2:
        raise ValueError(f"weights: expected shape (H, T, T), got {w.shape}")
    _validation.positive_int("n_kv_heads", n_kv_heads)
    _validation.divisor("n_kv_heads", n_kv_heads, "H", h_q)
    if tokens is not None and len(tokens) != t:
        raise ValueError(f"tokens: expected {t} labels, got {len(tokens)}")
    group = h_q // n_kv_heads
    fig, (ax_s, ax_w) = plt.subplots(
        1, 2, figsize=(8.5, 4.2), dpi=_DPI, gridspec_kw={"width_ratios": [1.1, 1]}
    )
    fig.subplots_adjust(left=0.02, right=0.97, bottom=0.14, top=0.84, wspace=0.15)
    qx = np.linspace(0, 1, h_q)
    kx = np.array([qx[g * group : (g + 1) * group].mean() for g in range(n_kv_heads)])
    links = [
        ax_s.plot([qx[h], kx[h // group]], [1, 0], color="lightgrey")[0]
        for h in range(h_q)
    ]
    q_boxes = [
        ax_s.add_patch(
            Rectangle(
                (x - 0.04, 0.95),
                0.08,
                0.15,
                facecolor=style.tint(style.ROLE_COLORS["query"], 0.5),
                edgecolor="none",
            )
        )
        for x in qx
    ]
    kv_boxes = []
    for g, x in enumerate(kx):
        for dx, role in ((-0.05, "key"), (0.05, "value")):
            kv_boxes.append(
                ax_s.add_patch(
                    Rectangle(
                        (x + dx - 0.045, -0.1),
                        0.09,
                        0.15,
                        facecolor=style.tint(style.ROLE_COLORS[role], 0.5),
                        edgecolor="none",
                    )
                )
            )
        ax_s.text(x, -0.2, f"K/V {g}", ha="center", va="top", fontsize=10)
    for h, x in enumerate(qx):
        ax_s.text(x, 1.15, f"Q{h}", ha="center", va="bottom", fontsize=10)
    ax_s.set_xlim(-0.1, 1.1)
    ax_s.set_ylim(-0.4, 1.4)
    ax_s.set_axis_off()
    ax_s.set_title(f"{h_q} query heads, {n_kv_heads} key/value heads", fontsize=11)
    image = ax_w.imshow(w[0], cmap="Blues", vmin=0, vmax=1)
    ax_w.set_xlabel("key position")
    ax_w.set_ylabel("query position")
    title = fig.suptitle("")
    where = "" if layer is None else f"layer {layer}, "
    first = "" if tokens is None else f"; key 0 is {str(tokens[0])!r}"

    def update(h: int):
        g = h // group
        for i, line in enumerate(links):
            mine = i == h
            line.set_color(style.ROLE_COLORS["query"] if mine else "lightgrey")
            line.set_linewidth(3 if mine else 1 + (i // group == g))
        for i, box in enumerate(q_boxes):
            box.set_edgecolor("black" if i == h else "none")
            box.set_linewidth(2)
        for i, box in enumerate(kv_boxes):
            box.set_edgecolor("black" if i // 2 == g else "none")
            box.set_linewidth(2)
        image.set_data(w[h])
        title.set_text(f"{where}query head {h} reads key/value head {g}{first}")
        return (*links, *q_boxes, *kv_boxes, image, title)

    anim = FuncAnimation(fig, update, frames=h_q, interval=interval)
    return animation_html(
        anim,
        alt=(
            f"Animation in {h_q} frames: {h_q} query heads joined in groups of "
            f"{group} to {n_kv_heads} shared key/value heads; each frame highlights "
            "one query head, the key/value head it reads, and its attention weights "
            f"over {t} tokens"
        ),
    )
