"""The animation player's words in Chinese: the titles and names of the buttons
matplotlib's ``to_jshtml`` writes, its loop modes' labels and the slider's name
(``_player.animation_html``). No import: the Chinese book build reads this table too
(``book/_ext/zh_edition.py``), for the outputs it takes from the English execution.
"""

from __future__ import annotations

import re

PLAYER_ZH = {
    "Decrease speed": "减速",
    "First frame": "第一帧",
    "Previous frame": "上一帧",
    "Play backwards": "倒放",
    "Pause": "暂停",
    "Play": "播放",
    "Next frame": "下一帧",
    "Last frame": "最后一帧",
    "Increase speed": "加速",
    "Repetition mode": "重复方式",
    "Animation frame": "动画帧",
    "Once": "播放一次",
    "Loop": "循环",
    "Reflect": "往返",
}
_ATTRIBUTE = re.compile(r'\b(title|aria-label)="([^"]*)"')
_LABEL = re.compile(r'(<label for="_anim_radio\d_\w+">)([^<]*)(</label>)')


def player_in_chinese(html: str) -> str:
    """``html`` with each player's titles, names and mode labels in Chinese (the
    English words of ``PLAYER_ZH``; any other text as it is)."""
    html = _ATTRIBUTE.sub(lambda m: f'{m[1]}="{PLAYER_ZH.get(m[2], m[2])}"', html)
    return _LABEL.sub(lambda m: m[1] + PLAYER_ZH.get(m[2].strip(), m[2]) + m[3], html)
