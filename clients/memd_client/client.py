"""The thin client: a DEALER socket, request ids, timeouts and safe retries.

A `Client` is not thread-safe (ZeroMQ sockets are not); give each thread its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
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
    """Autostart serves the common case: no endpoint given (so `$MEMD_ENDPOINT` or the runtime
    dir), unless MEMD_AUTOSTART is 0, no, false or off. A daemon at an endpoint named
    explicitly is someone else's to run."""
    switched_off = os.environ.get("MEMD_AUTOSTART", "1").strip().lower() in ("0", "no", "false", "off")
    return endpoint is None and not switched_off


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
        # Checked when (re)connecting only: a connected client pays nothing per call.
        if self.autostart and self.socket is None and not self._daemon_present():
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
        """Whether a daemon listens at the endpoint: checked before a call that may autostart.

        For ipc this is a connection attempt, because a socket file left behind by a crashed
        daemon refuses connections: its existence proves nothing. tcp endpoints are never
        autostarted, so they count as present.
        """
        return not daemon_absent(self.endpoint)

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
        """Journal records, oldest first (the newest `limit` that match): seq, time, profile,
        session, target, action, steps ({action, old?, new?}), usage, after (entries after the
        change), and where they apply backup, reason (drift) and undo_of."""
        return self.call(wire.History, target=target, since=since, session=session, limit=limit, profile=profile)

    def provenance(self, target: str = "memory", profile: str | None = None) -> list[dict[str, Any]]:
        """For each live entry: the seq, time, session and action that wrote it as it is."""
        return self.call(wire.Provenance, target=target, profile=profile)

    def undo(self, seq: int, *, dry_run: bool = False, name: str = "undo", profile: str | None = None) -> dict[str, Any]:
        """Revert journal record `seq` as a new change; refused with `conflict` when later
        changes make that unsafe, with `invalid` when the record changed no entries. Returns a
        memory reply carrying `target` and `undo_of`."""
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
    """Start memd for an ipc `endpoint` and wait until it accepts connections.

    When memd's systemd user unit is installed for this endpoint, the service manager is asked
    to start it: a daemon started beside it would hold the home and keep the service out.
    Otherwise `memd serve` is started detached (its own session, output to a log beside the
    socket). Clients may race here: the daemon's home lock lets one daemon serve and makes the
    others exit at once, so every racing client waits for whichever daemon won.
    """
    wait = max(timeout, 10.0)
    if _start_service(endpoint, wait):
        return
    argv = [*_memd_command(), "serve", "--endpoint", endpoint]
    log_path = Path(endpoint[len("ipc://"):]).with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # An agent run by systemd passes on its own service's variables; with them the daemon
    # would report readiness to the agent's service manager as if it were the agent.
    environment = {key: value for key, value in os.environ.items() if key not in _SERVICE_VARIABLES}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=environment,
            start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + wait
    no_winner_since: float | None = None
    while time.monotonic() < deadline:
        status = process.poll()
        if _listening(endpoint):
            # Settled once ours serves or has exited. One still starting would take the home
            # (and serve unseen) if the daemon now listening stopped: let it reach the lock first.
            if status is not None or (_home_holder() or {}).get("pid") == process.pid:
                return
        elif status is not None:
            holder = _home_holder()
            if holder is not None and holder.get("pid") != process.pid:
                if holder.get("endpoint") != endpoint:
                    raise DaemonUnavailable(
                        f"memd already runs for home {_default_home()} (pid {holder.get('pid')}) at "
                        f"{holder.get('endpoint')}, not at {endpoint}: set MEMD_ENDPOINT={holder.get('endpoint')}, "
                        "or stop that daemon"
                    )
                no_winner_since = None  # ours lost the race; the winner is still coming up
            elif no_winner_since is None:
                no_winner_since = time.monotonic()
            elif time.monotonic() - no_winner_since > 1.0:  # room for a winner to write down its pid
                raise DaemonUnavailable(
                    f"memd could not start (`{' '.join(argv)}` exited with status {status}):\n"
                    f"{_tail(log_path)}\n(log: {log_path})"
                )
        time.sleep(0.02)
    if _listening(endpoint):
        return
    raise DaemonUnavailable(
        f"started `{' '.join(argv)}`, but it did not accept connections within {wait:g}s; see {log_path}"
    )


_SERVICE_UNIT = "memd.service"
_SERVICE_VARIABLES = frozenset({
    "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
    "RUNTIME_DIRECTORY",
})


def daemon_absent(endpoint: str) -> bool:
    """True when no daemon can be at `endpoint`: an ipc socket that refuses connections, or
    none at all. A tcp endpoint can only be checked by asking, so it is never called absent."""
    return endpoint.startswith("ipc://") and not _listening(endpoint)


def _listening(endpoint: str) -> bool:
    """Whether a process accepts connections at an ipc endpoint right now."""
    if not hasattr(socket, "AF_UNIX"):
        return False
    path = endpoint[len("ipc://"):]
    # ZeroMQ spells Linux's abstract socket namespace with a leading '@'.
    address = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(address)
        except OSError:
            return False
    return True


def _start_service(endpoint: str, wait: float) -> bool:
    """Start memd's systemd user service if one is installed for this endpoint; True once it
    listens. False sends the caller to start memd itself (no unit, no systemctl, no user
    manager, or a service that would not start)."""
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "systemd" / "user"
    installed = (config / _SERVICE_UNIT).exists() or (config / "default.target.wants" / _SERVICE_UNIT).exists()
    service_endpoint = f"ipc://{wire.runtime_dir() / 'memd' / 'memd.sock'}"
    systemctl = shutil.which("systemctl")
    if not installed or endpoint != service_endpoint or systemctl is None:
        return False
    try:
        started = subprocess.run(
            [systemctl, "--user", "start", _SERVICE_UNIT], stdin=subprocess.DEVNULL,
            capture_output=True, timeout=wait,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return started.returncode == 0 and _listening(endpoint)


def _memd_command() -> list[str]:
    """The memd of this environment when the daemon package is importable here (so client
    and daemon match), else `memd` on PATH."""
    if importlib.util.find_spec("memd") is not None:
        return [sys.executable, "-m", "memd"]
    found = shutil.which("memd")
    if found is None:
        raise DaemonUnavailable(
            "memd is not running, and it is not installed here to be started: install it "
            "(pip install memd), or set MEMD_ENDPOINT to a running daemon"
        )
    return [found]


def _home_holder() -> dict[str, Any] | None:
    """The live daemon holding the memory home, as its lock file names it (pid, endpoint)."""
    try:
        holder = json.loads((_default_home() / "memd" / "daemon.lock").read_text(encoding="utf-8"))
        pid = int(holder["pid"])
        os.kill(pid, 0)
    except PermissionError:
        return holder  # alive, though not ours to signal
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return holder


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
