"""The memd wire protocol: the one definition, imported by the client and by the daemon.

Transport: the daemon binds a ZeroMQ ROUTER socket, clients connect DEALER sockets. A request is
one frame (an empty delimiter frame before it is tolerated): a msgpack map tagged by `op`. Every
reply is one `Reply` frame carrying the request's `id`. Change notifications are `Notification`
frames on a PUB socket. `clients/PROTOCOL.md` describes all of it in words.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

PROTOCOL_VERSION = 1
# Larger frames are refused by the socket itself (ZMQ_MAXMSGSIZE) and the peer is dropped.
MAX_FRAME_BYTES = 1024 * 1024
# Longest request id accepted; ids are echoed, so they are bounded like everything else.
MAX_ID_CHARS = 128


class Request(msgspec.Struct, tag_field="op", kw_only=True):
    """Fields every request carries."""

    v: int
    # Chosen by the client, unique per request; a retry re-sends the same id and is answered
    # from the daemon's reply cache instead of being applied again.
    id: str


class Hello(Request, tag="hello"):
    """Who is there: the daemon's version, home and notification endpoint."""


class Status(Request, tag="status"):
    profile: str | None = None


class Entries(Request, tag="entries"):
    """The live entries of a store, raw."""

    target: str
    profile: str | None = None


class Preview(Request, tag="preview"):
    """The snapshot a session opened now would get, without opening one."""

    profile: str | None = None


class OpenSession(Request, tag="open_session"):
    name: str
    profile: str | None = None


class Snapshot(Request, tag="snapshot"):
    session: str


class Memory(Request, tag="memory"):
    """A `memory` tool call; `args` are the model's tool arguments, passed through unchanged."""

    session: str
    args: dict[str, Any]


class NewTurn(Request, tag="new_turn"):
    session: str


class Refresh(Request, tag="refresh"):
    session: str


class CloseSession(Request, tag="close_session"):
    session: str


class History(Request, tag="history"):
    """Journal records, oldest first: the newest `limit` of those matching the filters."""

    target: str | None = None
    since: float | None = None
    session: str | None = None  # a session *name*, e.g. "cli"
    limit: int = 200
    profile: str | None = None


class Provenance(Request, tag="provenance"):
    target: str
    profile: str | None = None


class Undo(Request, tag="undo"):
    """Apply the inverse of journal record `seq`; `name` is recorded as the session that did it."""

    seq: int
    dry_run: bool = False
    name: str = "undo"
    profile: str | None = None


class Restore(Request, tag="restore"):
    """Bring a store back to its state at Unix time `at`."""

    target: str
    at: float
    dry_run: bool = False
    name: str = "restore"
    profile: str | None = None


AnyRequest = (
    Hello | Status | Entries | Preview | OpenSession | Snapshot | Memory | NewTurn | Refresh
    | CloseSession | History | Provenance | Undo | Restore
)


class Envelope(msgspec.Struct):
    """The least a frame must hold to be answered at all; used when a full decode fails."""

    id: str = ""
    v: int = PROTOCOL_VERSION


class Failure(msgspec.Struct):
    """Why a request could not be served. `code` is `invalid` for anything malformed, unknown,
    oversized or of another protocol version."""

    code: str
    message: str


class Reply(msgspec.Struct, kw_only=True):
    v: int = PROTOCOL_VERSION
    id: str
    ok: bool
    result: Any = None
    error: Failure | None = None


class Notification(msgspec.Struct, kw_only=True):
    """Published on every change: `store_changed`, `drift_detected`, `drift_resolved`,
    `unreadable`. `seq` grows by one per notification for the daemon's lifetime."""

    seq: int
    kind: str
    profile: str | None
    target: str
    usage: str
    session: str | None = None
    backup: str | None = None
    reason: str | None = None
    time: float = 0.0


request_decoder = msgspec.msgpack.Decoder(AnyRequest)
envelope_decoder = msgspec.msgpack.Decoder(Envelope)
reply_decoder = msgspec.msgpack.Decoder(Reply)
notification_decoder = msgspec.msgpack.Decoder(Notification)
encoder = msgspec.msgpack.Encoder()


def runtime_dir() -> Path:
    """The per-user runtime directory, chosen as platformdirs does, without depending on it:
    `$XDG_RUNTIME_DIR`, else `/run/user/<uid>` when it exists, else `<tmp>/runtime-<uid>`."""
    configured = os.environ.get("XDG_RUNTIME_DIR")
    if configured:
        return Path(configured)
    uid = os.getuid()
    systemd_dir = Path(f"/run/user/{uid}")
    if systemd_dir.is_dir():
        return systemd_dir
    return Path(tempfile.gettempdir()) / f"runtime-{uid}"


DEFAULT_TCP_ENDPOINT = "tcp://127.0.0.1:5557"


def default_endpoint() -> str:
    """`$MEMD_ENDPOINT`, else the ipc socket in the runtime directory (tcp on Windows, where
    pyzmq has no ipc transport)."""
    configured = os.environ.get("MEMD_ENDPOINT")
    if configured:
        return configured
    if sys.platform == "win32":
        return DEFAULT_TCP_ENDPOINT
    return f"ipc://{runtime_dir() / 'memd' / 'memd.sock'}"


def publish_endpoint(endpoint: str) -> str:
    """Where notifications are published for a request endpoint: beside the socket for ipc,
    the next port for tcp."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        stem = path[:-len(".sock")] if path.endswith(".sock") else path
        return f"ipc://{stem}.pub.sock"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        if port.isdigit():
            return f"tcp://{host}:{int(port) + 1}"
    raise ValueError(f"cannot derive a notification endpoint from {endpoint!r}: use ipc:// or tcp://HOST:PORT")


def curve_dir_for(home: Path) -> Path:
    """Where a daemon serving tcp keeps its CURVE keys: `server.key` (public),
    `client.key_secret` (the client pair), `authorized/` (public keys allowed in)."""
    return home / "memd" / "curve"
