"""Store files on disk: validated reads, durable atomic writes, the lock shared with Hermes, backups."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import queue
import secrets
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memd.core.format import normalise_text

# A store is a few kilobytes; anything this large is a runaway paste, refused rather than loaded.
MAX_STORE_BYTES = 8 * 1024 * 1024
IS_WINDOWS = sys.platform == "win32"

if IS_WINDOWS:
    import msvcrt

    resource = None  # no per-process descriptor limit to read or raise
else:
    import fcntl
    import resource


def _load_renameat2() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a libc before glibc 2.28
        return None


_RENAMEAT2 = _load_renameat2()
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(first: str, second: str) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # this filesystem cannot exchange
    raise OSError(code, os.strerror(code), second)


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
    found = read_if_changed(path, None)
    assert found is not None  # only a digest given can match
    return found


def read_if_changed(path: Path, digest: str | None) -> StoreFile | None:
    """The store as `read_store` reads it, or None when it holds the very bytes whose digest is
    `digest`: the caller took them in already, and decoding them again is a quarter of a read
    (every write reads its store twice, and almost always finds it as it left it)."""
    # Plain descriptors rather than open(): the buffered file object costs more than the read
    # itself for a file of a few kilobytes.
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        empty = digest_of(b"")
        return None if empty == digest else StoreFile(False, b"", empty, "", None)
    except OSError as error:
        return StoreFile(True, b"", "", None, f"it cannot be read: {error.strerror or error}")
    try:
        chunks = []
        size = 0
        while size <= MAX_STORE_BYTES:
            chunk = os.read(fd, MAX_STORE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        return StoreFile(True, b"", "", None, f"it cannot be read: {error.strerror or error}")
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    found = digest_of(raw)
    if found == digest:
        return None
    text, problem = decode_store(raw)
    return StoreFile(True, raw, found, text, problem)


def fsync_directory(directory: Path) -> None:
    if IS_WINDOWS:
        return  # Windows cannot open a directory for fsync; NTFS journals the rename itself
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# A flush for the fsync thread: the descriptor, a lock it releases once done, and a list it puts
# the error in if the fsync failed.
_Flush = tuple[int, threading.Lock, list[Exception]]
_flushes: tuple[int, queue.SimpleQueue[_Flush]] | None = None


def _flush_forever(flushes: queue.SimpleQueue[_Flush]) -> None:
    while True:
        fd, done, failed = flushes.get()
        try:
            os.fsync(fd)
        except Exception as error:  # noqa: BLE001 - handed to the caller, which raises it
            failed.append(error)
        done.release()


def _fsync_thread() -> queue.SimpleQueue[_Flush]:
    """The queue of a thread for the fsync that runs beside the caller's own (fsync releases
    the GIL). A bare thread, not a ThreadPoolExecutor: handing work to the pool and waiting on
    its future cost 30 µs more per write in the daemon, on every write's critical path."""
    global _flushes
    if _flushes is None or _flushes[0] != os.getpid():  # a forked child has no threads
        flushes: queue.SimpleQueue[_Flush] = queue.SimpleQueue()
        # A daemon thread: it holds nothing, and must not keep a program from exiting.
        threading.Thread(target=_flush_forever, args=(flushes,), name="memd-fsync", daemon=True).start()
        _flushes = (os.getpid(), flushes)
    return _flushes[1]


def fsync_together(directory: Path, fd: int) -> None:
    """fsync `directory` and the open file `fd` at the same time, returning when both are durable.

    A write that renames a store and appends to the journal needs both flushed before it is
    acknowledged. Issued together, the two waits overlap (where the disk allows, they share one
    commit of the filesystem's journal; on the development VM each still costs its own flush).
    """
    # A lock of its own for each flush: a caller interrupted while waiting (Ctrl-C in a program
    # that embeds the engine) leaves behind a lock no later flush waits on.
    done = threading.Lock()
    done.acquire()
    failed: list[Exception] = []
    _fsync_thread().put((fd, done, failed))
    try:
        fsync_directory(directory)
    finally:
        done.acquire()
    if failed:
        raise failed[0]


def write_durably(path: Path, text: str) -> bytes:
    """Replace `path` with `text` so that after return it survives a crash or power loss.

    A temp file in the same directory is written, fsynced and renamed over the store, then the
    directory is fsynced so the rename itself is durable. Any failure raises DurabilityError and
    leaves the old file in place.
    """
    return prepare_write(path, text).publish()


@dataclass(frozen=True, slots=True)
class PreparedWrite:
    """New content for `path`, durable in a temp file beside it, not yet renamed over it.

    The split lets a writer look at the store once more just before the rename: writing and
    fsyncing the temp file is the long part, and programs that do not take the lock (a shell's
    `>>`, an editor) may change the store meanwhile.
    """

    path: Path
    temp_name: str
    raw: bytes

    def publish(self) -> bytes:
        try:
            os.replace(self.temp_name, self.path)
            fsync_directory(self.path.parent)
        except OSError as error:
            self.discard()
            raise DurabilityError(f"could not durably write {self.path}: {error}") from error
        return self.raw

    def swap_in(self, expected_digest: str) -> Displaced | None:
        """Put the new content in place; on Linux by swapping it in atomically, which leaves the
        version it displaced at hand (None elsewhere, or when there was no store to displace).

        Unlike `publish`, the directory is not fsynced: the caller must (`fsync_together`)
        before it acknowledges the write, and can so share that flush with its journal's.

        A program that ignores the lock and saves between the caller's last look (whose digest
        is `expected_digest`) and the swap, or is still appending to the file it opened before,
        loses nothing: see `Displaced`.
        """
        try:
            exchanged = _exchange(self.temp_name, str(self.path))
            if not exchanged:
                os.replace(self.temp_name, self.path)
                return None
        except FileNotFoundError:
            try:  # no store to displace: a plain rename creates it
                os.replace(self.temp_name, self.path)
            except OSError as error:
                self.discard()
                raise DurabilityError(f"could not durably write {self.path}: {error}") from error
            return None
        except OSError as error:
            self.discard()
            raise DurabilityError(f"could not durably write {self.path}: {error}") from error
        try:
            fd = os.open(self.temp_name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            os.unlink(self.temp_name)
        except OSError as error:
            raise DurabilityError(f"could not durably write {self.path}: {error}") from error
        return Displaced(fd, expected_digest, time.monotonic())

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.temp_name)


def descriptor_limit() -> int:
    """How many descriptors this process may have open (its soft limit); 8,192 where the system sets
    no such limit per process (Windows)."""
    if resource is None:
        return 8192
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def raise_descriptor_limit(wanted: int) -> str | None:
    """Raise this process's soft limit on open descriptors towards `wanted`, as far as the hard limit
    allows (only a privileged process may raise that). Returns why it could not, or None."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        wanted = min(hard, wanted)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as error:  # macOS caps it below an infinite hard limit
        return f"{error} (it stays {soft})"
    return None


@dataclass(slots=True)
class Displaced:
    """The version of a store that a write swapped out, held open for a moment after: a program
    that opened the store before the swap may still be writing into it."""

    fd: int
    digest: str  # of the content it held when last looked at
    since: float  # time.monotonic() of the swap
    # Its size and modification time when last read: while they stand, a look short of the last
    # need not read it again (the daemon looks at every version it holds on each change it sees).
    seen: tuple[int, int] = (-1, -1)

    def look(self, last: bool = False) -> bytes | None:
        """Its content when it changed since last looked at (the first look compares with what
        the writer expected to replace), else None. The `last` look reads it whatever its size and
        time say, as a rewrite in place within the clock's grain would leave both as they were."""
        status = os.fstat(self.fd)
        seen = (status.st_size, status.st_mtime_ns)
        if seen == self.seen and not last:
            return None
        self.seen = seen
        # All of it, not the most a store may hold: a paste of more than that into the old file is
        # somebody's text too, and this is the only copy of its end.
        raw = _read_all(self.fd)
        found = digest_of(raw)
        if found == self.digest:
            return None
        self.digest = found
        return raw

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _read_all(fd: int) -> bytes:
    """The whole content of an open file, from its start."""
    chunks, offset = [], 0
    while chunk := os.pread(fd, max(os.fstat(fd).st_size - offset, 1 << 16), offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def durable_temp_file(directory: Path, prefix: str, raw: bytes) -> str:
    """A temp file in `directory` holding `raw`, fsynced; removed again if that fails."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    while True:
        # Plain descriptors: this is on every write's path, and tempfile.mkstemp with a file
        # object around it takes 18 µs where these calls take 11.
        temp_name = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temp_name, flags, 0o600)
            break
        except FileExistsError:
            continue
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    return temp_name


def prepare_write(path: Path, text: str) -> PreparedWrite:
    raw = text.encode("utf-8")
    try:
        temp_name = durable_temp_file(path.parent, f".{path.name}.", raw)
    except OSError as error:
        raise DurabilityError(f"could not durably write {path}: {error}") from error
    return PreparedWrite(path, temp_name, raw)


def remove_temp_files(store: Path) -> int:
    """Delete the temp files a writer killed mid-write left beside `store` (memd's own names,
    `.MEMORY.md.*.tmp`; Hermes uses others). Call with the store's lock held: a live writer's
    temp file only exists while it holds the lock. Returns how many were removed."""
    removed = 0
    for temp in store.parent.glob(f".{store.name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
            removed += 1
    return removed


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


class StoreLock:
    """The exclusive lock on `<store>.lock`, the same lock Hermes takes around its writes.

    The lock file stays open between uses, since a daemon takes it for every write; each use
    checks that the path still names the file held, so a lock file that was deleted or replaced
    meanwhile is opened again rather than locked in vain.
    """

    def __init__(self, store: Path) -> None:
        self.path = lock_path_for(store)
        self.fd: int | None = None

    def __enter__(self) -> StoreLock:
        while True:
            if self.fd is None:
                self.fd = _open_lock_file(self.path)
            if IS_WINDOWS:
                msvcrt.locking(self.fd, msvcrt.LK_LOCK, 1)
                return self
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if self._still_named():
                return self
            self.close()

    def __exit__(self, *_exc: object) -> None:
        if self.fd is None:
            return
        if IS_WINDOWS:
            os.lseek(self.fd, 0, os.SEEK_SET)
            msvcrt.locking(self.fd, msvcrt.LK_UNLCK, 1)
        else:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _still_named(self) -> bool:
        assert self.fd is not None
        try:
            named = os.lstat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(self.fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock if it is held
            self.fd = None


@contextlib.contextmanager
def store_lock(store: Path) -> Iterator[None]:
    """Hold the store's lock for one use (see `StoreLock`)."""
    lock = StoreLock(store)
    try:
        with lock:
            yield
    finally:
        lock.close()


def write_backup(store: Path, raw: bytes, now: float) -> Path:
    """Save `raw` as `<store>.bak.<unix time>`, durably, never overwriting an earlier backup.

    The content is made durable in a temp file first and then hard-linked to its name, which
    fails rather than replaces when the name exists: a backup is never seen half-written, even
    after a crash. When that second's name holds different content, the next free second is
    used, so names still sort by time.
    """
    try:
        temp_name = durable_temp_file(store.parent, f".{store.name}.bak.", raw)
    except OSError as error:
        raise DurabilityError(f"could not durably write a backup of {store}: {error}") from error
    try:
        second = int(now)
        while True:
            backup = store.with_name(f"{store.name}.bak.{second}")
            try:
                os.link(temp_name, backup)
                break
            except FileExistsError:
                if backup.read_bytes() == raw:
                    return backup
                second += 1
        fsync_directory(store.parent)
    except OSError as error:
        raise DurabilityError(f"could not durably write a backup of {store}: {error}") from error
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
    return backup


def latest_backup(store: Path) -> Path | None:
    """The newest `<store>.bak.<time>` beside the store."""
    def second_of(path: Path) -> int:
        suffix = path.name.rsplit(".", 1)[-1]
        return int(suffix) if suffix.isdigit() else -1

    backups = [path for path in store.parent.glob(f"{store.name}.bak.*") if second_of(path) >= 0]
    return max(backups, key=second_of, default=None)
