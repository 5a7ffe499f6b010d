"""The thin client: a DEALER socket, request ids, timeouts and safe retries.

A `Client` is not thread-safe (ZeroMQ sockets are not); give each thread its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from memd_client import protocol as wire
from memd_client.tool import handle_tool_call


class MemdError(Exception):
    """Base of everything the client raises."""


class DaemonUnavailable(MemdError):
    """No reply in time: the daemon is not running, or not reachable at this endpoint."""


class RequestRefused(MemdError):
    """The daemon answered that it cannot serve the request (malformed, unknown session...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SessionClosed(RequestRefused):
    """The session was closed, expired after being idle, or the daemon restarted."""


@dataclass(frozen=True, slots=True)
class SnapshotBlocks:
    """A session's frozen system-prompt blocks; None for an empty store."""

    memory: str | None
    user: str | None


def _blocks(result: Mapping[str, Any]) -> SnapshotBlocks:
    return SnapshotBlocks(result.get("memory"), result.get("user"))


def _default_home() -> Path:
    configured = os.environ.get("HERMES_HOME")
    if configured:
        return Path(configured).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", str(Path.home()))) / "hermes"
    return Path.home() / ".hermes"


def autostart_enabled(endpoint: str | None) -> bool:
    """Autostart serves the common case: the default endpoint, unless MEMD_AUTOSTART=0."""
    return endpoint is None and os.environ.get("MEMD_AUTOSTART", "1").strip().lower() not in ("0", "no", "false", "off")


class Client:
    """A connection to a memd daemon.

    `timeout` bounds every call (seconds). A call with no reply is re-sent with the same request
    id (`retries` times), which the daemon answers from its cache rather than applying twice.
    """

    def __init__(
        self, endpoint: str | None = None, timeout: float = 5.0, *, retries: int = 2,
        curve_dir: str | os.PathLike[str] | None = None, autostart: bool | None = None,
    ) -> None:
        self.autostart = autostart_enabled(endpoint) if autostart is None else autostart
        self.endpoint = endpoint or wire.default_endpoint()
        self.timeout = timeout
        self.retries = max(0, retries)
        self.context = zmq.Context.instance()
        self.curve_dir = Path(curve_dir or os.environ.get("MEMD_CURVE_DIR") or wire.curve_dir_for(_default_home()))
        self.socket: zmq.Socket | None = None
        self.closed = False

    # -- transport --------------------------------------------------------------------------

    def _secure(self, socket: zmq.Socket) -> None:
        if not self.endpoint.startswith("tcp://"):
            return
        try:
            server_public, _ = zmq.auth.load_certificate(self.curve_dir / "server.key")
            public, secret = zmq.auth.load_certificate(self.curve_dir / "client.key_secret")
        except (OSError, ValueError) as error:
            raise MemdError(
                f"{self.endpoint} needs CURVE keys, and none could be read from {self.curve_dir} "
                f"({error}); copy server.key and client.key_secret from the daemon's home "
                "(<home>/memd/curve) or set MEMD_CURVE_DIR"
            ) from None
        socket.curve_serverkey = server_public
        socket.curve_publickey = public
        socket.curve_secretkey = secret

    def _connect(self, socket_type: int = zmq.DEALER) -> zmq.Socket:
        socket = self.context.socket(socket_type)
        socket.setsockopt(zmq.LINGER, 0)
        self._secure(socket)
        socket.connect(self.endpoint)
        return socket

    def _reset(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None

    def call(self, request_type: type[wire.Request], **fields: Any) -> Any:
        """Send one request and return its result; raises RequestRefused or DaemonUnavailable."""
        if self.closed:
            raise MemdError("this client is closed")
        request = request_type(v=wire.PROTOCOL_VERSION, id=uuid.uuid4().hex, **fields)
        frame = wire.encoder.encode(request)
        if self.autostart and not self._daemon_present():
            start_daemon(self.endpoint, self.timeout)
        attempts = self.retries + 1
        for _ in range(attempts):
            if self.socket is None:
                self.socket = self._connect()
            self.socket.send(frame)
            reply = self._await(request.id, self.timeout / attempts)
            if reply is not None:
                return self._result(reply)
            self._reset()  # a lost reply may have left the socket in a bad state: start afresh
        raise DaemonUnavailable(
            f"memd did not answer at {self.endpoint} within {self.timeout:g}s. Is the daemon "
            "running? Start it with `memd serve` (or `systemctl --user start memd`)."
        )

    def _await(self, request_id: str, wait: float) -> wire.Reply | None:
        assert self.socket is not None
        deadline = time.monotonic() + wait
        while (remaining := deadline - time.monotonic()) > 0:
            if not self.socket.poll(max(1, int(remaining * 1000))):
                return None
            try:
                reply = wire.reply_decoder.decode(self.socket.recv())
            except Exception:  # a garbled frame is treated like a lost one: the retry will fix it
                continue
            if reply.id == request_id:
                return reply
        return None

    @staticmethod
    def _result(reply: wire.Reply) -> Any:
        if reply.ok:
            return reply.result
        failure = reply.error or wire.Failure(code="invalid", message="refused without a reason")
        error_type = SessionClosed if failure.code == "no_session" else RequestRefused
        raise error_type(failure.code, failure.message)

    def _daemon_present(self) -> bool:
        """Whether something is bound at an ipc endpoint (a cheap check, before any waiting)."""
        if not self.endpoint.startswith("ipc://"):
            return True
        return Path(self.endpoint[len("ipc://"):]).exists()

    # -- the API ----------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        return self.call(wire.Hello)

    def status(self, profile: str | None = None) -> dict[str, Any]:
        return self.call(wire.Status, profile=profile)

    def entries(self, target: str = "memory", profile: str | None = None) -> list[str]:
        return self.call(wire.Entries, target=target, profile=profile)["entries"]

    def preview(self, profile: str | None = None) -> SnapshotBlocks:
        """The snapshot a session opened now would get, without opening one."""
        return _blocks(self.call(wire.Preview, profile=profile))

    def history(
        self, target: str | None = None, *, since: float | None = None, session: str | None = None,
        limit: int = 200, profile: str | None = None,
    ) -> list[dict[str, Any]]:
        """Journal records, oldest first (the newest `limit` that match): seq, time, session,
        target, action, steps ({action, old?, new?}), usage, after (entries after the change)."""
        return self.call(wire.History, target=target, since=since, session=session, limit=limit, profile=profile)

    def provenance(self, target: str = "memory", profile: str | None = None) -> list[dict[str, Any]]:
        """For each live entry: the seq, time, session and action that wrote it as it is."""
        return self.call(wire.Provenance, target=target, profile=profile)

    def undo(self, seq: int, *, dry_run: bool = False, name: str = "undo", profile: str | None = None) -> dict[str, Any]:
        """Revert journal record `seq` as a new change; refused (code `conflict`) when later
        changes make that unsafe. Returns a memory reply."""
        return self.call(wire.Undo, seq=seq, dry_run=dry_run, name=name, profile=profile)

    def restore(
        self, target: str, at: float, *, dry_run: bool = False, name: str = "restore", profile: str | None = None,
    ) -> dict[str, Any]:
        """Bring `target` back to its state at Unix time `at`, as a new change."""
        return self.call(wire.Restore, target=target, at=at, dry_run=dry_run, name=name, profile=profile)

    def open_session(self, name: str, profile: str | None = None) -> Session:
        result = self.call(wire.OpenSession, name=name, profile=profile)
        return Session(self, result["session"], name, profile, _blocks(result["snapshot"]))

    def notifications(self, timeout: float | None = None) -> Iterator[wire.Notification]:
        """Follow change notifications; stops after `timeout` seconds without one (None: never)."""
        publish = self.hello()["publish"]
        subscriber = self.context.socket(zmq.SUB)
        subscriber.setsockopt(zmq.LINGER, 0)
        self._secure(subscriber)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        subscriber.connect(publish)
        try:
            while subscriber.poll(None if timeout is None else int(timeout * 1000)):
                yield wire.notification_decoder.decode(subscriber.recv())
        finally:
            subscriber.close(linger=0)

    def close(self) -> None:
        self._reset()
        self.closed = True

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Session:
    """An agent's session: a frozen snapshot, the memory tool, turns."""

    def __init__(self, client: Client, session_id: str, name: str, profile: str | None, snapshot: SnapshotBlocks) -> None:
        self.client = client
        self.id = session_id
        self.name = name
        self.profile = profile
        self.snapshot = snapshot

    def memory(self, args: Mapping[str, Any] | None = None, /, **kwargs: Any) -> dict[str, Any]:
        """Apply a `memory` tool call (a mapping, or keyword arguments); returns the reply."""
        return self.client.call(wire.Memory, session=self.id, args={**(args or {}), **kwargs})

    def handle_tool_call(self, arguments: str | Mapping[str, Any]) -> str:
        """A model's tool arguments (JSON text or a mapping) in, the tool result (JSON text) out."""
        return handle_tool_call(self.memory, arguments)

    def new_turn(self) -> int:
        return self.client.call(wire.NewTurn, session=self.id)["turn"]

    def refresh(self) -> SnapshotBlocks:
        self.snapshot = _blocks(self.client.call(wire.Refresh, session=self.id))
        return self.snapshot

    def close(self) -> None:
        self.client.call(wire.CloseSession, session=self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def start_daemon(endpoint: str, timeout: float) -> None:
    """Start `memd serve` detached and wait until its socket exists.

    Two clients may race here; the daemon's own lock lets exactly one of them serve, and the
    other exits at once, so both clients end up talking to the same daemon.
    """
    command = shutil.which("memd")
    argv = [command] if command else [sys.executable, "-m", "memd"]
    argv += ["serve", "--endpoint", endpoint]
    log_path = Path(endpoint[len("ipc://"):]).with_suffix(".log") if endpoint.startswith("ipc://") else None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(log_path or os.devnull, "ab") as log:
        subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + max(timeout, 5.0)
    path = Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None
    while time.monotonic() < deadline:
        if path is None or path.exists():
            return
        time.sleep(0.02)
    raise DaemonUnavailable(
        f"started `{' '.join(argv)}` but it did not come up within {max(timeout, 5.0):g}s"
        + (f"; see {log_path}" if log_path else "")
    )
