"""The measured numbers a chapter's prose quotes, in the book and in a notebook.

In the book build, ``glue(name, value)`` hands the value to myst_nb, which writes it
where the Markdown says ``{glue:text}`name:.1f```. A notebook (Colab) has no such
rendering, so ``glue`` also keeps every value here, and the notebooks that
``tools/sync_notebooks.py`` generates show a paragraph that quotes numbers through
``prose(markdown)``: the paragraph, rendered with the values this kernel measured.
"""

from __future__ import annotations

import re

GLUED: dict[str, object] = {}

_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`(?P<name>[\w-]+)(?::(?P<spec>[^`]*))?`")


ZH_SUFFIX = "_zh"  #: the Chinese words of a value glued as ``name`` are ``name_zh``


def glue(name: str, value, display: bool = False, *, zh: str | None = None) -> None:
    """Keep ``value`` under ``name`` for the prose, and pass it to myst_nb's ``glue``
    when myst_nb is installed (the book build).

    Args:
        name: the name the prose quotes, ``{glue:text}`name```.
        value: a number, or words the code chooses from what it measured.
        display: show the value where the cell runs (myst_nb's ``display``).
        zh: for words, the same words in Chinese, glued as ``name_zh``: the Chinese
            edition shares the English one's execution (its code cells are the same),
            so a verdict such as "faster than" is glued in both languages and the
            Chinese page quotes ``{glue:text}`name_zh```.
    """
    GLUED[name] = value
    if zh is not None:
        GLUED[name + ZH_SUFFIX] = zh
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, value, display=display)
    if zh is not None:
        myst_glue(name + ZH_SUFFIX, zh, display=display)


def fill(markdown: str) -> str:
    """``markdown`` with each ``{glue:text}`name:spec``` role replaced by the value
    glued under ``name``, formatted with ``spec`` (e.g. ``.1f``).

    Raises:
        KeyError: naming a value that no cell has glued yet (a cell above was not run).
    """

    def value(match: re.Match) -> str:
        name, spec = match["name"], match["spec"] or ""
        if name not in GLUED:
            raise KeyError(
                f"no value glued as {name!r} yet: run the cells above this one first"
            )
        return format(GLUED[name], spec)

    return _ROLE.sub(value, markdown)


def prose(markdown: str):
    """Show ``markdown`` (a chapter paragraph) with the glued values filled in."""
    from IPython.display import Markdown, display

    display(Markdown(fill(markdown)))
