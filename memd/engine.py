"""One memory home: its two stores, the files behind them, and the sessions reading them.

The engine is memd's embedded mode (an agent can use it in-process) and the heart the daemon
drives. Every write re-reads its store under the lock shared with Hermes, so writes from other
processes are never lost, and several calls can be committed with one durable write per store.
It is not thread-safe: one thread owns it (the daemon's loop, or the embedding program).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

import msgspec

from memd.config import Settings, load_settings, state_dir
from memd.core import replies
from memd.core.format import drift_reason, parse_entries, total_chars, usage_text
from memd.core.history import Record, StepRecord, inverse_operations, provenance, restore_operations, state_at, steps_between
from memd.core.learned import shipped_model
from memd.core.render import FILENAMES, render_block
from memd.core.store import (
    TARGETS, MemoryCall, Outcome, Step, StoreView, apply_call, count_failure, parse_call,
)
from memd.disk import (
    Displaced, DurabilityError, PreparedWrite, descriptor_limit, digest_of, fsync_together, latest_backup,
    prepare_write, read_if_changed, remove_temp_files, StoreLock, write_backup,
)
from memd.journal import Journal

log = logging.getLogger("memd.engine")
# Times a group is applied again because a program that ignores the lock changed a store while it
# was being rewritten; after that the write goes ahead (the file is being rewritten non-stop).
MAX_WRITE_ATTEMPTS = 5
# How long a displaced version of a store is kept open for a program that opened the store before a
# swap and writes into it after (a shell's `>>`, a buffered write that waits for its close), and how
# many are kept at most, so that a burst of writes cannot use up the process's descriptors. A count
# alone fails under load: eight lasted some ten milliseconds at hundreds of writes a second, sixty-four
# about a tenth of a second, and each time an append in CI came after its version's last look
# (drift.py lost one). One second failed too, on a machine loaded far past its cores (the suite beside
# two trainings on two cores: drift.py lost a `>>` whose process waited over a second between opening
# the old file and writing to it, 1 run in 3); three seconds lost nothing in 4 runs under that load.
# At a few hundred writes a second and more, the count decides first.
DISPLACED_SECONDS = 3.0
DISPLACED_KEPT = 1024
# ... and never more than this share of the descriptors the process may open (`memd serve` raises its
# limit first; an engine embedded in a process kept at 1,024 keeps 128).
DISPLACED_SHARE_OF_DESCRIPTORS = 8
# The newest this many are looked at on every change seen; the older ones at their last look, when
# they are let go: looking at a thousand on every event would slow a burst of writes.
DISPLACED_WATCHED = 64


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a store: what notifications and history are made of.

    kind is `store_changed` (by a session, or by someone else when session is None),
    `drift_detected`, `drift_resolved` or `unreadable`.
    """

    kind: str
    target: str
    usage: str
    session: str | None = None
    backup: str | None = None
    reason: str | None = None
    steps: tuple[Step, ...] = ()
    time: float = 0.0
    # For the journal: what kind of write (add, batch, undo, external...), and the entries after.
    action: str | None = None
    after: tuple[str, ...] = ()
    undo_of: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The two rendered blocks a session puts in its system prompt; None for an empty store."""

    memory: str | None
    user: str | None


@dataclass(slots=True)
class Drift:
    backup: str
    reason: str
    since: float


@dataclass(slots=True)
class StoreState:
    """What the engine knows of one store file."""

    target: str
    path: Path
    limit: int
    entries: tuple[str, ...] = ()
    text: str = ""
    # Digest of the bytes on disk when last read or written: how our own writes are recognised.
    digest: str | None = None
    drift: Drift | None = None
    unreadable: str | None = None
    last_backup: str | None = None
    rendered: tuple[str | None, str | None] = (None, None)  # (digest, block) cache
    lock: StoreLock = field(init=False)

    def __post_init__(self) -> None:
        self.lock = StoreLock(self.path)

    def view(self) -> StoreView:
        return StoreView(
            self.target, self.limit, self.entries, self.text,
            self.drift.backup if self.drift else None, self.drift.reason if self.drift else None,
            self.unreadable,
        )

    @property
    def usage(self) -> str:
        return usage_text(total_chars(self.entries), self.limit)


class Session:
    """One agent's view: a snapshot frozen when it opened, and its own failure counter."""

    def __init__(self, engine: Engine, name: str, now: float) -> None:
        self.engine = engine
        self.name = name
        self.id = secrets.token_hex(8)
        self.snapshot = engine.render_snapshot()
        self.failures = 0
        self.turn = 1
        self.opened_at = now
        self.last_used = now
        self.closed = False

    def memory(self, args: Mapping[str, Any] | None = None, /, **kwargs: Any) -> dict[str, Any]:
        """Apply a `memory` tool call, given as a mapping or as keyword arguments."""
        return self.engine.execute(self, {**(args or {}), **kwargs})

    def new_turn(self) -> None:
        self.failures = 0
        self.turn += 1

    def refresh(self) -> Snapshot:
        self.snapshot = self.engine.render_snapshot()
        return self.snapshot

    def close(self) -> None:
        self.engine.close_session(self)


Listener = Callable[[Sequence[Event]], None]


@dataclass(frozen=True, slots=True)
class Origin:
    """Why a call is made, when it is not a model's tool call: undo and restore."""

    action: str
    undo_of: int | None = None


@dataclass
class Counters:
    operations: int = 0
    writes: int = 0
    started: float = field(default_factory=time.time)


class Engine:
    def __init__(
        self, home: Path, settings: Settings | None = None, *, listener: Listener | None = None,
        clock: Callable[[], float] = time.time, profile: str | None = None,
    ) -> None:
        self.home = Path(home)
        self.settings = settings or load_settings(self.home)
        self.clock = clock
        self.profile = profile
        self.listeners: list[Listener] = [listener] if listener else []
        shipped_model()  # the scanner's learned model, read now so that no write waits for it
        self.sessions: dict[str, Session] = {}
        self.counters = Counters(started=clock())
        self.memory_dir = self.settings.memory_dir
        self.memory_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.stores = {
            target: StoreState(target, self.memory_dir / FILENAMES[target], self.settings.limits[target])
            for target in TARGETS
        }
        self.displaced: deque[tuple[StoreState, Displaced]] = deque()  # oldest first; see _look_at
        self.displaced_most = min(
            DISPLACED_KEPT, max(8, descriptor_limit() // DISPLACED_SHARE_OF_DESCRIPTORS))
        self.journal = Journal(state_dir(self.home) / "journal.jsonl", self.settings.journal_days)
        self.journal.rotate(clock())
        for state in self.stores.values():
            newest = latest_backup(state.path)
            state.last_backup = str(newest) if newest else None
            with state.lock:
                removed = remove_temp_files(state.path)
                if removed:
                    log.info("removed %d temp file(s) left beside %s by a write that was cut short", removed, state.path)
                events = self._sync(state)
                events.extend(self._baseline(state))
                self._record(events)
            self._emit(events)

    # -- reading ---------------------------------------------------------------------------

    def entries(self, target: str) -> list[str]:
        """The live entries of a store, raw (unsanitised), as a person editing them would see."""
        return list(self.stores[target].entries)

    def render_snapshot(self) -> Snapshot:
        return Snapshot(self._render(self.stores["memory"]), self._render(self.stores["user"]))

    def _render(self, state: StoreState) -> str | None:
        if state.unreadable is not None:
            return None
        if state.rendered[0] != state.digest:  # scanning every entry is the costly part: cache it
            state.rendered = (state.digest, render_block(state.target, state.entries, state.limit))
        return state.rendered[1]

    # -- sessions --------------------------------------------------------------------------

    def open_session(self, name: str) -> Session:
        session = Session(self, name, self.clock())
        self.sessions[session.id] = session
        return session

    def close_session(self, session: Session) -> None:
        session.closed = True
        self.sessions.pop(session.id, None)

    def expire_sessions(self) -> int:
        """Close sessions idle longer than the configured time; returns how many were closed."""
        deadline = self.clock() - self.settings.session_idle_seconds
        idle = [session for session in self.sessions.values() if session.last_used < deadline]
        for session in idle:
            self.close_session(session)
        return len(idle)

    # -- writing ---------------------------------------------------------------------------

    def execute(self, session: Session, args: Mapping[str, Any]) -> dict[str, Any]:
        result = self.execute_many([(session, args)])[0]
        self.retire_displaced()
        return result

    def execute_many(
        self, calls: Sequence[tuple[Session, Any]], origins: Sequence[Origin | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Apply calls in order, each against the state its predecessors left, then write each
        touched store once, durably, and journal every change. Replies are returned only after
        the data and its journal records are on disk. Call `retire_displaced` after replying."""
        now = self.clock()
        parsed: list[tuple[Session, MemoryCall | dict[str, Any], Origin | None]] = []
        for index, (session, args) in enumerate(calls):
            session.last_used = now
            parsed.append((session, parse_call(args), origins[index] if origins else None))
        targets = sorted({call.target for _, call, _ in parsed if isinstance(call, MemoryCall)})
        events: list[Event] = []
        with ExitStack() as locks:
            for target in targets:
                state = self.stores[target]
                locks.enter_context(state.lock)
                events.extend(self._sync(state))  # never rewrite what we have not seen
            for attempt in range(1, MAX_WRITE_ATTEMPTS + 1):
                failures = [session.failures for session, _, _ in parsed]
                results, changes, pending = self._apply(parsed, targets, now)
                writes = {
                    target: prepare_write(self.stores[target].path, outcome.text or "")
                    for target, outcome in pending.items()
                }
                # Shells and editors do not take the lock: a change made while the new text was
                # being made durable is taken in and the calls applied again, not overwritten.
                moved = [
                    target for target in writes
                    if read_if_changed(self.stores[target].path, self.stores[target].digest) is not None
                ]
                if not moved or attempt == MAX_WRITE_ATTEMPTS:
                    break
                for write in writes.values():
                    write.discard()
                for (session, _, _), count in zip(parsed, failures):
                    session.failures = count
                for target in moved:
                    log.info("%s changed while being rewritten; applying the calls again", self.stores[target].path)
                    events.extend(self._sync(self.stores[target]))
            events.extend(changes)
            self._commit(writes, pending, events, now)
        self.counters.operations += len(calls)
        self._emit(events)
        return results

    def _apply(
        self, parsed: Sequence[tuple[Session, MemoryCall | dict[str, Any], Origin | None]],
        targets: Sequence[str], now: float,
    ) -> tuple[list[dict[str, Any]], list[Event], dict[str, Outcome]]:
        """Replies, change events and the final outcome per store of `parsed`, applied in order
        to the stores as last read. Nothing is written."""
        results: list[dict[str, Any]] = []
        events: list[Event] = []
        views = {target: self.stores[target].view() for target in targets}
        pending: dict[str, Outcome] = {}
        for session, call, origin in parsed:
            if not isinstance(call, MemoryCall):
                results.append(call)
                continue
            if session.closed:
                results.append(replies.invalid("This session is closed; open a new one."))
                continue
            # Undo and restore may bring a store back to empty, as it once was.
            outcome = apply_call(call, views[call.target], allow_empty=origin is not None)
            session.failures, reply = count_failure(session.failures, outcome, call.dry_run)
            results.append(reply)
            if outcome.text is not None:
                views[call.target] = replace(
                    views[call.target], entries=outcome.entries or (), text=outcome.text,
                )
                pending[call.target] = outcome
                events.append(Event(
                    "store_changed", call.target, reply["usage"], session.name,
                    steps=outcome.steps, time=now, after=outcome.entries or (),
                    action=origin.action if origin else _action_of(call),
                    undo_of=origin.undo_of if origin else None,
                ))
        return results, events, pending

    def _commit(
        self, writes: Mapping[str, PreparedWrite], pending: Mapping[str, Outcome], events: list[Event], now: float,
    ) -> None:
        """Put the prepared files in place, journal `events` (and any drift they resolve), and
        return once both are durable.

        The journal is written after the swap, so it never records a change a crash kept off
        disk; the directory and the journal are then flushed together, sharing one wait.
        """
        swapped_out = []
        for target, write in writes.items():
            state = self.stores[target]
            displaced = write.swap_in(state.digest or digest_of(b""))
            if displaced is not None:
                swapped_out.append((state, displaced))
            outcome = pending[target]
            self.counters.writes += 1
            state.digest = digest_of(write.raw)
            state.text = outcome.text or ""
            state.entries = outcome.entries or ()
            if state.drift and drift_reason(state.text, state.limit) is None:
                state.drift = None
                events.append(Event("drift_resolved", target, state.usage, time=now, action="drift_resolved"))
        self.journal.append(self._drafts(events), durable=not writes)
        if writes:
            try:
                fsync_together(self.memory_dir, self.journal.fd)
            except OSError as error:
                raise DurabilityError(f"could not durably write {self.memory_dir}: {error}") from error
        for state, displaced in swapped_out:  # an editor's save in the instant before the swap
            self._look_at(state, displaced)
        self.displaced.extend(swapped_out)

    # -- changes from outside --------------------------------------------------------------

    def retire_displaced(self) -> None:
        """Stop watching displaced versions older than DISPLACED_SECONDS, or beyond the newest
        `displaced_most`, after one last look that reads each whole.

        Letting go of one frees its blocks, which takes longer than most of a write (70 µs on
        ext4), so the daemon does it after replying rather than before. (The oldest come first:
        this runs after every request, and reads no further than the first it keeps.)
        """
        now = time.monotonic()
        while self.displaced and (
                now - self.displaced[0][1].since > DISPLACED_SECONDS or len(self.displaced) > self.displaced_most):
            state, displaced = self.displaced.popleft()
            self._look_at(state, displaced, last=True)
            displaced.close()

    def _look_at(self, state: StoreState, displaced: Displaced, last: bool = False) -> None:
        """Back up whatever a program that ignores the lock wrote into a version of a store that
        one of our writes swapped out: saved in the instant before the swap, or appended by a
        program that still had the old file open."""
        raw = displaced.look(last)
        if raw is not None:
            state.last_backup = str(write_backup(state.path, raw, self.clock()))
            log.warning(
                "%s was changed outside memd as memd rewrote it; that version is saved in %s",
                state.path, state.last_backup,
            )

    def check_external(self, targets: Iterable[str] = TARGETS) -> list[Event]:
        """Look at the files now (a watch event or the periodic rescan) and take in any change
        made outside this engine. Reading needs no lock: stores are replaced atomically."""
        for state, displaced in islice(reversed(self.displaced), DISPLACED_WATCHED):
            self._look_at(state, displaced)
        self.retire_displaced()
        events: list[Event] = []
        for target in targets:
            events.extend(self._sync(self.stores[target]))
        self._record(events)
        self._emit(events)
        return events

    def _sync(self, state: StoreState) -> list[Event]:
        """Bring `state` up to date with the file. Own writes are recognised by digest."""
        found = read_if_changed(state.path, state.digest)
        if found is None:
            return []
        now = self.clock()
        first_load = state.digest is None and not state.entries
        if not found.readable:
            if state.unreadable == found.error:
                return []
            state.unreadable = found.error
            state.digest = found.digest
            log.error("%s is unusable: %s; writes to it are refused", state.path, found.error)
            return [Event("unreadable", state.target, state.usage, reason=found.error, time=now, action="unreadable")]
        events: list[Event] = []
        was_unreadable = state.unreadable is not None
        state.unreadable = None
        text = found.text or ""
        if not text.strip() and state.text.strip() and not first_load:
            # The file was deleted or emptied (`: > MEMORY.md`, a crashed editor): keep what it
            # held, which nothing else has a copy of.
            state.last_backup = str(write_backup(state.path, state.text.encode("utf-8"), now))
            log.warning(
                "%s was %s; its last content is saved in %s",
                state.path, "emptied" if found.exists else "deleted", state.last_backup,
            )
        reason = drift_reason(text, state.limit)
        previous_drift = state.drift
        previous_entries = state.entries
        state.digest, state.text, state.entries = found.digest, text, tuple(parse_entries(text))
        if reason is not None:
            if previous_drift is None or not Path(previous_drift.backup).exists() or was_unreadable:
                backup = str(write_backup(state.path, found.raw, now))
                state.last_backup = backup
                state.drift = Drift(backup, reason, now)
                log.warning("%s drifted (%s); backed up to %s", state.path, reason, backup)
                events.append(Event(
                    "drift_detected", state.target, state.usage, backup=backup, reason=reason, time=now,
                    action="drift_detected", after=state.entries,
                ))
            else:
                # Still drifted after another outside edit: keep this version too.
                state.last_backup = str(write_backup(state.path, found.raw, now))
                state.drift = Drift(state.last_backup, reason, previous_drift.since)
            return events
        state.drift = None
        if previous_drift is not None:
            log.info("%s is clean again; drift resolved", state.path)
            events.append(Event("drift_resolved", state.target, state.usage, time=now, action="drift_resolved"))
        if not first_load:
            events.append(Event(
                "store_changed", state.target, state.usage, None, time=now, action="external",
                steps=steps_between(previous_entries, state.entries), after=state.entries,
            ))
        if total_chars(state.entries) > state.limit:
            log.warning("%s is over budget: %s", state.path, state.usage)
        return events

    def _baseline(self, state: StoreState) -> list[Event]:
        """Record the state found at start when the journal does not already end with it: the
        first start, or changes made while no memd was running."""
        known = self.journal.last_state(state.target)
        if known == list(state.entries) or (known is None and not state.entries):
            return []
        return [Event(
            "store_changed", state.target, state.usage, None, time=self.clock(),
            action="baseline" if known is None else "external",
            steps=steps_between(known or (), state.entries), after=state.entries,
        )]

    def _record(self, events: Sequence[Event]) -> None:
        """Journal events durably."""
        self.journal.append(self._drafts(events))

    def _drafts(self, events: Sequence[Event]) -> list[Record]:
        """Journal records of `events`, to be numbered by the journal."""
        return [
            Record(
                seq=0, time=event.time, profile=self.profile, target=event.target, session=event.session,
                action=event.action or event.kind, usage=event.usage, after=list(event.after),
                steps=[StepRecord(step.action, step.old, step.new) for step in event.steps],
                backup=event.backup, reason=event.reason, undo_of=event.undo_of,
            )
            for event in events
        ]

    def _emit(self, events: Sequence[Event]) -> None:
        if events:
            for listener in self.listeners:
                listener(events)

    # -- history ---------------------------------------------------------------------------

    def history(
        self, target: str | None = None, *, since: float | None = None, session: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Journal records, oldest first; with `limit`, the newest `limit` of those that match."""
        matching = [
            msgspec.structs.asdict(record) for record in self.journal.records()
            if (target is None or record.target == target)
            and (since is None or record.time >= since)
            and (session is None or record.session == session)
        ]
        for record in matching:
            record["steps"] = [msgspec.structs.asdict(step) for step in record["steps"]]
        return matching[-limit:] if limit else matching

    def provenance(self, target: str) -> list[dict[str, Any]]:
        """For each live entry of `target`: when it was written, by which session, in which record."""
        return provenance(self.journal.records(), target, self.stores[target].entries)

    def undo(self, seq: int, *, name: str = "undo", dry_run: bool = False) -> dict[str, Any]:
        """Apply the inverse of journal record `seq` as a new, validated, journaled batch."""
        record = self.journal.find(seq)
        if record is None:
            reply = replies.invalid(f"There is no change {seq} in the journal of {self.home}; see `memd log`.")
        elif record.target not in self.stores:
            reply = replies.invalid(f"Change {seq} is not about a memory store.")
        else:
            reply = self._undo(record, name, dry_run)
            reply.setdefault("target", record.target)  # refusals too: say which store it was about
        reply["undo_of"] = seq
        return reply

    def _undo(self, record: Record, name: str, dry_run: bool) -> dict[str, Any]:
        if not record.steps:
            return replies.invalid(
                f"Change {record.seq} ({record.action}) changed no entries, so there is nothing to undo."
            )
        self.check_external([record.target])
        current = self.stores[record.target].entries
        operations = inverse_operations(record, current)
        if isinstance(operations, str):
            return replies.undo_conflict(record.seq, operations)
        before = self._state_before(record)
        if before is not None and list(current) == record.after:
            # Nothing changed since: go back to the exact previous list, order included.
            operations = restore_operations(current, before)
        reply = self._apply_origin(record.target, operations, Origin("undo", record.seq), name, dry_run)
        if reply["success"]:
            done = "would be undone" if dry_run else "undone"
            reply["message"] = f"Change {record.seq} {done} ({len(operations)} operation(s))."
        return reply

    def _state_before(self, record: Record) -> list[str] | None:
        """The entries of the record's store just before it, if the journal knows them."""
        before: list[str] | None = None
        for earlier in self.journal.records():
            if earlier.seq >= record.seq:
                break
            if earlier.target == record.target and earlier.action not in ("drift_resolved", "unreadable"):
                before = list(earlier.after)
        if before is None and record.action in ("add", "batch") and all(step.action == "add" for step in record.steps):
            return [entry for entry in record.after if entry not in {step.new for step in record.steps}]
        return before

    def restore(self, target: str, at: float, *, name: str = "restore", dry_run: bool = False) -> dict[str, Any]:
        """Bring `target` back to its state at time `at`, as one validated, journaled batch."""
        if target not in self.stores:
            return replies.invalid(f"Invalid target {target!r}. Use 'memory' or 'user'.")
        wanted = state_at(self.journal.records(), target, at)
        if wanted is None:
            return replies.invalid(
                f"The journal holds no state of {FILENAMES[target]} at or before that time; "
                "`memd log` shows how far back it goes."
            )
        self.check_external([target])
        state = self.stores[target]
        operations = restore_operations(state.entries, wanted)
        if not operations:
            reply = replies.success(target, state.entries, state.limit, "The store already holds exactly that state.", dry_run=dry_run)
            reply["note"] = "Nothing was written."
            return reply
        reply = self._apply_origin(target, operations, Origin("restore"), name, dry_run)
        if reply["success"]:
            done = "would be restored" if dry_run else "restored"
            reply["message"] = f"{FILENAMES[target]} {done} to its state at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))}."
        return reply

    def _apply_origin(
        self, target: str, operations: list[dict[str, str]], origin: Origin, name: str, dry_run: bool,
    ) -> dict[str, Any]:
        # A session of its own, never registered: undo and restore are no agent's turn.
        session = Session(self, name, self.clock())
        args = {"target": target, "operations": operations, "dry_run": dry_run}
        return self.execute_many([(session, args)], [origin])[0]

    def close(self) -> None:
        """Let go of the files the engine keeps open. Sessions stay readable; writes reopen."""
        for state, displaced in self.displaced:
            self._look_at(state, displaced, last=True)
            displaced.close()
        self.displaced.clear()
        for state in self.stores.values():
            state.lock.close()
        self.journal.close()

    # -- observability ---------------------------------------------------------------------

    def store_status(self, target: str) -> dict[str, Any]:
        state = self.stores[target]
        current = total_chars(state.entries)
        return {
            "target": target,
            "path": str(state.path),
            "usage": state.usage,
            "chars": current,
            "limit": state.limit,
            "entry_count": len(state.entries),
            "over_budget": current > state.limit,
            "drift": None if state.drift is None else {
                "backup": state.drift.backup, "reason": state.drift.reason, "since": state.drift.since,
            },
            "unreadable": state.unreadable,
            "last_backup": state.last_backup,
        }

    def status(self) -> dict[str, Any]:
        return {
            "home": str(self.home),
            "uptime": self.clock() - self.counters.started,
            "sessions": len(self.sessions),
            "operations": self.counters.operations,
            "writes": self.counters.writes,
            "stores": {target: self.store_status(target) for target in TARGETS},
        }


def _action_of(call: MemoryCall) -> str:
    return "batch" if call.is_batch else call.operations[0].action
