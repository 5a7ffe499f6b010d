"""Filesystem watch on the memory directories; it only says *which* store to look at.

Watch events arrive on watchdog's thread, but the engine belongs to the daemon's loop, so events
are queued and the loop is woken through a pipe it polls. Events can be lost (overflowing inotify
queues, network filesystems), which is why the daemon also rescans periodically.
"""

from __future__ import annotations

import os
import queue
from pathlib import Path

from watchdog.events import (
    EVENT_TYPE_CLOSED_NO_WRITE, EVENT_TYPE_OPENED, FileSystemEvent, FileSystemEventHandler,
)
from watchdog.observers import Observer

from memd.core.render import FILENAMES

STORE_NAMES = {name: target for target, name in FILENAMES.items()}
# Opening and reading a store changes nothing; reacting to it would make the daemon's own re-read
# trigger another re-read, for ever.
IGNORED_EVENTS = frozenset({EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE})


class _Handler(FileSystemEventHandler):
    def __init__(self, watch: StoreWatch, key: str | None) -> None:
        self.watch = watch
        self.key = key

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in IGNORED_EVENTS:
            return
        for path in (event.src_path, getattr(event, "dest_path", "")):
            name = os.path.basename(os.fsdecode(path)) if path else ""
            target = STORE_NAMES.get(name)
            if target is not None:
                self.watch.changed(self.key, target)


class StoreWatch:
    """Queues `(profile, target)` for every event touching a store file, and wakes the loop."""

    def __init__(self) -> None:
        self.observer = Observer()
        self.observer.daemon = True
        self.pending: queue.SimpleQueue[tuple[str | None, str]] = queue.SimpleQueue()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.watched: set[str | None] = set()

    def start(self) -> None:
        self.observer.start()

    def add(self, key: str | None, directory: Path) -> None:
        if key in self.watched:
            return
        self.observer.schedule(_Handler(self, key), str(directory), recursive=False)
        self.watched.add(key)

    def changed(self, key: str | None, target: str) -> None:
        self.pending.put((key, target))
        try:
            os.write(self.wake_write, b"!")
        except BlockingIOError:
            pass  # the pipe is full, so the loop is already due to wake

    def drain(self) -> set[tuple[str | None, str]]:
        """Everything that changed since the last drain, each store once."""
        try:
            while os.read(self.wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        changed = set()
        while True:
            try:
                changed.add(self.pending.get_nowait())
            except queue.Empty:
                return changed

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(timeout=5)
        os.close(self.wake_read)
        os.close(self.wake_write)
