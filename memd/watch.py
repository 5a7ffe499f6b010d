"""Filesystem watch on the memory directories; it only says *which* store to look at.

The daemon's loop polls `wake_fd` with its socket and calls `drain()` when it is readable; what
changed is then read by the engine on the loop's own thread, so nothing races the writer.
Events can be lost (overflowing queues, network filesystems), which is why the daemon also
rescans periodically.

Two backends, one interface:

- On Linux, inotify read directly by the loop: no thread. Every write memd makes fires half a
  dozen events in the directory (temp file created, written, swapped in), and watchdog carries
  each through three threads of its own, which then compete with the writer for the GIL: with
  it, a durable write took twice as long (`scripts/bench.py`, 2.7 ms against 1.3 ms).
- Elsewhere (macOS, Windows, BSD), watchdog, whose thread queues events and wakes the loop
  through a pipe. `MEMD_WATCH=watchdog` selects it on Linux too.
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import struct
import sys
from pathlib import Path
from typing import Any, Protocol

from watchdog.events import (
    FileClosedEvent, FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent, FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from memd.core.render import FILENAMES

STORE_NAMES = {name: target for target, name in FILENAMES.items()}
Key = str | None  # the profile whose memory directory it is; None for the home itself
Changed = set[tuple[Key, str]]


class StoreWatch(Protocol):
    wake_fd: int

    def start(self) -> None: ...
    def add(self, key: Key, directory: Path) -> None: ...
    def drain(self) -> Changed: ...
    def revive(self) -> None: ...
    def stop(self) -> None: ...


class WatchError(Exception):
    """The watch asked for cannot be set up."""


def make_watch(choice: str | None = None) -> StoreWatch:
    """The backend `choice` names (default: `$MEMD_WATCH`, else the best this system has)."""
    choice = (os.environ.get("MEMD_WATCH", "") if choice is None else choice).strip().lower()
    if choice not in ("", "inotify", "watchdog"):
        raise WatchError(f"MEMD_WATCH={choice!r} is not a watch; use 'inotify' or 'watchdog'")
    if choice != "watchdog" and _libc_inotify() is not None:
        return InotifyWatch()
    if choice == "inotify":
        raise WatchError("MEMD_WATCH=inotify, but this system has no inotify")
    return WatchdogWatch()


# -- inotify ---------------------------------------------------------------------------------

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_ONLYDIR, IN_EXCL_UNLINK = 0x01000000, 0x04000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
# Everything that can change what a store file holds; opening and reading it cannot, and
# reacting to those would make each re-read trigger another.
WATCH_MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK
)
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_READ_SIZE = 64 * 1024


def _libc_inotify() -> Any | None:
    """libc, when it has inotify."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class InotifyWatch:
    def __init__(self) -> None:
        libc = _libc_inotify()
        if libc is None:
            raise OSError(errno.ENOSYS, "inotify is not available")
        self._add_watch = libc.inotify_add_watch
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self.wake_fd = fd
        self.watches: dict[int, Key] = {}  # watch descriptor -> key
        self.directories: dict[Key, Path] = {}
        self.lost: set[Key] = set()  # directories whose watch the kernel dropped (deleted, moved)

    def start(self) -> None:
        pass  # events queue in the kernel from `add` on; the loop reads them

    def add(self, key: Key, directory: Path) -> None:
        if key in self.directories and key not in self.lost:
            return
        self.directories[key] = directory
        wd = self._add_watch(self.wake_fd, os.fsencode(directory), WATCH_MASK)
        if wd < 0:
            self.lost.add(key)
            code = ctypes.get_errno()
            raise OSError(code, f"cannot watch {directory}: {os.strerror(code)}")
        self.watches[wd] = key
        self.lost.discard(key)

    def drain(self) -> Changed:
        """Every store touched since the last drain, each once."""
        changed: Changed = set()
        while True:
            try:
                buffer = os.read(self.wake_fd, _READ_SIZE)
            except BlockingIOError:
                return changed
            offset = 0
            while offset + _HEADER.size <= len(buffer):
                wd, mask, _cookie, length = _HEADER.unpack_from(buffer, offset)
                name = buffer[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0")
                offset += _HEADER.size + length
                if mask & IN_Q_OVERFLOW:  # events were dropped: look at everything
                    changed.update((key, target) for key in self.directories for target in FILENAMES)
                    continue
                if wd not in self.watches:
                    continue  # a watch dropped earlier in this read
                key = self.watches[wd]
                if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                    # The directory itself went away: its stores are gone with it, and the
                    # watch must be set again once it is back (see `revive`).
                    if mask & IN_IGNORED:
                        del self.watches[wd]
                        self.lost.add(key)
                    changed.update((key, target) for target in FILENAMES)
                    continue
                target = STORE_NAMES.get(os.fsdecode(name))
                if target is not None:
                    changed.add((key, target))

    def revive(self) -> None:
        """Watch again the directories that were deleted and have been made again (the caller
        rescans everything, which covers what happened while they were not watched)."""
        for key in list(self.lost):
            if self.directories[key].is_dir():
                try:
                    self.add(key, self.directories[key])
                except OSError:
                    continue

    def stop(self) -> None:
        os.close(self.wake_fd)


# -- watchdog --------------------------------------------------------------------------------


class _Handler(FileSystemEventHandler):
    def __init__(self, watch: WatchdogWatch, key: Key) -> None:
        self.watch = watch
        self.key = key

    def on_any_event(self, event: FileSystemEvent) -> None:
        for path in (event.src_path, getattr(event, "dest_path", "")):
            target = STORE_NAMES.get(os.path.basename(os.fsdecode(path))) if path else None
            if target is not None:
                self.watch.changed(self.key, target)


class WatchdogWatch:
    # The events that can change what a store holds, as the inotify backend's mask; on Linux
    # watchdog narrows its own inotify mask to them.
    EVENTS = [FileModifiedEvent, FileClosedEvent, FileMovedEvent, FileCreatedEvent, FileDeletedEvent]

    def __init__(self) -> None:
        self.observer = Observer()
        self.observer.daemon = True
        self.pending: queue.SimpleQueue[tuple[Key, str]] = queue.SimpleQueue()
        self.wake_fd, self._wake_write = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_write, False)
        self.watched: set[Key] = set()

    def start(self) -> None:
        self.observer.start()

    def add(self, key: Key, directory: Path) -> None:
        if key in self.watched:
            return
        self.observer.schedule(_Handler(self, key), str(directory), recursive=False, event_filter=self.EVENTS)
        self.watched.add(key)

    def changed(self, key: Key, target: str) -> None:
        """Called on watchdog's thread: queue, and wake the loop."""
        self.pending.put((key, target))
        try:
            os.write(self._wake_write, b"!")
        except BlockingIOError:
            pass  # the pipe is full, so the loop is already due to wake

    def drain(self) -> Changed:
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
        changed: Changed = set()
        while True:
            try:
                changed.add(self.pending.get_nowait())
            except queue.Empty:
                return changed

    def revive(self) -> None:
        pass  # watchdog keeps its watches itself

    def stop(self) -> None:
        if self.observer.is_alive():
            self.observer.stop()
            self.observer.join(timeout=5)
        os.close(self.wake_fd)
        os.close(self._wake_write)
