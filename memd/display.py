"""How the `memd` command shows things to a person: usage bars, durations, entries.

Entries are shown as the person would type them, except for characters that could disguise
them on a terminal (escape sequences, and in flagged entries invisible or direction-changing
characters), which are spelled out as <U+XXXX>.
"""

from __future__ import annotations

import math
import time
import unicodedata
from collections.abc import Sequence

DESCRIPTIONS = {"memory": "agent notes", "user": "user profile"}
BAR_WIDTH = 24
# Kept in entries as they are: line structure, and nothing else below U+0020.
LAYOUT_CONTROLS = frozenset("\n\t")


def usage_bar(chars: int, limit: int, width: int = BAR_WIDTH) -> str:
    """`[█████░░░…]`: how full a store is; full and flagged when over its limit."""
    # Rounded up, so that a store holding anything never shows an empty bar.
    filled = width if limit <= 0 else min(width, math.ceil(width * chars / limit))
    bar = "[" + "█" * filled + "░" * (width - filled) + "]"
    return bar + (" ⚠ OVER BUDGET" if chars > limit else "")


def duration(seconds: float) -> str:
    """`45s`, `12m 3s`, `3h 12m`, `2d 4h`: two units are enough to tell."""
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    for big, big_unit, small, small_unit in ((days, "d", hours, "h"), (hours, "h", minutes, "m"), (minutes, "m", secs, "s")):
        if big:
            return f"{big}{big_unit} {small}{small_unit}" if small else f"{big}{big_unit}"
    return f"{secs}s"


def age(unix_time: float, now: float | None = None) -> str:
    """How long ago, e.g. `3h 12m ago`."""
    return f"{duration((time.time() if now is None else now) - unix_time)} ago"


def backup_time(path: str) -> float | None:
    """The unix time in a backup's name (`MEMORY.md.bak.<time>`)."""
    suffix = path.rsplit(".", 1)[-1]
    return float(suffix) if suffix.isdigit() else None


def count(number: int, noun: str) -> str:
    """`1 entry`, `2 entries`, `0 entries`."""
    if number == 1:
        return f"1 {noun}"
    return f"{number:,} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def visible(text: str, *, reveal_invisible: bool = False) -> str:
    """`text` safe to print on a terminal: control characters (escape sequences could rewrite
    the screen) and, when asked, format characters (zero-width, bidirectional overrides, tags,
    which hide or reorder text) are shown as <U+XXXX>."""
    shown = []
    for char in text:
        category = unicodedata.category(char)
        if (category == "Cc" and char not in LAYOUT_CONTROLS) or (reveal_invisible and category == "Cf"):
            shown.append(f"<U+{ord(char):04X}>")
        else:
            shown.append(char)
    return "".join(shown)


def numbered(entries: Sequence[str], indent: str = "  ") -> list[str]:
    """Entries as numbered blocks; continuation lines line up under the first."""
    width = len(str(len(entries)))
    lines: list[str] = []
    for number, entry in enumerate(entries, start=1):
        first, *rest = visible(entry).split("\n")
        lines.append(f"{indent}{number:>{width}}. {first}")
        lines.extend(f"{indent}{' ' * (width + 2)}{line}" for line in rest)
    return lines


def indented(text: str, prefix: str) -> list[str]:
    """Every line of `text` behind `prefix` (a diff marker, an indent)."""
    return [f"{prefix}{line}" for line in visible(text).split("\n")]
