"""What a model sees of a store: the system-prompt block, and sanitised echoes of entries."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from memd.core.format import serialise_entries, total_chars, usage_text
from memd.core.scan import scan

RULE = "═" * 46
HEADERS = {
    "memory": "MEMORY (your personal notes)",
    "user": "USER PROFILE (who the user is)",
}
FILENAMES = {"memory": "MEMORY.md", "user": "USER.md"}
PREVIEW_WIDTH = 80


def blocked_placeholder(filename: str, finding_ids: Sequence[str]) -> str:
    return (
        f"[BLOCKED: {filename} entry contained threat pattern(s): {', '.join(finding_ids)}. "
        "Removed from system prompt; use memory(action=remove) to delete the original.]"
    )


# Scanning is the costly part of rendering and entries rarely change: every new session and
# every refresh after a write would otherwise rescan the whole store.
@functools.lru_cache(maxsize=4096)
def sanitise_entry(entry: str, filename: str) -> str:
    """The entry, or a placeholder when the scanner finds an injection in it.

    An entry that already looks like a placeholder is scanned like any other, so a planted
    "[BLOCKED: ..." prefix cannot smuggle text past the scanner.
    """
    findings = scan(entry)
    if not findings:
        return entry
    return blocked_placeholder(filename, [finding.id for finding in findings])


def sanitise_entries(entries: Sequence[str], target: str) -> list[str]:
    filename = FILENAMES[target]
    return [sanitise_entry(entry, filename) for entry in entries]


def previews(entries: Sequence[str], target: str) -> list[str]:
    """One-line, sanitised, 80-character previews, for telling matches apart."""
    shown = []
    for entry in sanitise_entries(entries, target):
        flat = " ".join(entry.split())
        shown.append(flat if len(flat) <= PREVIEW_WIDTH else flat[:PREVIEW_WIDTH] + "...")
    return shown


def snapshot_cap(limit: int) -> int:
    """Largest body a block may carry: only external edits can make a store this large."""
    return max(2 * limit, 4000)


def cut_marker(cut: int, target: str, current: int, limit: int) -> str:
    return (
        f"\n[... {cut:,} characters cut here: {FILENAMES[target]} holds {current:,} characters, "
        f"far over its limit of {limit:,}. Consolidate it now with one memory batch that merges "
        "or removes entries.]\n"
    )


def render_block(target: str, entries: Sequence[str], limit: int) -> str | None:
    """The system-prompt block for one store, or None when it has no entries.

    Entries the scanner flags are replaced by a placeholder; the usage in the header is that of
    the real entries, so the model is not misled about how full the store is.
    """
    if not entries:
        return None
    current = total_chars(entries)
    header = f"{HEADERS[target]} [{usage_text(current, limit)}]"
    if current > limit:
        header += " ⚠ OVER BUDGET"
    body = serialise_entries(sanitise_entries(entries, target))
    cap = snapshot_cap(limit)
    if len(body) > cap:
        head, tail = body[: cap * 7 // 10], body[len(body) - cap * 2 // 10:]
        body = head + cut_marker(len(body) - len(head) - len(tail), target, current, limit) + tail
    return f"{RULE}\n{header}\n{RULE}\n{body}"
