"""The machinery that keeps a durable write short: the fsync thread beside the caller's own fsync,
reads that do not decode again what was already taken in, and notifications that wait for the
replies."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq
from memd_client import protocol as wire

from memd import disk
from memd.config import Settings
from memd.disk import digest_of, fsync_together, read_if_changed, read_store
from memd.engine import Engine
from memd.server import Daemon
from tests.helpers_core import make_home

POSIX = pytest.mark.skipif(sys.platform == "win32", reason="signals and fork are POSIX's")


def open_file(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, b"a line\n")
    return fd


# -- fsync_together ---------------------------------------------------------------------------


def test_fsync_together_flushes_both_at_once_and_returns_only_when_both_are_done(tmp_path, monkeypatch):
    fd = open_file(tmp_path / "journal.jsonl")
    real_fsync = os.fsync
    finished: list[int] = []

    def slow_fsync(target: int) -> None:
        time.sleep(1.0 if target == fd else 0.5)  # the file's outlasts the directory's
        real_fsync(target)
        finished.append(target)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    try:
        started = time.monotonic()
        fsync_together(tmp_path, fd)
        took = time.monotonic() - started
        assert len(finished) == 2 and finished[-1] == fd  # the directory's, then the file's
        assert took < 1.35, f"{took:.2f}s: the two fsyncs ran one after the other (1.5 s)"
    finally:
        os.close(fd)


def test_a_failed_fsync_is_raised_and_the_thread_goes_on_serving(tmp_path):
    fd = open_file(tmp_path / "journal.jsonl")
    returned = threading.Event()

    def flush() -> None:
        fsync_together(tmp_path, fd)
        returned.set()

    try:
        with pytest.raises(OSError, match="Bad file descriptor"):
            fsync_together(tmp_path, 1_000_000)  # fails on the fsync thread
        with pytest.raises(FileNotFoundError):
            fsync_together(tmp_path / "missing", fd)  # fails on the caller's own
        threading.Thread(target=flush, daemon=True).start()
        assert returned.wait(10), "a flush after the failures never came back"
    finally:
        os.close(fd)


@POSIX
def test_a_caller_interrupted_while_waiting_leaves_no_release_a_later_flush_would_take(tmp_path, monkeypatch):
    first = open_file(tmp_path / "first")
    second = open_file(tmp_path / "second")
    real_fsync = os.fsync
    let_first_finish = threading.Event()
    finished: list[int] = []

    def fsync(target: int) -> None:
        if target == first:
            let_first_finish.wait(10)
        elif target == second:
            time.sleep(0.3)
        real_fsync(target)
        finished.append(target)

    class Interrupted(Exception):
        pass

    def interrupt(_signum: int, _frame: object) -> None:
        raise Interrupted

    monkeypatch.setattr(os, "fsync", fsync)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # Ctrl-C, as it were, while `first` is flushed
        with pytest.raises(Interrupted):
            fsync_together(tmp_path, first)
        signal.setitimer(signal.ITIMER_REAL, 0)
        let_first_finish.set()  # the abandoned flush ends now, while the next one runs
        fsync_together(tmp_path, second)
        assert second in finished, "fsync_together returned before its own file was flushed"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        let_first_finish.set()
        os.close(first)
        os.close(second)


@POSIX
def test_a_forked_child_gets_an_fsync_thread_of_its_own(tmp_path):
    fd = open_file(tmp_path / "journal.jsonl")
    try:
        fsync_together(tmp_path, fd)  # the parent's thread, which a child does not inherit
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fsync_together(tmp_path, fd)
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("fsync_together never came back in a forked child")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(fd)


# -- reads that skip what is known ------------------------------------------------------------


def test_read_if_changed_is_none_only_for_the_very_bytes_of_the_digest(tmp_path):
    store = tmp_path / "MEMORY.md"
    store.write_bytes("Uses vim.\r\n§\r\nCafé.".encode())
    known = read_store(store)
    assert read_if_changed(store, known.digest) is None
    assert read_if_changed(store, None) == known
    store.write_bytes("Uses vim.\n§\nCafé.".encode())  # the same text, other bytes
    changed = read_if_changed(store, known.digest)
    assert changed is not None and changed == read_store(store) and changed.text == known.text
    store.unlink()
    assert read_if_changed(store, digest_of(b"")) is None  # missing, and known to be empty
    missing = read_if_changed(store, known.digest)
    assert missing is not None and not missing.exists and missing.text == ""


def test_writes_do_not_decode_a_store_they_find_as_they_left_it(tmp_path, monkeypatch):
    engine = Engine(make_home(tmp_path))
    session = engine.open_session("cli")
    decoded: list[bytes] = []
    real_decode = disk.decode_store

    def counting_decode(raw: bytes) -> tuple[str | None, str | None]:
        decoded.append(raw)
        return real_decode(raw)

    monkeypatch.setattr(disk, "decode_store", counting_decode)
    for number in range(5):
        assert session.memory(action="add", content=f"Fact number {number}.")["success"]
    assert decoded == []
    store = engine.stores["memory"].path
    store.write_text(store.read_text(encoding="utf-8") + "\n§\nAdded by hand.", encoding="utf-8")
    assert session.memory(action="add", content="Fact number 5.")["success"]
    assert len(decoded) == 1  # the edit from outside, taken in once under the lock
    assert "Added by hand." in engine.entries("memory")
    engine.close()


# -- notifications ----------------------------------------------------------------------------


def test_the_notifications_of_a_batch_are_published_after_its_replies(tmp_path):
    sent: list[tuple[str, bytes]] = []

    class Router:
        def __init__(self, messages: list[list[bytes]]) -> None:
            self.messages = messages

        def getsockopt(self, _option: int) -> int:
            return zmq.POLLIN if self.messages else 0

        def recv_multipart(self, _flags: int = 0) -> list[bytes]:
            return self.messages.pop(0)

        def send_multipart(self, frames: list[bytes], _flags: int = 0) -> None:
            sent.append(("reply", frames[1]))

    class Publisher:
        def send(self, frame: bytes, _flags: int = 0) -> None:
            sent.append(("notification", frame))

    daemon = Daemon(Settings(home=make_home(tmp_path)), "ipc://unused")
    try:
        daemon.publisher = Publisher()  # type: ignore[assignment]
        session = daemon.engine_for(None).open_session("cli")
        writes = [
            wire.encoder.encode(wire.Memory(
                v=wire.PROTOCOL_VERSION, id=f"write-{number}", session=session.id,
                args={"action": "add", "content": f"Fact number {number}."},
            ))
            for number in range(2)
        ]
        hello = wire.encoder.encode(wire.Hello(v=wire.PROTOCOL_VERSION, id="hello"))
        daemon.router = Router([[b"peer", writes[0]], [b"peer", hello], [b"peer", writes[1]]])  # type: ignore[assignment]
        daemon._serve_ready()
        assert [kind for kind, _ in sent] == ["reply"] * 3 + ["notification"] * 2
        notes = [wire.notification_decoder.decode(frame) for kind, frame in sent if kind == "notification"]
        assert [(note.kind, note.session) for note in notes] == [("store_changed", "cli")] * 2
        assert notes[1].seq == notes[0].seq + 1 == daemon.seq
    finally:
        daemon.router = None
        daemon.publisher = None
        for engine in daemon.engines.values():
            engine.close()
        daemon.context.term()
