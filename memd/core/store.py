"""The memory operations (add, replace, remove, batch, dry run) as pure functions.

`apply_call` takes the arguments of a `memory` tool call and the state of the store it targets,
and returns an `Outcome`: the reply, and the new file text when something is to be written.
Nothing here touches a file; `engine.py` does, under the store's lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memd.core import replies
from memd.core.format import (
    append_entry, has_delimiter_line, normalise_entry, parse_entries, serialise_entries, total_chars,
)
from memd.core.replies import Reply
from memd.core.scan import scan

TARGETS = ("memory", "user")
ACTIONS = ("add", "replace", "remove")
# Codes that mean the agent's consolidation attempt failed (SPEC §3, the failure counter).
CONSOLIDATION_FAILURES = frozenset({"over_budget", "no_match"})


@dataclass(frozen=True, slots=True)
class StoreView:
    """What the rules need to know of a store at the moment a call is applied."""

    target: str
    limit: int
    entries: tuple[str, ...]
    # The file's text as it stands; it differs from the serialised entries only when drifted.
    text: str = ""
    drift_backup: str | None = None
    drift_reason: str | None = None
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One applied change, kept for notifications and history."""

    action: str
    old: str | None = None
    new: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    reply: Reply
    # The new file text, or None when nothing is to be written.
    text: str | None = None
    entries: tuple[str, ...] | None = None
    steps: tuple[Step, ...] = ()
    counts_as_failure: bool = False


@dataclass(frozen=True, slots=True)
class Operation:
    action: str
    content: str | None
    old_text: str | None


@dataclass(frozen=True, slots=True)
class MemoryCall:
    """A validated tool call: either one operation or a batch of them."""

    target: str
    operations: tuple[Operation, ...]
    is_batch: bool
    dry_run: bool = False
    raw_operations: Sequence[Any] = field(default=())


def _text_field(args: Mapping[str, Any], *names: str) -> str | None | Reply:
    """The first of `names` that is present and not null; strings only."""
    for name in names:
        value = args.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return replies.invalid(f"'{name}' must be a string, not {type(value).__name__}.")
        return value
    return None


def parse_call(args: Any) -> MemoryCall | Reply:
    """Validate the shape of a tool call. Operations inside a batch are checked in `apply_call`,
    so that a bad one can be named by its position."""
    if not isinstance(args, Mapping):
        return replies.invalid("The memory call must be an object of named arguments.")
    target = args.get("target")
    if target is None:
        target = "memory"  # strict providers send null for omitted optional fields
    if target not in TARGETS:
        return replies.invalid(f"Invalid target {target!r}. Use 'memory' or 'user'.")
    dry_run = args.get("dry_run", False)
    if not isinstance(dry_run, bool):
        return replies.invalid("'dry_run' must be true or false.")
    operations = args.get("operations")
    if operations:
        if not isinstance(operations, list):
            return replies.invalid("'operations' must be a list of {action, content?, old_text?} objects.")
        return MemoryCall(target, (), True, dry_run, tuple(operations))
    operation = _parse_operation(args)
    if isinstance(operation, dict):
        return operation
    return MemoryCall(target, (operation,), False, dry_run)


def _parse_operation(raw: Any) -> Operation | Reply:
    if not isinstance(raw, Mapping):
        return replies.invalid("Each operation must be an object {action, content?, old_text?}.")
    action = raw.get("action")
    if action not in ACTIONS:
        shown = "missing" if action is None else repr(action)
        return replies.invalid(
            f"Unknown action ({shown}). Use 'add', 'replace' or 'remove', or send 'operations' for a batch."
        )
    # `new_text` is an alias some models use; `content` wins when both are given.
    content = _text_field(raw, "content", "new_text")
    if isinstance(content, dict):
        return content
    old_text = _text_field(raw, "old_text")
    if isinstance(old_text, dict):
        return old_text
    # Normalised as the file will read them back, so a duplicate or a match is seen as such.
    return Operation(
        action, normalise_entry(content) if content else None, normalise_entry(old_text) if old_text else None,
    )


def match_entry(entries: Sequence[str], old_text: str) -> int | list[int] | None:
    """Index of the entry `old_text` designates; a list of indices when several distinct entries
    contain it; None when none does. An exact entry wins over substring matches."""
    for index, entry in enumerate(entries):
        if entry == old_text:
            return index
    hits = [index for index, entry in enumerate(entries) if old_text in entry]
    if not hits:
        return None
    if len({entries[index] for index in hits}) > 1:
        return hits
    return hits[0]


def apply_call(call: MemoryCall, view: StoreView, *, allow_empty: bool = False) -> Outcome:
    """Apply a validated call to a store, all or nothing.

    `allow_empty` lets a batch empty the store: an undo or restore may return it to the empty
    state it once had, which the rule against consolidation wiping a store must not prevent.
    """
    if view.unreadable is not None:
        return Outcome(replies.unreadable(view.target, view.unreadable))
    if call.is_batch:
        return _apply_batch(call, view, allow_empty)
    operation = call.operations[0]
    if operation.action == "add":
        return _apply_add(operation, view, call.dry_run)
    if view.drift_backup is not None:
        return Outcome(replies.drift(view.target, view.drift_backup, view.drift_reason or "drift"))
    return _apply_edit(operation, view, call.dry_run)


def _blocked(content: str, position: int | None = None) -> Reply | None:
    findings = scan(content)
    if not findings:
        return None
    return replies.blocked([finding.category for finding in findings], position)


def _write(
    view: StoreView, entries: Sequence[str], reply: Reply, steps: tuple[Step, ...], dry_run: bool,
    text: str | None = None,
) -> Outcome:
    """The outcome of a valid change: written, or with dry_run only described."""
    if dry_run:
        reply["changes"] = [_describe(step, view.target) for step in steps]
        return Outcome(reply, steps=steps)
    entries = tuple(entries)
    return Outcome(reply, serialise_entries(entries) if text is None else text, entries, steps)


def _describe(step: Step, target: str) -> dict[str, str]:
    described = {"action": step.action}
    if step.old is not None:
        described["old"] = replies.sanitise_entries([step.old], target)[0]
    if step.new is not None:
        described["new"] = step.new
    return described


def _apply_add(operation: Operation, view: StoreView, dry_run: bool) -> Outcome:
    content = operation.content
    if not content:
        return Outcome(replies.empty_content("add"))
    if has_delimiter_line(content):
        return Outcome(replies.invalid(replies.delimiter_line("add")))
    refusal = _blocked(content)
    if refusal:
        return Outcome(refusal)
    if content in view.entries:
        return Outcome(replies.duplicate(view.target, view.entries, view.limit, dry_run=dry_run))
    entries = (*view.entries, content)
    new_total = total_chars(entries)
    text = None
    if view.drift_backup is not None:
        # A drifted file is appended to as it stands, so nothing written outside the tool is lost.
        text = append_entry(view.text, content)
        entries = tuple(parse_entries(text))
        # Text pasted from outside (an "entry" longer than the whole limit) is kept and backed up,
        # but not charged to the budget until someone cleans it up; otherwise no agent could
        # save anything until a person came by.
        new_total = total_chars([entry for entry in entries if len(entry) <= view.limit])
    if new_total > view.limit:
        return Outcome(
            replies.over_budget(view.target, view.entries, view.limit, new_total, entry_size=len(content)),
            counts_as_failure=True,
        )
    reply = replies.success(view.target, entries, view.limit, "Entry added.", dry_run=dry_run)
    return _write(view, entries, reply, (Step("add", new=content),), dry_run, text)


def _apply_edit(operation: Operation, view: StoreView, dry_run: bool) -> Outcome:
    """A single replace or remove."""
    action, old_text = operation.action, operation.old_text
    if not old_text:
        return Outcome(replies.missing_old_text(action, view.target, view.entries, view.limit))
    if action == "replace":
        if not operation.content:
            return Outcome(replies.empty_content("replace"))
        if has_delimiter_line(operation.content):
            return Outcome(replies.invalid(replies.delimiter_line("replace")))
        refusal = _blocked(operation.content)
        if refusal:
            return Outcome(refusal)
    found = match_entry(view.entries, old_text)
    if found is None:
        return Outcome(replies.no_match(view.target, view.entries, view.limit, old_text), counts_as_failure=True)
    if isinstance(found, list):
        return Outcome(replies.ambiguous(view.target, [view.entries[i] for i in found], old_text))
    old = view.entries[found]
    entries = list(view.entries)
    echoed = replies.sanitise_entries([old], view.target)[0]
    if action == "remove":
        del entries[found]
        reply = replies.success(view.target, entries, view.limit, "Entry removed.", dry_run=dry_run, removed_entry=echoed)
        return _write(view, entries, reply, (Step("remove", old=old),), dry_run)
    new = operation.content or ""
    if new in entries and new != old:
        del entries[found]  # replacing with an existing entry merges the two
    else:
        entries[found] = new
    new_total = total_chars(entries)
    if new_total > view.limit and new_total > total_chars(view.entries):
        return Outcome(
            replies.over_budget(view.target, view.entries, view.limit, new_total, entry_size=None),
            counts_as_failure=True,
        )
    reply = replies.success(view.target, entries, view.limit, "Entry replaced.", dry_run=dry_run, replaced_entry=echoed)
    return _write(view, entries, reply, (Step("replace", old=old, new=new),), dry_run)


def _batch_failure(reply: Reply) -> Outcome:
    return Outcome(reply, counts_as_failure=True)


def _apply_batch(call: MemoryCall, view: StoreView, allow_empty: bool) -> Outcome:
    if view.drift_backup is not None:
        return Outcome(replies.drift(view.target, view.drift_backup, view.drift_reason or "drift"))
    operations: list[Operation] = []
    for position, raw in enumerate(call.raw_operations, start=1):
        parsed = _parse_operation(raw)
        if isinstance(parsed, dict):
            return _batch_failure(replies.invalid(replies.batch_aborted(position, parsed["error"])))
        problem = _missing_field(parsed)
        if problem:
            return _batch_failure(replies.invalid(replies.batch_aborted(position, problem)))
        operations.append(parsed)
    # Every content is scanned before anything is applied: one poisoned operation sinks the batch.
    for position, operation in enumerate(operations, start=1):
        refusal = _blocked(operation.content, position) if operation.content else None
        if refusal:
            return _batch_failure(refusal)
    entries = list(view.entries)
    steps: list[Step] = []
    skipped = 0
    for position, operation in enumerate(operations, start=1):
        if operation.action == "add":
            if operation.content in entries:
                skipped += 1
                continue
            entries.append(operation.content or "")
            steps.append(Step("add", new=operation.content))
            continue
        found = match_entry(entries, operation.old_text or "")
        if found is None:
            return _batch_failure(replies.no_match(view.target, entries, view.limit, operation.old_text or "", position))
        if isinstance(found, list):
            return _batch_failure(replies.ambiguous(view.target, [entries[i] for i in found], operation.old_text or "", position))
        old = entries[found]
        if operation.action == "remove":
            del entries[found]
            steps.append(Step("remove", old=old))
        else:
            new = operation.content or ""
            if new in entries and new != old:
                del entries[found]
            else:
                entries[found] = new
            steps.append(Step("replace", old=old, new=new))
    if view.entries and not entries and not allow_empty:
        return _batch_failure(replies.would_empty(view.target, view.entries, view.limit))
    new_total = total_chars(entries)
    if new_total > view.limit and new_total > total_chars(view.entries):
        return _batch_failure(replies.over_budget(view.target, view.entries, view.limit, new_total, entry_size=None))
    message = f"Batch applied: {len(steps)} change(s)"
    message += f", {skipped} duplicate add(s) skipped." if skipped else "."
    reply = replies.success(view.target, entries, view.limit, message, dry_run=call.dry_run, applied=len(steps), skipped=skipped)
    if not steps:
        return Outcome(reply)
    return _write(view, entries, reply, tuple(steps), call.dry_run)


def _missing_field(operation: Operation) -> str | None:
    if operation.action in ("add", "replace") and not operation.content:
        return f"'{operation.action}' needs a non-empty content."
    if operation.content and has_delimiter_line(operation.content):
        return replies.delimiter_line(operation.action)
    if operation.action in ("replace", "remove") and not operation.old_text:
        return f"'{operation.action}' needs old_text (a piece of text that occurs in one entry)."
    return None


def count_failure(failures: int, outcome: Outcome, dry_run: bool) -> tuple[int, Reply]:
    """The session's failure count after `outcome`, and the reply to send for it.

    Failed consolidations count; a success starts the count again; from the fourth failure in a
    turn the reply becomes terminal, so memory upkeep never keeps the model from answering.
    A dry run only asks, so it neither counts nor resets.
    """
    if dry_run:
        return failures, outcome.reply
    if outcome.counts_as_failure:
        failures += 1
        if failures > replies.MAX_FAILURES_PER_TURN:
            return failures, replies.consolidation_exhausted(failures)
        return failures, outcome.reply
    if outcome.reply["success"]:
        return 0, outcome.reply
    return failures, outcome.reply
