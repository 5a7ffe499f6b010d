"""The on-disk format of a store, shared with Hermes Agent: entries joined by a § line.

Everything here works on text that has already been decoded; `disk.py` does the decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

DELIMITER = "\n§\n"
BOM = "\ufeff"


def normalise_text(text: str) -> str:
    """Drop a leading BOM and turn CRLF into LF, the two differences an editor may introduce.

    A lone CR becomes LF too, as in Hermes's own reads (Python's universal newlines); doing so
    also makes normalising a second time change nothing.
    """
    if text.startswith(BOM):
        text = text[len(BOM):]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _is_edge(char: str) -> bool:
    return char.isspace() or char == BOM


def _trim(piece: str, *, stray_delimiter: bool = False) -> str:
    """`piece` without whitespace (or stray BOMs) at either end; with `stray_delimiter`, also
    without lines holding only '§' at either end.

    Such a line is never content, only a stray delimiter: rewritten next to a delimiter it would
    fuse with it and move text into the neighbouring entry. Index arithmetic keeps this linear.
    """
    start, end = 0, len(piece)
    while True:
        while start < end and _is_edge(piece[start]):
            start += 1
        while end > start and _is_edge(piece[end - 1]):
            end -= 1
        if not stray_delimiter:
            return piece[start:end]
        if end - start == 1 and piece[start] == "§":
            return ""
        if end - start >= 2 and piece.startswith("§\n", start):
            start += 2
        elif end - start >= 2 and piece[end - 2:end] == "\n§":
            end -= 2
        else:
            return piece[start:end]


def _pieces(text: str, *, stray_delimiter: bool = True) -> list[str]:
    """The trimmed pieces between delimiters, empty ones included."""
    return [_trim(piece, stray_delimiter=stray_delimiter) for piece in normalise_text(text).split(DELIMITER)]


def parse_entries(text: str) -> list[str]:
    """Entries of a store file: stripped, empty ones dropped, the first of exact duplicates kept."""
    return list(dict.fromkeys(piece for piece in _pieces(text) if piece))


def normalise_entry(text: str) -> str:
    """An entry as a caller wrote it, made the way it will read back from the file: newlines
    normalised, whitespace trimmed."""
    return _trim(normalise_text(text))


def has_delimiter_line(entry: str) -> bool:
    """Whether `entry` holds a line that is only '§': written, it would become several entries,
    or lose that line (parsed entries never hold one)."""
    return "§" in entry.split("\n")


def append_entry(text: str, entry: str) -> str:
    """The file text `text` with `entry` added as its own last entry, every character of `text`
    kept (a drifted file is added to this way). `entry` must be trimmed and hold no '§' line.

    A text ending in stray '§' lines would fuse them with the new delimiter; splitting is left
    to right, so one of the two joins below always leaves `entry` intact, and the check picks it.
    """
    kept = normalise_text(text)
    end = len(kept)
    while end and _is_edge(kept[end - 1]):
        end -= 1
    # Only the end is trimmed: a leading "\n§\n" is a delimiter, which trimming would turn into
    # a '§' line at the start of the first entry.
    kept = kept[:end]
    if not kept:
        return entry
    for joiner in (DELIMITER, "\n"):
        joined = kept + joiner + entry
        if joined.split(DELIMITER)[-1] == entry:
            return joined
    raise ValueError("entry holds a delimiter line")  # excluded by the caller's validation


def serialise_entries(entries: Sequence[str]) -> str:
    """The file text for `entries`: joined by the delimiter, no trailing delimiter."""
    return DELIMITER.join(entries)


def total_chars(entries: Sequence[str]) -> int:
    """What the budget counts: code points of the joined text, delimiters included."""
    return len(serialise_entries(entries))


def drift_reason(text: str, limit: int) -> str | None:
    """Why rewriting this file from its parsed entries would change what someone wrote, or None.

    Whitespace around entries and delimiter lines, a BOM and CRLF line ends are forgiven: a rewrite
    loses nothing of them. Stray delimiters (empty entries, a '§' line ending an entry) and repeated
    entries are not, and an entry longer than the store's whole limit is free text added by hand,
    a shell `>>` or a patch tool, which a tool-written store can never hold.
    """
    pieces = _pieces(text, stray_delimiter=False)
    as_written = serialise_entries(pieces).strip()
    if as_written != serialise_entries(parse_entries(text)):
        return "it has empty or repeated entries, or stray '§' lines, that a rewrite would drop"
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
