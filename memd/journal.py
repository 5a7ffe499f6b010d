"""The journal: one JSON line per change to a home's stores, durable before a write is answered.

`<home>/memd/journal.jsonl`, owner-only. Appends happen under `journal.jsonl.lock`, so engines in
several processes (embedded mode) can share it; each reads what the others appended before
numbering its own records. A line cut short by a crash is cut off at start, or by the next
append when another engine goes on meanwhile. Records older than the window are dropped by
rewriting the file, never the window itself.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from memd.core.history import Record
from memd.disk import DurabilityError, StoreLock, fsync_directory, write_durably

log = logging.getLogger("memd.journal")
DAY = 86400.0
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class Journal:
    def __init__(self, path: Path, window_days: float = 30.0) -> None:
        self.path = path
        self.window = window_days * DAY
        # Only what appends need is kept in memory; queries stream the file.
        self.last_seq = 0
        self.last_after: dict[str, list[str]] = {}
        self.offset = 0  # bytes of the file already taken into account
        self._file: io.FileIO | None = None  # kept open: appends are on every write's critical path
        self.lock = StoreLock(path)
        if path.exists():
            with self.lock:
                self._take_in(self._open_current().st_size)

    def last_state(self, target: str) -> list[str] | None:
        """The entries the journal last recorded for `target`, or None if it never did."""
        return self.last_after.get(target)

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

    @property
    def fd(self) -> int:
        """The descriptor appends go through, for a caller that flushes it itself."""
        if self._file is None:
            raise RuntimeError("the journal has not been appended to yet")
        return self._file.fileno()

    def _open_current(self) -> os.stat_result:
        """Keep the descriptor on the file now at `path`: another engine on this home may have
        rotated it (a new file) since our last append. Call with the lock held."""
        if self._file is not None:
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            held = os.fstat(self._file.fileno())
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                return held
            self._close_file()
            self.offset = 0  # a new file: read it again from its start
        created = not self.path.exists()
        self._file = open(self.path, "ab", buffering=0, opener=_owner_only)  # noqa: SIM115 - kept open
        if created:
            fsync_directory(self.path.parent)
        return os.fstat(self._file.fileno())

    def append(self, drafts: Sequence[Record], *, durable: bool = True) -> list[Record]:
        """Number the drafts after the last record and append them; durably unless the caller
        will fsync `fd` itself before it acknowledges anything."""
        if not drafts:
            return []
        with self.lock:
            try:
                self._take_in(self._open_current().st_size)
            except OSError as error:
                raise DurabilityError(f"could not open the journal {self.path}: {error}") from error
            # A change seen from outside that another engine on this home already journaled
            # (embedded mode: several processes) is not recorded twice.
            fresh = [d for d in drafts if not (d.action == "external" and self.last_after.get(d.target) == d.after)]
            if not fresh:
                return []
            numbered = [msgspec.structs.replace(draft, seq=self.last_seq + index) for index, draft in enumerate(fresh, 1)]
            payload = b"".join(_encoder.encode(record) + b"\n" for record in numbered)
            try:
                written = 0
                while written < len(payload):
                    written += os.write(self.fd, payload[written:])
                if durable:
                    os.fsync(self.fd)
            except OSError as error:
                raise DurabilityError(f"could not durably append to the journal {self.path}: {error}") from error
            for record in numbered:
                self._note(record)
            self.offset += len(payload)
        return numbered

    def _take_in(self, size: int) -> None:
        """Read what other engines appended, up to `size` bytes. Call with the lock held.

        Appends are made under that lock, so whatever follows the last complete record is one
        its writer never finished (killed, or out of disk): it is cut, or our next record would
        be glued to it and be unreadable too.
        """
        if size > self.offset:
            self.catch_up()
        if size > self.offset:
            os.ftruncate(self.fd, self.offset)
            log.warning("journal %s: cut %d bytes of an incomplete last record", self.path, size - self.offset)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self._close_file()
        self.lock.close()

    def records(self) -> Iterator[Record]:
        """Every record, oldest first, read from the file."""
        for _, record in self._read_from(0):
            yield record

    def find(self, seq: int) -> Record | None:
        return next((record for record in self.records() if record.seq == seq), None)

    def rotate(self, now: float) -> int:
        """Drop records older than the window; returns how many were dropped.

        The latest record of each store is always kept, whatever its age, so the present state
        can still be read from the journal; so is the newest record, so no number is reused.
        """
        with self.lock:
            self.catch_up()
            records = list(self.records())
            horizon = now - self.window
            latest = {record.target: record.seq for record in records if record.action not in ("drift_resolved", "unreadable")}
            newest = records[-1].seq if records else 0  # kept too, so that no number is given twice
            kept = [r for r in records if r.time >= horizon or latest.get(r.target) == r.seq or r.seq == newest]
            dropped = len(records) - len(kept)
            if dropped:
                write_durably(self.path, "".join(_encoder.encode(record).decode("utf-8") + "\n" for record in kept))
                os.chmod(self.path, 0o600)
                self._close_file()  # appends go to the new file
                self.offset = self.path.stat().st_size
        return dropped
