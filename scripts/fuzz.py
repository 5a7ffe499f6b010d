#!/usr/bin/env python3
"""Throw malformed and hostile frames at the daemon, interleaved with valid requests.

    python scripts/fuzz.py --frames 100000

Hostile traffic, over raw pyzmq DEALER sockets: random bytes, truncated msgpack, oversized frames
(over the 1 MiB request limit, and over the 16 MiB socket limit), wrong types, huge strings, deep
nesting, unknown operations, other protocol versions, bad request ids, replayed request ids (same
frame, and same id with other content), multi-frame messages, empty frames, and abrupt disconnects
(a DEALER that sends and closes without reading). After every burst a valid request is sent and
its answer checked exactly; the fuzzer is the only writer of the store, so `entries` must match
its own model. Every hostile frame on the main socket must get exactly one well-formed reply.
At the end the daemon must be the same process and answer `hello`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
from harness_common import Deadline, Report, log_problems, process_alive, rss_kb, running_daemon

from memd.server import MAX_PROFILES

from memd_client import protocol as wire

HARD_FRAME_LIMIT = 16 * wire.MAX_FRAME_BYTES  # the daemon's ZMQ_MAXMSGSIZE
KEEP_LIVE = 8  # the fuzzer's own entries kept in the store
# The daemon's caches are bounded (16 MiB of cached replies, a few engines); hostile traffic may
# fill them, not grow the process beyond.
RSS_GROWTH_LIMIT_KB = 48 * 1024
encode = msgspec.msgpack.encode
Check = Callable[[wire.Reply, bytes], str | None]


def expect_invalid(reply: wire.Reply, _raw: bytes) -> str | None:
    if reply.ok or reply.error is None or reply.error.code != "invalid":
        return f"expected an `invalid` refusal, got {reply}"
    return None


def expect_any(_reply: wire.Reply, _raw: bytes) -> str | None:
    return None


def expect_refused(reply: wire.Reply, _raw: bytes) -> str | None:
    """Refused (any code), or a memory reply that did not succeed."""
    if reply.ok and not (isinstance(reply.result, dict) and reply.result.get("success") is False):
        return f"expected a refusal, got {str(reply)[:300]}"
    return None


def expect_bytes(original: bytes) -> Check:
    def check(_reply: wire.Reply, raw: bytes) -> str | None:
        return None if raw == original else "a replayed request id was not answered from the cache"
    return check


@dataclass
class Hostile:
    """A hostile message, the ids its reply may carry (None: no reply), and its check."""

    category: str
    frames: list[bytes]
    reply_ids: set[str] | None
    check: Check = expect_invalid


def salvage_id(frame: bytes) -> str:
    """The request id the daemon can read from a frame it cannot decode ("" when none)."""
    try:
        return wire.envelope_decoder.decode(frame).id
    except (msgspec.DecodeError, RecursionError):
        return ""


def raw_map(pairs: list[tuple[str, bytes]]) -> bytes:
    """A msgpack map from keys and already-encoded values (to splice in hostile values)."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(encode(key) + value for key, value in pairs)


class Fuzzer:
    def __init__(self, endpoint: str, rng: random.Random, report: Report, alive: Callable[[], bool]) -> None:
        self.endpoint = endpoint
        self.alive = alive
        self.rng = rng
        self.report = report
        self.context = zmq.Context()
        self.main = self._socket()
        self.serial = 0
        self.live: list[str] = []  # the fuzzer's entries, in store order
        self.ever_added: set[str] = set()
        self.history: deque[tuple[str, bytes, bytes]] = deque(maxlen=300)  # (id, frame, reply)
        self.session = ""
        self.scratch_session = ""  # target of hostile-but-well-formed memory calls
        self.counts: dict[str, int] = {}
        self.frames_sent = 0
        self.valid_sent = 0
        self.wrong = 0
        self.hostile_replies = 0

    def _socket(self) -> zmq.Socket:
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.endpoint)
        return socket

    def close(self) -> None:
        self.main.close(linger=0)
        self.context.term()

    def new_id(self, kind: str = "h") -> str:
        self.serial += 1
        return f"{kind}-{self.serial}"

    def request(self, request_type: type[wire.Request], **fields: Any) -> bytes:
        return encode(request_type(v=wire.PROTOCOL_VERSION, id=self.new_id(), **fields))

    # -- valid requests, answered exactly ---------------------------------------------------

    def valid(self, hostile: list[Hostile], timeout: float = 20.0) -> None:
        """Send `hostile` then one valid request; check its answer and account for every reply."""
        pending: list[Hostile] = []
        for item in hostile:
            self.main.send_multipart(item.frames)
            self.frames_sent += len(item.frames)
            if item.reply_ids is not None:
                pending.append(item)
        kind, request, check = self.pick_valid()
        frame = encode(request)
        self.main.send(frame)
        self.valid_sent += 1
        deadline = Deadline(timeout)
        answers: list[tuple[wire.Reply, bytes]] = []
        while True:
            if not self.main.poll(int(deadline.remaining * 1000) + 1):
                if not self.alive():
                    raise RuntimeError(f"the daemon died; last hostile messages: {[item.category for item in hostile]}")
                self.wrong += 1
                self.report.violation(f"no answer to valid {kind} within {timeout:g}s")
                self.main.close(linger=0)
                self.main = self._socket()
                return
            raw = self.main.recv()
            try:
                reply = wire.reply_decoder.decode(raw)
            except msgspec.DecodeError as error:
                self.report.violation(f"a reply does not decode: {error}: {raw[:100]!r}")
                continue
            if reply.id == request.id:
                break
            answers.append((reply, raw))
        self.account(pending, answers)
        problem = check(reply)
        if problem:
            self.wrong += 1
            self.report.violation(f"valid {kind}: {problem}")
        else:
            self.history.append((request.id, frame, raw))

    def account(self, pending: list[Hostile], answers: list[tuple[wire.Reply, bytes]]) -> None:
        """Match each hostile message with exactly one reply: by id first, then replies that
        carry no id (the daemon could not read one) in order."""
        unmatched = []
        for reply, raw in sorted(answers, key=lambda answer: answer[0].id == ""):
            item = next((item for item in pending if reply.id in (item.reply_ids or ())), None)
            if item is None:
                unmatched.append(reply)
                continue
            pending.remove(item)
            self.hostile_replies += 1
            problem = item.check(reply, raw)
            if problem:
                self.report.violation(f"{item.category}: {problem}")
        for reply in unmatched:
            self.report.violation(f"unexpected reply {str(reply)[:200]}")
        for item in pending:
            self.report.violation(f"{item.category}: no reply to a hostile frame {item.frames[0][:60]!r}")

    def pick_valid(self) -> tuple[str, wire.Request, Callable[[wire.Reply], str | None]]:
        roll = self.rng.random()
        rid = self.new_id("v")
        version = wire.PROTOCOL_VERSION
        if roll < 0.15:
            return "hello", wire.Hello(v=version, id=rid), self.check_hello
        if roll < 0.25:
            return "status", wire.Status(v=version, id=rid), self.check_hello
        if roll < 0.45:
            return "entries", wire.Entries(v=version, id=rid, target="memory"), self.check_entries
        if roll < 0.55:
            return "open_session", wire.OpenSession(v=version, id=rid, name="fuzz-valid"), self.check_open
        if roll < 0.6:
            return "unknown session", wire.Snapshot(v=version, id=rid, session="no-such-session"), self.check_no_session
        if roll < 0.65:
            return "bad target", wire.Entries(v=version, id=rid, target="bogus"), self.check_invalid
        if len(self.live) > KEEP_LIVE:
            old = self.live[0]
            args = {"action": "remove", "target": "memory", "old_text": old}
            return "remove", wire.Memory(v=version, id=rid, session=self.session, args=args), self.check_write(old, removed=True)
        new = f"fz-{self.serial} fuzzed but fine"
        args = {"action": "add", "target": "memory", "content": new}
        return "add", wire.Memory(v=version, id=rid, session=self.session, args=args), self.check_write(new, removed=False)

    def check_hello(self, reply: wire.Reply) -> str | None:
        if not reply.ok or reply.result.get("pid") != self.pid or reply.result.get("server") != "memd":
            return f"expected this daemon's hello/status, got {str(reply)[:300]}"
        return None

    def check_entries(self, reply: wire.Reply) -> str | None:
        if not reply.ok or reply.result.get("entries") != self.live:
            return f"entries {reply.result if reply.ok else reply.error}, expected {self.live}"
        return None

    def check_open(self, reply: wire.Reply) -> str | None:
        if not reply.ok or not reply.result.get("session"):
            return f"open_session answered {reply}"
        return None

    def check_no_session(self, reply: wire.Reply) -> str | None:
        if reply.ok or reply.error is None or reply.error.code != "no_session":
            return f"expected no_session, got {reply}"
        return None

    def check_invalid(self, reply: wire.Reply) -> str | None:
        return expect_invalid(reply, b"")

    def check_write(self, entry: str, removed: bool) -> Callable[[wire.Reply], str | None]:
        def check(reply: wire.Reply) -> str | None:
            if not reply.ok or reply.result.get("code") != "ok":
                return f"{'remove' if removed else 'add'} of {entry!r} answered {str(reply)[:300]}"
            if removed:
                self.live.remove(entry)
            else:
                self.live.append(entry)
                self.ever_added.add(entry)
            return None
        return check

    # -- hostile messages --------------------------------------------------------------------

    def hostile(self) -> Hostile:
        generators = (
            (self.random_bytes, 14), (self.truncated, 14), (self.wrong_types, 14), (self.unknown_op, 8),
            (self.bad_version, 5), (self.bad_id, 5), (self.huge_strings, 4), (self.deep_nesting, 5),
            (self.replay, 10), (self.multi_frame, 10), (self.empty_frame, 3), (self.soft_oversize, 0.3),
            (self.not_a_map, 7.7), (self.made_up_profile, 1),
        )
        generate = self.rng.choices([g for g, _ in generators], [w for _, w in generators])[0]
        item = generate()
        self.counts[item.category] = self.counts.get(item.category, 0) + 1
        return item

    def any_request_fields(self) -> tuple[str, dict[str, Any]]:
        op = self.rng.choice(("hello", "status", "entries", "preview", "open_session", "snapshot", "memory", "new_turn", "refresh", "close_session"))
        fields: dict[str, Any] = {"op": op, "v": wire.PROTOCOL_VERSION, "id": self.new_id()}
        if op == "entries":
            fields["target"] = "memory"
        if op == "open_session":
            fields["name"] = "fuzz"
        if op in ("snapshot", "memory", "new_turn", "refresh", "close_session"):
            fields["session"] = "no-such-session"
        if op == "memory":
            fields["args"] = {"action": "add", "content": "never written"}
        return op, fields

    def random_bytes(self) -> Hostile:
        size = self.rng.choice((1, 2, 5, 17, 100, 1000, 4000))
        return Hostile("random bytes", [self.rng.randbytes(size)], {""})

    def truncated(self) -> Hostile:
        _, fields = self.any_request_fields()
        frame = encode(fields)
        return Hostile("truncated msgpack", [frame[: self.rng.randrange(1, len(frame))]], {""})

    def wrong_types(self) -> Hostile:
        op, fields = self.any_request_fields()
        key = self.rng.choice([key for key in fields if key != "op"] + ["args"] * (op == "memory"))
        bad = self.rng.choice((7, -1, 2**63, 1.5, True, [1, 2], {"x": 1}, b"\x00\xff", "", "x" * 300))
        if key == "args" and isinstance(bad, dict):
            bad = [bad]
        fields[key] = bad
        ids = {"", fields["id"]} if isinstance(fields["id"], str) else {""}
        return Hostile("wrong types", [encode(fields)], ids, expect_any if key in ("name", "session") and isinstance(bad, str) else expect_invalid)

    def unknown_op(self) -> Hostile:
        _, fields = self.any_request_fields()
        fields["op"] = self.rng.choice(("drop", "shutdown", "exec", "", "HELLO", "memory2", "x" * 1000))
        return Hostile("unknown operation", [encode(fields)], {"", fields["id"]})

    def bad_version(self) -> Hostile:
        _, fields = self.any_request_fields()
        fields["v"] = self.rng.choice((0, 2, 99, -5))
        return Hostile("other protocol version", [encode(fields)], {"", fields["id"]})

    def bad_id(self) -> Hostile:
        _, fields = self.any_request_fields()
        fields["id"] = self.rng.choice(("", "i" * (wire.MAX_ID_CHARS + 1), "i" * 100_000))
        return Hostile("bad request id", [encode(fields)], {""})

    def huge_strings(self) -> Hostile:
        size = self.rng.choice((10_000, 100_000, 900_000))
        roll = self.rng.random()
        if roll < 0.3:
            frame = self.request(wire.OpenSession, name="n" * size)
            check: Check = expect_invalid
        elif roll < 0.5:
            frame = self.request(wire.Entries, target="t" * size)
            check = expect_invalid
        elif roll < 0.7:
            frame = self.request(wire.Status, profile="p" * size)
            check = expect_invalid
        else:
            # Well-formed, but far over any budget: refused, never written.
            frame = self.request(wire.Memory, session=self.scratch_session, args={"action": "add", "content": "c" * size})
            check = expect_refused
        rid = wire.envelope_decoder.decode(frame).id
        return Hostile("huge strings", [frame], {rid}, check)

    def deep_nesting(self) -> Hostile:
        depth = self.rng.choice((100, 1000, 10_000, 100_000, 500_000))
        unit = self.rng.choice((b"\x91", b"\x81\xa1k"))
        nested = unit * depth + b"\xc0"
        rid = self.new_id()
        where = self.rng.random()
        if where < 0.5:
            args = raw_map([("x", nested)])
            frame = raw_map([("op", encode("memory")), ("v", encode(1)), ("id", encode(rid)),
                             ("session", encode(self.scratch_session)), ("args", args)])
        else:
            frame = raw_map([("op", encode("hello")), ("v", encode(1)), ("id", encode(rid)), ("extra", nested)])
        # Either refused as too deep, or (when the decoder copes) a well-formed answer.
        return Hostile("deep nesting", [frame], {"", rid}, expect_any)

    def replay(self) -> Hostile:
        if not self.history:
            return self.random_bytes()
        rid, frame, original = self.rng.choice(self.history)
        if self.rng.random() < 0.5:
            return Hostile("replayed request", [frame], {rid}, expect_bytes(original))
        # Same id, other content: answered from the cache, never applied.
        other = encode(wire.Memory(v=1, id=rid, session=self.session, args={"action": "add", "content": f"fz-replay-{self.serial}"}))
        return Hostile("replayed id, other content", [other], {rid}, expect_bytes(original))

    def multi_frame(self) -> Hostile:
        count = self.rng.randint(2, 5)
        frames = []
        for _ in range(count):
            roll = self.rng.random()
            if roll < 0.3:
                frames.append(b"")
            elif roll < 0.6:
                frames.append(self.rng.randbytes(self.rng.randint(1, 50)))
            else:
                frames.append(self.request(wire.Hello))
        if self.rng.random() < 0.2:
            frames = [b"", self.request(wire.Hello)]  # a REQ-style delimiter: tolerated, answered
        # Empty frames are dropped (a REQ-style delimiter is tolerated): one frame left is
        # answered as a request; several are refused, with the id salvaged from the last.
        rest = [frame for frame in frames if frame]
        ids = {"", salvage_id(rest[0] if len(rest) == 1 else frames[-1])}
        return Hostile("multi-frame message", frames, ids, expect_any)

    def empty_frame(self) -> Hostile:
        return Hostile("empty frame", [b""], {""})

    def not_a_map(self) -> Hostile:
        value = self.rng.choice((None, 1, "hello", [1, 2, 3], [{"op": "hello", "v": 1, "id": "x"}], 3.5, b"bin", True))
        return Hostile("valid msgpack, not a request", [encode(value)], {"", "x"})

    def made_up_profile(self) -> Hostile:
        """A well-formed request for a profile nobody has: served or refused, never a new engine
        (and watch thread, and directory) per name without bound."""
        request = self.rng.choice((wire.Status, wire.Entries, wire.Preview, wire.OpenSession))
        fields: dict[str, Any] = {"profile": f"fz-made-up-{self.serial}"}
        if request is wire.Entries:
            fields["target"] = "memory"
        if request is wire.OpenSession:
            fields["name"] = "fuzz"
        frame = self.request(request, **fields)
        return Hostile("made-up profile", [frame], {salvage_id(frame)}, expect_any)

    def soft_oversize(self) -> Hostile:
        frame = self.request(wire.Hello) + b" " * (wire.MAX_FRAME_BYTES + self.rng.randint(1, 100_000))
        return Hostile("over the 1 MiB request limit", [frame], {""})

    # -- hostile connections -----------------------------------------------------------------

    def abrupt_disconnect(self) -> int:
        """A DEALER that sends a few requests (or garbage) and closes without reading."""
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, self.rng.choice((0, 10, 100)))
        socket.connect(self.endpoint)
        sent = 0
        for _ in range(self.rng.randint(1, 4)):
            if self.rng.random() < 0.5:
                socket.send(encode(self.any_request_fields()[1]))
            else:
                socket.send(self.rng.randbytes(self.rng.randint(1, 200)))
            sent += 1
        socket.close()
        return sent

    def giant_frame(self) -> None:
        """Over the socket's hard limit: ZeroMQ drops the connection; the daemon must not care."""
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 2000)
        socket.connect(self.endpoint)
        socket.send(b"\x00" * (HARD_FRAME_LIMIT + 1024))
        socket.close()

    # -- the run -----------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        socket = self._socket()
        try:
            socket.send(self.request(wire.Hello))
            if not socket.poll(10_000 if self.alive() else 0):
                raise RuntimeError("the daemon does not answer hello")
            return wire.reply_decoder.decode(socket.recv()).result
        finally:
            socket.close(linger=0)

    def open(self, name: str) -> str:
        socket = self._socket()
        try:
            socket.send(self.request(wire.OpenSession, name=name))
            assert socket.poll(10_000)
            return wire.reply_decoder.decode(socket.recv()).result["session"]
        finally:
            socket.close(linger=0)

    def run(self, frames: int, seconds: float, giants: int) -> int:
        self.pid = self.hello()["pid"]
        self.session = self.open("fuzz")
        self.scratch_session = self.open("fuzz-hostile")
        deadline = Deadline(seconds)
        hostile_sent = 0
        giant_at = {frames * (i + 1) // (giants + 1) for i in range(giants)}
        while hostile_sent < frames and not deadline.passed:
            burst = []
            for _ in range(min(self.rng.randint(1, 16), frames - hostile_sent)):
                if self.rng.random() < 0.03:
                    sent = self.abrupt_disconnect()
                    self.frames_sent += sent
                    self.counts["abrupt disconnect"] = self.counts.get("abrupt disconnect", 0) + 1
                else:
                    burst.append(self.hostile())
                hostile_sent += 1
                if hostile_sent in giant_at:
                    self.giant_frame()
                    self.counts["over the 16 MiB socket limit"] = self.counts.get("over the 16 MiB socket limit", 0) + 1
                    self.frames_sent += 1
            self.valid(burst)
        return hostile_sent


def threads_of(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def run_fuzz(frames: int = 100_000, seconds: float = 1800.0, giants: int = 3, seed: int | None = None) -> Report:
    seed = random.randrange(2**32) if seed is None else seed
    report = Report(f"fuzz: {frames:,} hostile messages, seed {seed}")
    started = time.monotonic()
    with running_daemon() as daemon:
        fuzzer = Fuzzer(daemon.endpoint, random.Random(seed), report, lambda: process_alive(daemon))
        resources = [(rss_kb(daemon.pid) or 0, threads_of(daemon.pid))]
        try:
            hostile = fuzzer.run(frames, seconds, giants)
            resources.append((rss_kb(daemon.pid) or 0, threads_of(daemon.pid)))
            final = fuzzer.hello()
            if final["pid"] != fuzzer.pid or final["pid"] != daemon.pid or not process_alive(daemon):
                report.violation(f"the daemon changed: pid {fuzzer.pid} at start, {final['pid']} at the end")
            with daemon.client() as client:
                entries = client.entries("memory")
                stray = [entry for entry in entries if entry.startswith("fz-replay-") or entry == "never written"]
                if stray:
                    report.violation(f"hostile content reached the store: {stray[:5]}")
                if entries != fuzzer.live:
                    report.violation(f"final entries {entries} differ from the fuzzer's {fuzzer.live}")
                status = client.status()
                if len(status["profiles"]) > MAX_PROFILES:
                    report.violation(f"{len(status['profiles']):,} profiles are being served: made-up names cost an engine and a watch each, without bound")
        except RuntimeError as error:
            report.violation(f"the daemon stopped answering: {error}")
            hostile, status = 0, {}
        finally:
            fuzzer.close()
        alive = process_alive(daemon)
        if not alive:
            report.violation(f"the daemon exited with {daemon.process.returncode if daemon.process else '?'}")
        for line in log_problems(daemon):
            report.violation(f"daemon log: {line}")
    elapsed = time.monotonic() - started
    report.figure("hostile messages", f"{hostile:,} ({fuzzer.frames_sent:,} frames including valid-looking ones inside)")
    for category, count in sorted(fuzzer.counts.items(), key=lambda item: -item[1]):
        report.figure(f"  {category}", f"{count:,}")
    report.figure("valid requests", f"{fuzzer.valid_sent:,}, wrong answers {fuzzer.wrong}")
    report.figure("hostile replies checked", f"{fuzzer.hostile_replies:,}")
    if status:
        report.figure("daemon", f"pid {status['pid']} still up; {status['requests']:,} requests, {status['invalid_requests']:,} refused as invalid")
    if len(resources) == 2:
        (rss_start, threads_start), (rss_end, threads_end) = resources
        report.figure("daemon resources", f"RSS {rss_start / 1024:.1f} MB -> {rss_end / 1024:.1f} MB, threads {threads_start} -> {threads_end}")
        if rss_end - rss_start > RSS_GROWTH_LIMIT_KB:
            report.violation(f"the daemon grew by {(rss_end - rss_start) / 1024:.0f} MB: what a client can make it hold must be bounded")
    report.figure("crashes", 0 if alive else 1)
    report.figure("time", f"{elapsed:.1f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="hostile messages to send")
    parser.add_argument("--seconds", type=float, default=1800.0, help="stop early after this long")
    parser.add_argument("--giants", type=int, default=3, help="frames over the 16 MiB socket limit")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    return run_fuzz(args.frames, args.seconds, args.giants, args.seed).exit_status()


if __name__ == "__main__":
    sys.exit(main())
