"""What the journal means: records, provenance, the state at a time, and inverse operations.

A record is written for every change to a store and carries the entries after it, so any past
state can be read back without replaying, and a record cut from the journal's start by rotation
costs nothing but its own history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from memd.core.store import Step


class StepRecord(msgspec.Struct, omit_defaults=True):
    action: str
    old: str | None = None
    new: str | None = None


class Record(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of the journal.

    `action` is add, replace, remove, batch, undo or restore for a session's write; `external`
    for a change made outside memd that it adopted; `baseline` for the state found when the
    journal began; `drift_detected`, `drift_resolved` or `unreadable` for those events.
    """

    seq: int
    time: float
    profile: str | None = None
    target: str
    session: str | None = None
    action: str
    steps: list[StepRecord] = []
    usage: str = ""
    after: list[str] = []
    backup: str | None = None
    reason: str | None = None
    undo_of: int | None = None


def steps_between(before: Sequence[str], after: Sequence[str]) -> tuple[Step, ...]:
    """The removes and adds that turn `before` into `after`, for a change seen only as a result."""
    kept = set(after)
    known = set(before)
    removed = [Step("remove", old=entry) for entry in before if entry not in kept]
    added = [Step("add", new=entry) for entry in after if entry not in known]
    return (*removed, *added)


def provenance(records: Iterable[Record], target: str, live: Sequence[str]) -> list[dict[str, Any]]:
    """For each live entry: the record from which it has been present, as it is, ever since
    (its seq, time, session and action).

    An entry older than the journal is credited to the oldest record that holds it (the
    `baseline`, or after rotation the oldest record kept); one that no record holds yet (a
    change not journaled) has no seq.
    """
    origin: dict[str, Record] = {}
    for record in records:
        if record.target != target or not _carries_state(record):
            continue
        present = set(record.after)
        origin = {entry: source for entry, source in origin.items() if entry in present}
        for entry in record.after:
            origin.setdefault(entry, record)
    result = []
    for entry in live:
        source = origin.get(entry)
        result.append({
            "entry": entry,
            "seq": source.seq if source else None,
            "time": source.time if source else None,
            "session": source.session if source else None,
            "action": source.action if source else None,
        })
    return result


def _carries_state(record: Record) -> bool:
    return record.action not in ("drift_resolved", "unreadable")


def state_at(records: Iterable[Record], target: str, at: float) -> list[str] | None:
    """The entries of `target` at time `at`, or None when the journal holds no record that old."""
    state: list[str] | None = None
    for record in records:
        if record.target != target or not _carries_state(record):
            continue
        if record.time > at:
            break
        state = list(record.after)
    return state


def inverse_operations(record: Record, current: Sequence[str]) -> list[dict[str, str]] | str:
    """The batch that undoes `record`, or why it cannot be undone safely now.

    Each step is reversed, last first, and only if the entry it touched is still as the record
    left it: otherwise a later change would be silently overwritten. A record without steps
    (drift, unreadable) has nothing to undo: callers refuse it before asking.
    """
    present = set(current)
    operations: list[dict[str, str]] = []
    for step in reversed(record.steps):
        if step.action == "add":
            if step.new not in present:
                return f"the entry it added has since been changed or removed: {_quote(step.new)}"
            operations.append({"action": "remove", "old_text": step.new or ""})
            present.discard(step.new or "")
        elif step.action == "remove":
            if step.old in present:
                return f"the entry it removed is present again: {_quote(step.old)}"
            operations.append({"action": "add", "content": step.old or ""})
            present.add(step.old or "")
        else:
            if step.new not in present:
                return f"the entry it wrote has since been changed or removed: {_quote(step.new)}"
            if step.old in present and step.old != step.new:
                return f"the entry it replaced is present again: {_quote(step.old)}"
            operations.append({"action": "replace", "old_text": step.new or "", "content": step.old or ""})
            present.discard(step.new or "")
            present.add(step.old or "")
    return operations


def restore_operations(current: Sequence[str], wanted: Sequence[str]) -> list[dict[str, str]]:
    """A batch that makes the store exactly `wanted`, in order: remove what differs, then re-add
    from the first entry out of place, so entries that stay put are not touched."""
    if list(current) == list(wanted):
        return []
    common = 0
    while common < min(len(current), len(wanted)) and current[common] == wanted[common]:
        common += 1
    removes = [{"action": "remove", "old_text": entry} for entry in current[common:]]
    adds = [{"action": "add", "content": entry} for entry in wanted[common:]]
    return removes + adds


def _quote(entry: str | None) -> str:
    text = " ".join((entry or "").split())
    return repr(text if len(text) <= 80 else text[:80] + "...")
