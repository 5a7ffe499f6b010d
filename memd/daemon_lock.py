"""One daemon per memory home: an exclusive lock held for the daemon's whole life."""

from __future__ import annotations

import json
import os
from pathlib import Path

from memd.config import state_dir
from memd.disk import IS_WINDOWS

if IS_WINDOWS:
    import msvcrt
else:
    import fcntl


class AlreadyRunning(Exception):
    """Another daemon holds the home; the message names it."""


class DaemonLock:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.fd: int | None = None

    @property
    def path(self) -> Path:
        return state_dir(self.home) / "daemon.lock"

    def holder(self) -> dict[str, object]:
        """Who holds the lock, as it wrote itself down ({} when unknown)."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self, endpoint: str) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            if IS_WINDOWS:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            else:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            running = self.holder()
            raise AlreadyRunning(
                f"memd is already running for home {self.home} (pid {running.get('pid', '?')}, "
                f"endpoint {running.get('endpoint', '?')}); stop it first, or use `memd status`"
            ) from None
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"pid": os.getpid(), "endpoint": endpoint}).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = None
