"""The daemon: a ZeroMQ ROUTER loop in front of one engine per profile.

One thread owns everything. Each wake-up drains what has arrived, answers it in arrival order and
commits consecutive memory writes together — one durable write per store for the whole group —
before any of their replies is sent (group commit). The watch and the periodic rescan feed
external changes into the same loop, so nothing races the writer.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

from memd import __version__
from memd.config import ConfigError, Settings, load_settings, profile_home, profile_name
from memd.core.store import TARGETS
from memd.daemon_lock import AlreadyRunning, DaemonLock
from memd.disk import DurabilityError, raise_descriptor_limit
from memd.engine import Engine, Event, Session
from memd.keys import CurveKeys
from memd.systemd import Notifier
from memd.watch import StoreWatch, WatchError, make_watch
from memd_client import protocol as wire

log = logging.getLogger("memd.server")

# Frames up to this size are read and answered (with `invalid` when over MAX_FRAME_BYTES);
# larger ones make ZeroMQ drop the peer, so no client can make the daemon buffer without bound.
HARD_FRAME_LIMIT = 16 * wire.MAX_FRAME_BYTES
DRAIN_LIMIT = 512  # requests taken per wake-up, so a flood cannot starve the watch or signals
REPLY_CACHE_SIZE = 8192
# ...and at most this many bytes of them: one reply can be large (the entries of a huge drifted
# store), and a client must not be able to make the daemon hold thousands of those.
REPLY_CACHE_BYTES = 16 * 1024 * 1024
# Refusals quote what they refuse; a quote of a megabyte of client text helps nobody.
MAX_MESSAGE_CHARS = 2000
MAX_SESSIONS_PER_PROFILE = 10_000
# Each profile served costs an engine and a directory watch, kept for the daemon's life, so
# requests naming more profiles than a person has are refused rather than allowed to add up.
MAX_PROFILES = 64
# Plain ints: pyzmq's enum flags are converted on every call, a few µs per request in all.
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class Refused(Exception):
    """A request that cannot be served; the message is sent back with its code."""

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Pending:
    """A memory call waiting for the group commit."""

    request_id: str
    peers: list[bytes]
    session: Session
    args: dict[str, Any]


@dataclass(slots=True)
class Stats:
    started: float = field(default_factory=time.time)
    requests: int = 0
    commits: int = 0
    committed_calls: int = 0
    invalid: int = 0


class Daemon:
    def __init__(self, settings: Settings, endpoint: str) -> None:
        self.settings = settings
        self.home = settings.home
        self.endpoint = endpoint
        self.publish_endpoint = wire.publish_endpoint(endpoint)
        self.engines: dict[str | None, Engine] = {}
        self.reply_cache: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self.reply_cache_bytes = 0
        self.seq = 0
        self.unsent: list[wire.Notification] = []  # see `_publish`
        self.stats = Stats()
        self.stopping = False
        self.notifier = Notifier()
        self.context = zmq.Context()
        self.router: zmq.Socket | None = None
        self.publisher: zmq.Socket | None = None
        self.watch: StoreWatch | None = None
        self.lock = DaemonLock(self.home)
        self.keys: CurveKeys | None = None

    # -- start and stop ---------------------------------------------------------------------

    def start(self) -> None:
        """Take the home, load the stores, bind; raises with a clear message when it cannot."""
        self.lock.acquire(self.endpoint)  # before the endpoint is touched: never steal a socket
        self.watch = make_watch()
        self.engine_for(None)
        self._bind()
        self.watch.start()
        log.info("memd %s serving home %s at %s (pid %d)", __version__, self.home, self.endpoint, os.getpid())

    def _secure(self, socket: zmq.Socket) -> None:
        if self.keys is not None:
            self.keys.serve(socket)

    def _bind(self) -> None:
        if self.endpoint.startswith("tcp://"):
            # A tcp endpoint is reachable by other users and hosts: CURVE is not optional.
            self.keys = CurveKeys.ensure(self.home)
            self.keys.start_authenticator(self.context)
        elif self.endpoint.startswith("ipc://"):
            prepare_ipc_path(self.endpoint, self.context)
            prepare_ipc_path(self.publish_endpoint, self.context)
        else:
            raise Refused(f"unsupported endpoint {self.endpoint!r}: use ipc://PATH or tcp://HOST:PORT")
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.MAXMSGSIZE, HARD_FRAME_LIMIT)
        router.setsockopt(zmq.LINGER, 1000)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._secure(router)
        publisher = self.context.socket(zmq.PUB)
        publisher.setsockopt(zmq.LINGER, 0)
        self._secure(publisher)
        old_umask = os.umask(0o177)  # the ipc socket files are created owner-only: 0600
        try:
            router.bind(self.endpoint)
            publisher.bind(self.publish_endpoint)
        finally:
            os.umask(old_umask)
        for endpoint in (self.endpoint, self.publish_endpoint):
            if endpoint.startswith("ipc://"):
                os.chmod(endpoint[len("ipc://"):], 0o600)
        self.router, self.publisher = router, publisher

    def install_signal_handlers(self) -> None:
        def request_stop(signum: int, _frame: Any) -> None:
            log.info("received %s; finishing in-flight work", signal.Signals(signum).name)
            self.stopping = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

    def close(self) -> None:
        self.notifier.stopping()
        if self.watch is not None:
            self.watch.stop()
        for engine in self.engines.values():
            engine.close()
        for sock in (self.router, self.publisher):
            if sock is not None:
                sock.close()
        if self.keys is not None:
            self.keys.stop_authenticator()
        self.context.term()
        for endpoint in (self.endpoint, self.publish_endpoint):
            if endpoint.startswith("ipc://"):
                try:
                    os.unlink(endpoint[len("ipc://"):])
                except OSError:
                    pass
        self.lock.release()

    # -- the loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        assert self.router is not None and self.watch is not None
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.watch.wake_fd, zmq.POLLIN)
        self.notifier.ready(self.status_line())
        next_rescan = time.monotonic() + self.settings.rescan_seconds
        next_ping = time.monotonic()
        # Idle sessions are looked for often enough that one never outlives its idle time by
        # much more than half of it (and at least once a minute).
        expiry_interval = min(60.0, self.settings.session_idle_seconds / 2)
        next_expiry = time.monotonic() + expiry_interval
        while not self.stopping:
            now = time.monotonic()
            wake = min(next_rescan, next_ping if self.notifier.watchdog_interval else next_rescan)
            ready = dict(poller.poll(timeout=max(0.0, min(wake - now, 0.2)) * 1000))
            # Requests first: the events of the writes just made are read after their replies.
            if self.router in ready:
                self._serve_ready()
                for engine in self.engines.values():
                    engine.retire_displaced()
            if self.watch.wake_fd in ready:
                self._check_changed(self.watch.drain())
            now = time.monotonic()
            if now >= next_rescan:
                self.watch.revive()
                self._check_changed({(key, target) for key in self.engines for target in TARGETS})
                next_rescan = now + self.settings.rescan_seconds
            if self.notifier.watchdog_interval and now >= next_ping:
                self.notifier.watchdog()
                self.notifier.status(self.status_line())
                next_ping = now + self.notifier.watchdog_interval
            if now >= next_expiry:
                self._expire_sessions()
                next_expiry = now + expiry_interval
        self._serve_ready()  # what had already arrived when the stop came is still answered

    def _serve_ready(self) -> None:
        assert self.router is not None
        batch: list[list[bytes]] = []
        # Asking whether a message waits is cheaper than the exception an empty receive raises.
        while len(batch) < DRAIN_LIMIT and self.router.getsockopt(_EVENTS) & _POLLIN:
            batch.append(self.router.recv_multipart(_NOBLOCK))
        if batch:
            try:
                self.handle_batch(batch)
            finally:  # a write that fails durably stops the daemon; those before it still notify
                self._publish()

    def _check_changed(self, changed: set[tuple[str | None, str]]) -> None:
        try:
            for key, target in sorted(changed, key=lambda item: (item[0] or "", item[1])):
                engine = self.engines.get(key)
                if engine is not None:
                    engine.check_external([target])
        finally:
            self._publish()

    def _expire_sessions(self) -> None:
        for engine in self.engines.values():
            expired = engine.expire_sessions()
            if expired:
                log.info("closed %d idle session(s) of %s", expired, engine.home)

    # -- requests ---------------------------------------------------------------------------

    def handle_batch(self, frames: Sequence[list[bytes]]) -> None:
        """Answer a drained batch in order; consecutive memory calls share one commit."""
        group: list[Pending] = []
        for message in frames:
            self.stats.requests += 1
            peer, payload = message[0], message[1:]
            try:
                request = self.decode(payload)
            except Refused as problem:
                self.stats.invalid += 1
                self.send(peer, self.failure_reply(self._salvage_id(payload), problem))
                continue
            cached = self.reply_cache.get(request.id)
            if cached is not None:
                self.send(peer, cached)  # a retry: answer again, never apply twice
                continue
            joined = next((item for item in group if item.request_id == request.id), None)
            if joined is not None:
                joined.peers.append(peer)
                continue
            if isinstance(request, wire.Memory):
                try:
                    session = self.session_for(request.session)
                except Refused as problem:
                    self.answer([peer], request.id, self.failure_reply(request.id, problem))
                    continue
                group.append(Pending(request.id, [peer], session, request.args))
                continue
            self.commit(group)
            group = []
            self.answer([peer], request.id, self.dispatch(request))
        self.commit(group)

    def commit(self, group: list[Pending]) -> None:
        """Apply a group of memory calls, one durable write per store, then reply to each."""
        if not group:
            return
        by_engine: dict[int, list[Pending]] = {}
        for item in group:
            by_engine.setdefault(id(item.session.engine), []).append(item)
        replies: dict[int, dict[str, Any]] = {}
        for items in by_engine.values():
            engine = items[0].session.engine
            results = engine.execute_many([(item.session, item.args) for item in items])
            for item, result in zip(items, results):
                replies[id(item)] = result
        self.stats.commits += 1
        self.stats.committed_calls += len(group)
        for item in group:
            self.answer(item.peers, item.request_id, self.ok_reply(item.request_id, replies[id(item)]))

    def decode(self, payload: Sequence[bytes]) -> wire.AnyRequest:
        # A REQ-style client puts an empty delimiter frame first; tolerate it.
        frames = [frame for frame in payload if frame] if len(payload) > 1 else list(payload)
        if len(frames) != 1:
            raise Refused(f"expected one request frame, got {len(frames)}")
        frame = frames[0]
        if len(frame) > wire.MAX_FRAME_BYTES:
            raise Refused(f"request of {len(frame):,} bytes is larger than the {wire.MAX_FRAME_BYTES:,} allowed")
        try:
            request = wire.request_decoder.decode(frame)
        except msgspec.DecodeError as error:
            version = _salvage_version(frame)
            if version is not None and version != wire.PROTOCOL_VERSION:
                raise Refused(_version_message(version)) from None
            raise Refused(f"malformed request: {error}") from None
        except RecursionError:
            raise Refused("malformed request: nested too deeply") from None
        if request.v != wire.PROTOCOL_VERSION:
            raise Refused(_version_message(request.v))
        if not request.id or len(request.id) > wire.MAX_ID_CHARS:
            raise Refused(f"request id must be 1 to {wire.MAX_ID_CHARS} characters")
        return request

    @staticmethod
    def _salvage_id(payload: Sequence[bytes]) -> str:
        """The request id of an undecodable frame, if it has one, so the client can match."""
        try:
            request_id = wire.envelope_decoder.decode(payload[-1]).id
        except (msgspec.DecodeError, RecursionError, IndexError):
            return ""
        return request_id if len(request_id) <= wire.MAX_ID_CHARS else ""

    def dispatch(self, request: wire.AnyRequest) -> bytes:
        try:
            return self.ok_reply(request.id, self.result_of(request))
        except Refused as problem:
            return self.failure_reply(request.id, problem)

    def result_of(self, request: wire.AnyRequest) -> Any:
        match request:
            case wire.Hello():
                return self.hello()
            case wire.Status(profile=profile):
                return self.status(profile)
            case wire.Entries(target=target, profile=profile):
                engine = self.engine_for(profile)
                check_target(target)
                return {"target": target, "entries": engine.entries(target), "usage": engine.stores[target].usage}
            case wire.Preview(profile=profile):
                return snapshot_result(self.engine_for(profile).render_snapshot())
            case wire.OpenSession(name=name, profile=profile):
                return self.open_session(name, profile)
            case wire.Snapshot(session=session_id):
                return snapshot_result(self.session_for(session_id).snapshot)
            case wire.NewTurn(session=session_id):
                session = self.session_for(session_id)
                session.new_turn()
                return {"turn": session.turn}
            case wire.Refresh(session=session_id):
                return snapshot_result(self.session_for(session_id).refresh())
            case wire.CloseSession(session=session_id):
                self.session_for(session_id).close()
                return {"closed": True}
            case wire.History(target=target, since=since, session=name, limit=limit, profile=profile):
                if target is not None:
                    check_target(target)
                if limit < 1:
                    raise Refused("limit must be at least 1")
                return self.engine_for(profile).history(target, since=since, session=name, limit=limit)
            case wire.Provenance(target=target, profile=profile):
                return self.engine_for(profile).provenance(check_target(target))
            case wire.Undo(seq=seq, dry_run=dry_run, name=name, profile=profile):
                return self.engine_for(profile).undo(seq, name=check_name(name), dry_run=dry_run)
            case wire.Restore(target=target, at=at, dry_run=dry_run, name=name, profile=profile):
                return self.engine_for(profile).restore(
                    check_target(target), at, name=check_name(name), dry_run=dry_run)
        raise Refused(f"unsupported request {type(request).__name__}")

    def answer(self, peers: list[bytes], request_id: str, reply: bytes) -> None:
        self.reply_cache_bytes += len(reply) - len(self.reply_cache.pop(request_id, b""))
        self.reply_cache[request_id] = reply
        while len(self.reply_cache) > REPLY_CACHE_SIZE or self.reply_cache_bytes > REPLY_CACHE_BYTES:
            self.reply_cache_bytes -= len(self.reply_cache.popitem(last=False)[1])
        for peer in peers:
            self.send(peer, reply)

    def send(self, peer: bytes, reply: bytes) -> None:
        assert self.router is not None
        try:
            self.router.send_multipart([peer, reply], _NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer has gone or is not reading; a retry will be served from the cache

    @staticmethod
    def ok_reply(request_id: str, result: Any) -> bytes:
        return wire.encoder.encode(wire.Reply(id=request_id, ok=True, result=result))

    @staticmethod
    def failure_reply(request_id: str, problem: Refused) -> bytes:
        message = str(problem)
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + f"… [{len(message) - MAX_MESSAGE_CHARS:,} more characters cut]"
        failure = wire.Failure(code=problem.code, message=message)
        return wire.encoder.encode(wire.Reply(id=request_id, ok=False, error=failure))

    # -- engines and sessions ---------------------------------------------------------------

    def engine_for(self, requested: str | None) -> Engine:
        try:
            profile = profile_name(requested)  # "Work" and "work" are one profile, as in Hermes
        except ConfigError as error:
            raise Refused(str(error)) from None
        engine = self.engines.get(profile)
        if engine is not None:
            return engine
        if len(self.engines) >= MAX_PROFILES:
            raise Refused(
                f"profile {profile!r}: this daemon already serves {MAX_PROFILES} profiles, the most it "
                "will; check the profile name"
            )
        try:
            home = profile_home(self.home, profile)
        except ConfigError as error:
            raise Refused(str(error)) from None
        try:
            settings = self.settings if profile is None else load_settings(home)
            engine = Engine(home, settings, listener=self._publisher_for(profile), profile=profile)
        except ConfigError as error:
            raise Refused(f"profile {profile!r}: {error}") from None
        except OSError as error:
            raise Refused(f"profile {profile!r} cannot be opened: {error}") from None
        self.engines[profile] = engine
        if self.watch is not None:
            self.watch.add(profile, engine.memory_dir)
        return engine

    def open_session(self, name: str, profile: str | None) -> dict[str, Any]:
        check_name(name)
        engine = self.engine_for(profile)
        if len(engine.sessions) >= MAX_SESSIONS_PER_PROFILE:
            oldest = min(engine.sessions.values(), key=lambda session: session.last_used)
            oldest.close()
        session = engine.open_session(name)
        return {"session": session.id, "snapshot": snapshot_result(session.snapshot)}

    def session_for(self, session_id: str) -> Session:
        for engine in self.engines.values():
            session = engine.sessions.get(session_id)
            if session is not None:
                session.last_used = engine.clock()
                return session
        raise Refused(
            f"no open session {session_id!r}: it was closed, expired after being idle, or the "
            "daemon restarted; open a new session",
            code="no_session",
        )

    # -- notifications and status ---------------------------------------------------------

    def _publisher_for(self, profile: str | None) -> Callable[[Sequence[Event]], None]:
        def publish(events: Sequence[Event]) -> None:
            for event in events:
                self.seq += 1
                note = wire.Notification(
                    seq=self.seq, kind=event.kind, profile=profile, target=event.target,
                    usage=event.usage, session=event.session, backup=event.backup,
                    reason=event.reason, time=event.time,
                )
                if event.kind != "store_changed":
                    log.warning("%s %s: %s", event.kind, event.target, event.reason or event.backup or "")
                if self.publisher is not None:
                    self.unsent.append(note)
        return publish

    def _publish(self) -> None:
        """Send the notifications of what the loop just did. They go out after the replies: a
        writer waits on its reply, and publishing first added 25 µs to it (a PUB send wakes
        ZeroMQ's I/O thread too). PUB/SUB orders nothing against replies anyway."""
        if self.unsent:
            assert self.publisher is not None
            for note in self.unsent:
                self.publisher.send(wire.encoder.encode(note))
            self.unsent.clear()

    def hello(self) -> dict[str, Any]:
        return {
            "server": "memd", "version": __version__, "protocol": wire.PROTOCOL_VERSION,
            "home": str(self.home), "endpoint": self.endpoint, "publish": self.publish_endpoint,
            "pid": os.getpid(),
        }

    def status(self, profile: str | None) -> dict[str, Any]:
        engine = self.engine_for(profile)
        status = engine.status()
        status.update(
            self.hello(),
            profile=engine.profile,
            uptime=time.time() - self.stats.started,
            sessions_all_profiles=sum(len(item.sessions) for item in self.engines.values()),
            requests=self.stats.requests,
            invalid_requests=self.stats.invalid,
            commits=self.stats.commits,
            committed_calls=self.stats.committed_calls,
            notifications=self.seq,
            profiles=sorted(key or "" for key in self.engines),
        )
        return status

    def status_line(self) -> str:
        sessions = sum(len(engine.sessions) for engine in self.engines.values())
        return f"serving {self.home} at {self.endpoint}: {sessions} session(s), {self.stats.requests} request(s)"


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise Refused(f"unknown target {target!r}: use 'memory' or 'user'")
    return target


def check_name(name: str) -> str:
    """A session name (also the one undo and restore record): it is shown in logs and history."""
    if not name or len(name) > 200:
        raise Refused("a session name must be 1 to 200 characters, e.g. 'cli' or 'gateway:telegram'")
    return name


def _version_message(version: object) -> str:
    return (
        f"protocol version {version} is not supported; this daemon speaks version "
        f"{wire.PROTOCOL_VERSION} (upgrade the client or the daemon)"
    )


def _salvage_version(frame: bytes) -> int | None:
    try:
        return wire.envelope_decoder.decode(frame).v
    except (msgspec.DecodeError, RecursionError):
        return None


def snapshot_result(snapshot: Any) -> dict[str, str | None]:
    return {"memory": snapshot.memory, "user": snapshot.user}


def prepare_ipc_path(endpoint: str, context: zmq.Context) -> None:
    """Make the socket's directory owner-only, and clear a stale socket left by a crash.

    A socket file that still answers belongs to a live daemon (of another home): refuse rather
    than steal it.
    """
    path = Path(endpoint[len("ipc://"):])
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.parent.stat().st_uid == os.getuid():
        os.chmod(path.parent, 0o700)
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise Refused(f"{path} exists and is not a socket; remove it or choose another endpoint")
    if endpoint_answers(endpoint, context):
        raise Refused(f"another process is already serving {endpoint}; stop it or choose another endpoint")
    path.unlink()


def endpoint_answers(endpoint: str, context: zmq.Context, timeout: float = 0.5) -> bool:
    probe = context.socket(zmq.DEALER)
    probe.setsockopt(zmq.LINGER, 0)
    try:
        probe.connect(endpoint)
        probe.send(wire.encoder.encode(wire.Hello(v=wire.PROTOCOL_VERSION, id="probe")))
        return bool(probe.poll(int(timeout * 1000)))
    finally:
        probe.close()


# Descriptors the daemon asks for: each client connection holds one, each engine up to an eighth of the
# limit for the store versions a burst of writes swaps out, and running out fails a write's durability,
# which stops the daemon. The usual soft limit of 1,024 leaves a busy daemon little.
DESCRIPTORS_WANTED = 65_536


def serve(settings: Settings, endpoint: str) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT. Returns the exit status."""
    refused = raise_descriptor_limit(DESCRIPTORS_WANTED)
    if refused is not None:
        log.info("could not raise the open-file limit to %d: %s", DESCRIPTORS_WANTED, refused)
    daemon = Daemon(settings, endpoint)
    try:
        daemon.start()
    except (AlreadyRunning, Refused, ConfigError, WatchError, OSError, zmq.ZMQError) as error:
        if isinstance(error, AlreadyRunning):
            # No fault: clients that autostart at the same time race, and all but one lose.
            log.warning("memd not started: %s", error)
        else:
            log.error("memd cannot start: %s", error)
        daemon.lock.release()
        return 1
    daemon.install_signal_handlers()
    try:
        daemon.serve_forever()
    except DurabilityError as error:
        # Acknowledging anything more would be a lie: stop at once, let the supervisor restart us.
        log.critical("stopping: %s", error)
        daemon.close()
        return 1
    daemon.close()
    log.info("memd stopped")
    return 0
