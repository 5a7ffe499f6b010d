"""The journal: one JSON line per change to a home's stores, durable before a write is answered.

`<home>/memd/journal.jsonl`, owner-only. Appends happen under `journal.jsonl.lock`, so engines in
several processes (embedded mode) can share it; each reads what the others appended before
numbering its own records. A line cut short by a crash is cut off at start. Records older than
the window are dropped by rewriting the file, never the window itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from memd.core.history import Record
from memd.disk import DurabilityError, fsync_directory, store_lock, write_durably

log = logging.getLogger("memd.journal")
DAY = 86400.0
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


class Journal:
    def __init__(self, path: Path, window_days: float = 30.0) -> None:
        self.path = path
        self.window = window_days * DAY
        # Only what appends need is kept in memory; queries stream the file.
        self.last_seq = 0
        self.last_after: dict[str, list[str]] = {}
        self.offset = 0  # bytes of the file already taken into account
        self._repair_tail()
        self.catch_up()

    def last_state(self, target: str) -> list[str] | None:
        """The entries the journal last recorded for `target`, or None if it never did."""
        return self.last_after.get(target)

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return store_lock(self.path)

    def _repair_tail(self) -> None:
        """Cut a record that a crash left half-written; everything before it is intact."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        with self._lock(), open(self.path, "r+b") as handle:
            cut = size
            while cut > 0:  # find the last newline, reading backwards in blocks
                start = max(0, cut - 65536)
                handle.seek(start)
                block = handle.read(cut - start)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    cut = start + newline + 1
                    break
                cut = start
            if cut == size:
                return
            handle.truncate(cut)
            handle.flush()
            os.fsync(handle.fileno())
        log.warning("journal %s: cut %d bytes of an incomplete last record (left by a crash)", self.path, size - cut)

    def _read_from(self, offset: int) -> Iterator[tuple[int, Record]]:
        """Complete records from byte `offset` on, each with the offset just past it."""
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            return
        with handle:
            handle.seek(offset)
            for line in handle:
                if not line.endswith(b"\n"):
                    return  # being appended right now; read it next time
                offset += len(line)
                if not line.strip():
                    continue
                try:
                    record = _decoder.decode(line)
                except msgspec.DecodeError:
                    log.error("journal %s: skipping an unreadable record ending at byte %d", self.path, offset)
                    continue
                yield offset, record

    def catch_up(self) -> None:
        """Take in records appended since the last look (by this or another process)."""
        for offset, record in self._read_from(self.offset):
            self._note(record)
            self.offset = offset

    def _note(self, record: Record) -> None:
        self.last_seq = max(self.last_seq, record.seq)
        if record.action not in ("drift_resolved", "unreadable"):
            self.last_after[record.target] = list(record.after)

    def append(self, drafts: Sequence[Record]) -> list[Record]:
        """Number the drafts after the last record and append them durably."""
        if not drafts:
            return []
        with self._lock():
            self.catch_up()
            # A change seen from outside that another engine on this home already journaled
            # (embedded mode: several processes) is not recorded twice.
            fresh = [d for d in drafts if not (d.action == "external" and self.last_after.get(d.target) == d.after)]
            if not fresh:
                return []
            numbered = [msgspec.structs.replace(draft, seq=self.last_seq + index) for index, draft in enumerate(fresh, 1)]
            payload = b"".join(_encoder.encode(record) + b"\n" for record in numbered)
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                written = 0
                while written < len(payload):
                    written += os.write(fd, payload[written:])
                os.fsync(fd)
            except OSError as error:
                raise DurabilityError(f"could not durably append to the journal {self.path}: {error}") from error
            finally:
                os.close(fd)
            if created:
                fsync_directory(self.path.parent)
            for record in numbered:
                self._note(record)
            self.offset += len(payload)
        return numbered

    def records(self) -> Iterator[Record]:
        """Every record, oldest first, read from the file."""
        for _, record in self._read_from(0):
            yield record

    def find(self, seq: int) -> Record | None:
        return next((record for record in self.records() if record.seq == seq), None)

    def rotate(self, now: float) -> int:
        """Drop records older than the window; returns how many were dropped.

        The latest record of each store is always kept, whatever its age, so the present state
        can still be read from the journal.
        """
        with self._lock():
            self.catch_up()
            records = list(self.records())
            horizon = now - self.window
            latest = {record.target: record.seq for record in records if record.action not in ("drift_resolved", "unreadable")}
            kept = [r for r in records if r.time >= horizon or latest.get(r.target) == r.seq]
            dropped = len(records) - len(kept)
            if dropped:
                write_durably(self.path, "".join(_encoder.encode(record).decode("utf-8") + "\n" for record in kept))
                os.chmod(self.path, 0o600)
                self.offset = self.path.stat().st_size
        return dropped
