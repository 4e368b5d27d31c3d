"""The language of the self-checks' messages: English (the source) or Chinese.

Every message and hint a learner sees is written in English in the check's source, as
a template with ``{placeholders}``; that English text is the msgid of a gettext catalog,
``locale/zh/LC_MESSAGES/exercises.po`` (read with Babel's ``read_po``). A message is
translated first and formatted after, so a translation can move the placeholders where
Chinese puts them, and the English output is the template formatted as it is.

- ``set_language(lang)``: "en" or "zh" for this process; until it is called the
  language is read from the environment variable ``TRANSFORMER_COURSE_LANG`` each time a
  message is shown (unset: "en"). The Chinese notebooks' install cell sets it.
- ``gettext(template)``: the template in the current language (``fail`` and ``passed``
  call it on their templates; a check calls it on a name or phrase it composes).
- ``N_(template)``: marks a template kept in a constant and translated where it is
  shown (gettext's ``gettext_noop``), so the catalog tools find it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from transformer_course import _validation

LANGUAGES = ("en", "zh")
ENV_VARIABLE = "TRANSFORMER_COURSE_LANG"
CATALOG = Path(__file__).with_name("locale") / "zh" / "LC_MESSAGES" / "exercises.po"

_CHOSEN: dict[str, str | None] = {"lang": None}  # set_language's choice, if any
MISSING: set[str] = set()  # templates shown in Chinese that the catalog lacks


def set_language(lang: str | None) -> None:
    """Show the self-checks' messages in ``lang``, "en" (English) or "zh" (Chinese),
    from now on in this process; ``None`` goes back to ``TRANSFORMER_COURSE_LANG``.

    Raises:
        ValueError: for another language, e.g. "lang: expected one of ['en', 'zh'],
            got 'fr'".
    """
    if lang is not None:
        _validation.one_of("lang", lang, LANGUAGES)
    _CHOSEN["lang"] = lang


def get_language() -> str:
    """The language messages are shown in now: ``set_language``'s choice, else the
    environment variable ``TRANSFORMER_COURSE_LANG``, else "en".

    Raises:
        ValueError: when the variable names another language.
    """
    if _CHOSEN["lang"] is not None:
        return _CHOSEN["lang"]
    lang = os.environ.get(ENV_VARIABLE, "").strip() or "en"
    _validation.one_of(ENV_VARIABLE, lang, LANGUAGES)
    return lang


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, str]:
    """The Chinese catalog, msgid (the English template) -> msgstr; untranslated
    entries (empty msgstr) are left out."""
    from babel.messages.pofile import read_po

    with CATALOG.open("rb") as f:
        po = read_po(f, locale="zh_Hans_CN")
    return {m.id: m.string for m in po if m.id and m.string}


def gettext(template: str) -> str:
    """``template`` (an English message with its ``{placeholders}``, not yet
    formatted) in the current language; the English template itself when the catalog
    has no translation (recorded in ``MISSING``)."""
    if get_language() == "en":
        return template
    translated = catalog().get(template)
    if translated is None:
        MISSING.add(template)
        return template
    return translated


def N_(template: str) -> str:  # gettext's name for a marker
    """Mark ``template`` for the catalog without translating it now."""
    return template
