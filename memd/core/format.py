"""The on-disk format of a store, shared with Hermes Agent: entries joined by a § line.

Everything here works on text that has already been decoded; `disk.py` does the decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

DELIMITER = "\n§\n"
BOM = "\ufeff"


def normalise_text(text: str) -> str:
    """Drop a leading BOM and turn CRLF into LF, the two differences an editor may introduce."""
    if text.startswith(BOM):
        text = text[len(BOM):]
    return text.replace("\r\n", "\n")


def _pieces(text: str) -> list[str]:
    """The stripped pieces between delimiters, empty ones included."""
    return [piece.strip() for piece in normalise_text(text).split(DELIMITER)]


def parse_entries(text: str) -> list[str]:
    """Entries of a store file: stripped, empty ones dropped, the first of exact duplicates kept."""
    return list(dict.fromkeys(piece for piece in _pieces(text) if piece))


def serialise_entries(entries: Sequence[str]) -> str:
    """The file text for `entries`: joined by the delimiter, no trailing delimiter."""
    return DELIMITER.join(entries)


def total_chars(entries: Sequence[str]) -> int:
    """What the budget counts: code points of the joined text, delimiters included."""
    return len(serialise_entries(entries))


def drift_reason(text: str, limit: int) -> str | None:
    """Why rewriting this file from its parsed entries would change what someone wrote, or None.

    Whitespace around entries and delimiter lines, a BOM and CRLF line ends are forgiven: a rewrite
    loses nothing of them. Empty entries (stray delimiters) and repeated entries are not, and an
    entry longer than the store's whole limit is free text added by hand, a shell `>>` or a patch
    tool, which a tool-written store can never hold.
    """
    pieces = _pieces(text)
    as_written = serialise_entries(pieces).strip()
    if as_written != serialise_entries(parse_entries(text)):
        return "it has empty or repeated entries that a rewrite would drop"
    longest = max((len(piece) for piece in pieces), default=0)
    if longest > limit:
        return (
            f"one entry is {longest:,} characters, longer than the store's whole limit of {limit:,} "
            "(text added outside the memory tool)"
        )
    return None


def percent_used(current: int, limit: int) -> int:
    """Whole percent of the budget used, capped at 100, computed as Hermes does so headers match."""
    return min(100, int((current / limit) * 100)) if limit > 0 else 0


def usage_text(current: int, limit: int) -> str:
    """`P% — X/Y chars`, with thousands separators: the figure every reply and header shows."""
    return f"{percent_used(current, limit)}% — {current:,}/{limit:,} chars"
