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
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memd.config import Settings, load_settings
from memd.core import replies
from memd.core.format import drift_reason, parse_entries, total_chars, usage_text
from memd.core.render import FILENAMES, render_block
from memd.core.store import (
    TARGETS, MemoryCall, Outcome, Step, StoreView, apply_call, count_failure, parse_call,
)
from memd.disk import digest_of, latest_backup, read_store, store_lock, write_backup, write_durably

log = logging.getLogger("memd.engine")


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


@dataclass
class Counters:
    operations: int = 0
    writes: int = 0
    started: float = field(default_factory=time.time)


class Engine:
    def __init__(
        self, home: Path, settings: Settings | None = None, *, listener: Listener | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.home = Path(home)
        self.settings = settings or load_settings(self.home)
        self.clock = clock
        self.listeners: list[Listener] = [listener] if listener else []
        self.sessions: dict[str, Session] = {}
        self.counters = Counters(started=clock())
        self.memory_dir = self.settings.memory_dir
        self.memory_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.stores = {
            target: StoreState(target, self.memory_dir / FILENAMES[target], self.settings.limits[target])
            for target in TARGETS
        }
        for state in self.stores.values():
            newest = latest_backup(state.path)
            state.last_backup = str(newest) if newest else None
            with store_lock(state.path):
                self._emit(self._sync(state))

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
        return self.execute_many([(session, args)])[0]

    def execute_many(self, calls: Sequence[tuple[Session, Any]]) -> list[dict[str, Any]]:
        """Apply calls in order, each against the state its predecessors left, then write each
        touched store once, durably. Replies are returned only after the data is on disk."""
        now = self.clock()
        parsed: list[tuple[Session, MemoryCall | dict[str, Any]]] = []
        for session, args in calls:
            session.last_used = now
            parsed.append((session, parse_call(args)))
        targets = sorted({call.target for _, call in parsed if isinstance(call, MemoryCall)})
        events: list[Event] = []
        results: list[dict[str, Any]] = []
        with ExitStack() as locks:
            for target in targets:
                state = self.stores[target]
                locks.enter_context(store_lock(state.path))
                events.extend(self._sync(state))  # never rewrite what we have not seen
            views = {target: self.stores[target].view() for target in targets}
            pending: dict[str, Outcome] = {}
            for session, call in parsed:
                if not isinstance(call, MemoryCall):
                    results.append(call)
                    continue
                if session.closed:
                    results.append(replies.invalid("This session is closed; open a new one."))
                    continue
                outcome = apply_call(call, views[call.target])
                session.failures, reply = count_failure(session.failures, outcome, call.dry_run)
                results.append(reply)
                if outcome.text is not None:
                    views[call.target] = replace(
                        views[call.target], entries=outcome.entries or (), text=outcome.text,
                    )
                    pending[call.target] = outcome
                    events.append(Event(
                        "store_changed", call.target, reply["usage"], session.name,
                        steps=outcome.steps, time=now,
                    ))
            for target, outcome in pending.items():
                events.extend(self._commit(self.stores[target], outcome.text or "", now))
        self.counters.operations += len(calls)
        self._emit(events)
        return results

    def _commit(self, state: StoreState, text: str, now: float) -> list[Event]:
        raw = write_durably(state.path, text)
        self.counters.writes += 1
        state.digest = digest_of(raw)
        state.text = text
        state.entries = tuple(parse_entries(text))
        if state.drift and drift_reason(text, state.limit) is None:
            state.drift = None
            return [Event("drift_resolved", state.target, state.usage, time=now)]
        return []

    # -- changes from outside --------------------------------------------------------------

    def check_external(self, targets: Iterable[str] = TARGETS) -> list[Event]:
        """Look at the files now (a watch event or the periodic rescan) and take in any change
        made outside this engine. Reading needs no lock: stores are replaced atomically."""
        events: list[Event] = []
        for target in targets:
            events.extend(self._sync(self.stores[target]))
        self._emit(events)
        return events

    def _sync(self, state: StoreState) -> list[Event]:
        """Bring `state` up to date with the file. Own writes are recognised by digest."""
        found = read_store(state.path)
        if state.digest is not None and found.digest == state.digest and found.readable:
            return []
        now = self.clock()
        first_load = state.digest is None and not state.entries
        if not found.readable:
            if state.unreadable == found.error:
                return []
            state.unreadable = found.error
            state.digest = found.digest
            log.error("%s is unusable: %s; writes to it are refused", state.path, found.error)
            return [Event("unreadable", state.target, state.usage, reason=found.error, time=now)]
        events: list[Event] = []
        was_unreadable = state.unreadable is not None
        state.unreadable = None
        text = found.text or ""
        if not found.exists and state.text.strip() and not first_load:
            # The file was deleted: keep what it held, which nothing else has a copy of.
            state.last_backup = str(write_backup(state.path, state.text.encode("utf-8"), now))
            log.warning("%s was deleted; its last content is saved in %s", state.path, state.last_backup)
        reason = drift_reason(text, state.limit)
        previous_drift = state.drift
        state.digest, state.text, state.entries = found.digest, text, tuple(parse_entries(text))
        if reason is not None:
            if previous_drift is None or not Path(previous_drift.backup).exists() or was_unreadable:
                backup = str(write_backup(state.path, found.raw, now))
                state.last_backup = backup
                state.drift = Drift(backup, reason, now)
                log.warning("%s drifted (%s); backed up to %s", state.path, reason, backup)
                events.append(Event("drift_detected", state.target, state.usage, backup=backup, reason=reason, time=now))
            else:
                # Still drifted after another outside edit: keep this version too.
                state.last_backup = str(write_backup(state.path, found.raw, now))
                state.drift = Drift(state.last_backup, reason, previous_drift.since)
            return events
        state.drift = None
        if previous_drift is not None:
            log.info("%s is clean again; drift resolved", state.path)
            events.append(Event("drift_resolved", state.target, state.usage, time=now))
        if not first_load:
            events.append(Event("store_changed", state.target, state.usage, None, time=now))
        if total_chars(state.entries) > state.limit:
            log.warning("%s is over budget: %s", state.path, state.usage)
        return events

    def _emit(self, events: Sequence[Event]) -> None:
        if events:
            for listener in self.listeners:
                listener(events)

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
