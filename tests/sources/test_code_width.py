"""No code cell of a chapter scrolls sideways: at most MAX_WIDTH characters a line.

The book's pages show code in a column about 80 characters wide (1280-pixel window); a
longer line gets a horizontal scroll bar, and the end of the line is easy to miss. Every
line of every ``{code-cell}`` in book/NN_*.md must fit. A wide (CJK) character takes two
columns of a monospaced font, so it counts twice.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
MAX_WIDTH = 80
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def columns(line: str) -> int:
    """The columns ``line`` takes in a monospaced font: two for a wide character."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def long_lines(text: str, limit: int = MAX_WIDTH) -> list[tuple[int, int, str]]:
    """(line number in the file, width, line) for each code-cell line over limit."""
    found = []
    for cell in CELL.finditer(text):
        first = text.count("\n", 0, cell.start(1)) + 1
        for i, line in enumerate(cell.group(1).split("\n")):
            if columns(line) > limit:
                found.append((first + i, columns(line), line))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_code_cells_fit_the_page(chapter):
    found = long_lines(chapter.read_text())
    report = "\n".join(
        f"  {chapter.name}:{n}: {w} columns: {line.strip()[:60]}..."
        for n, w, line in found
    )
    assert not found, (
        f"{len(found)} code line(s) over {MAX_WIDTH} characters:\n{report}"
    )


def test_the_check_finds_a_long_line():
    short, wide = "x = 1", "y = " + "1 + " * 30 + "1"
    text = f"Prose {'word ' * 30}\n\n```{{code-cell}} ipython3\n{short}\n{wide}\n```\n"
    assert long_lines(text) == [(5, len(wide), wide)]
    assert long_lines(text.replace(wide, short)) == []
    chinese = 'z = "' + "很" * 37 + '"'  # 43 characters, 80 columns
    assert long_lines(text.replace(wide, chinese)) == []
    assert long_lines(text.replace(wide, chinese + "很")) == [(5, 82, chinese + "很")]
