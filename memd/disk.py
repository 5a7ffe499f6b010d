"""Store files on disk: validated reads, durable atomic writes, the lock shared with Hermes, backups."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memd.core.format import normalise_text

# A store is a few kilobytes; anything this large is a runaway paste, refused rather than loaded.
MAX_STORE_BYTES = 8 * 1024 * 1024
IS_WINDOWS = sys.platform == "win32"

if IS_WINDOWS:
    import msvcrt
else:
    import fcntl


class DurabilityError(Exception):
    """A write could not be made durable. The daemon must stop acknowledging and exit."""


@dataclass(frozen=True, slots=True)
class StoreFile:
    """A store file as read: its bytes, and its text when they decode."""

    exists: bool
    raw: bytes
    digest: str
    text: str | None
    error: str | None

    @property
    def readable(self) -> bool:
        return self.error is None


def digest_of(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def decode_store(raw: bytes) -> tuple[str | None, str | None]:
    """(normalised text, None) or (None, why it cannot be used)."""
    if len(raw) > MAX_STORE_BYTES:
        return None, f"it is {len(raw):,} bytes, more than the {MAX_STORE_BYTES:,} a store may hold"
    try:
        return normalise_text(raw.decode("utf-8")), None
    except UnicodeDecodeError as error:
        return None, f"it is not valid UTF-8 (byte {error.start})"


def read_store(path: Path) -> StoreFile:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_STORE_BYTES + 1)
    except FileNotFoundError:
        return StoreFile(False, b"", digest_of(b""), "", None)
    except OSError as error:
        return StoreFile(True, b"", "", None, f"it cannot be read: {error.strerror or error}")
    text, problem = decode_store(raw)
    return StoreFile(True, raw, digest_of(raw), text, problem)


def fsync_directory(directory: Path) -> None:
    if IS_WINDOWS:
        return  # Windows cannot open a directory for fsync; NTFS journals the rename itself
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> bytes:
    """Replace `path` with `text` so that after return it survives a crash or power loss.

    A temp file in the same directory is written, fsynced and renamed over the store, then the
    directory is fsynced so the rename itself is durable. Any failure raises DurabilityError and
    leaves the old file in place.
    """
    raw = text.encode("utf-8")
    directory = path.parent
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
        fsync_directory(directory)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise DurabilityError(f"could not durably write {path}: {error}") from error
    return raw


def lock_path_for(store: Path) -> Path:
    return store.with_name(store.name + ".lock")


def _open_lock_file(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if path.is_symlink():
            raise PermissionError(f"refusing to use {path}: the lock file is a symbolic link") from error
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PermissionError(f"refusing to use {path}: the lock file is not a regular file")
    return fd


@contextlib.contextmanager
def store_lock(store: Path) -> Iterator[None]:
    """Hold the exclusive lock on `<store>.lock`, the same lock Hermes takes around its writes."""
    fd = _open_lock_file(lock_path_for(store))
    try:
        if IS_WINDOWS:
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock on every platform


def write_backup(store: Path, raw: bytes, now: float) -> Path:
    """Save `raw` as `<store>.bak.<unix time>`, durably, never overwriting an earlier backup.

    When that second's name is taken by different content, the next free second is used, so the
    name still sorts by time.
    """
    second = int(now)
    while True:
        backup = store.with_name(f"{store.name}.bak.{second}")
        try:
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if backup.read_bytes() == raw:
                return backup
            second += 1
            continue
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(raw)
                handle.flush()
                os.fsync(handle.fileno())
            fsync_directory(store.parent)
        except OSError as error:
            raise DurabilityError(f"could not durably write backup {backup}: {error}") from error
        return backup


def latest_backup(store: Path) -> Path | None:
    """The newest `<store>.bak.<time>` beside the store."""
    def second_of(path: Path) -> int:
        suffix = path.name.rsplit(".", 1)[-1]
        return int(suffix) if suffix.isdigit() else -1

    backups = [path for path in store.parent.glob(f"{store.name}.bak.*") if second_of(path) >= 0]
    return max(backups, key=second_of, default=None)
