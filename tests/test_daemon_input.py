"""Whatever arrives on the socket, the daemon answers clearly and keeps serving; retried
requests are answered from its cache, never applied twice. Spoken to with raw DEALER sockets."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
import zmq
from memd_client import protocol as wire

from memd.testing import DaemonProcess

V = wire.PROTOCOL_VERSION


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonProcess]:
    """One daemon for the bad-request cases: each checks that it is still serving afterwards."""
    process = DaemonProcess.start_new()
    try:
        yield process
    finally:
        process.close()


@pytest.fixture
def dealer(daemon) -> Iterator[zmq.Socket]:
    yield from connect(daemon)


@pytest.fixture
def shared_dealer(shared_daemon) -> Iterator[zmq.Socket]:
    yield from connect(shared_daemon)


def connect(daemon: DaemonProcess) -> Iterator[zmq.Socket]:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(daemon.endpoint)
    try:
        yield socket
    finally:
        socket.close()
        context.term()


def exchange(socket: zmq.Socket, *frames: bytes, timeout: float = 5.0) -> wire.Reply:
    socket.send_multipart(list(frames))
    assert socket.poll(int(timeout * 1000)), "no reply"
    return wire.reply_decoder.decode(socket.recv())


def still_serving(socket: zmq.Socket, tag: str) -> None:
    reply = exchange(socket, wire.encoder.encode(wire.Hello(v=V, id=f"alive-{tag}")))
    assert reply.ok and reply.id == f"alive-{tag}" and reply.result["server"] == "memd"


def raw(**fields: object) -> bytes:
    return msgspec.msgpack.encode(fields)


BAD_REQUESTS = {
    "garbage": ([b"\xc1\xff not msgpack at all \x00"], "malformed request", ""),
    "truncated": ([wire.encoder.encode(wire.Entries(v=V, id="cut-short", target="memory"))[:-4]], "malformed request", ""),
    "wrong field type": ([raw(op="entries", v=V, id="wrong-type", target=42)], "Expected `str`", "wrong-type"),
    "memory args not a map": ([raw(op="memory", v=V, id="args-list", session="s", args=["add"])], "Expected `object`", "args-list"),
    "unknown operation": ([raw(op="format_disk", v=V, id="unknown-op")], "format_disk", "unknown-op"),
    "no operation": ([raw(v=V, id="no-op")], "malformed request", "no-op"),
    "other protocol version": ([raw(op="hello", v=V + 98, id="future")], f"protocol version {V + 98} is not supported", "future"),
    "oversized": (
        [wire.encoder.encode(wire.Memory(v=V, id="huge", session="s", args={"action": "add", "content": "x" * (1536 * 1024)}))],
        "larger than the 1,048,576 allowed", "huge",
    ),
    "two frames": ([wire.encoder.encode(wire.Hello(v=V, id="a")), wire.encoder.encode(wire.Hello(v=V, id="b"))], "expected one request frame", "b"),
    "nested too deeply": ([b"\x91" * 100_000], "malformed request", ""),
    "empty id": ([raw(op="hello", v=V, id="")], "request id", ""),
}


@pytest.mark.parametrize("name", BAD_REQUESTS)
def test_bad_requests_get_a_clear_invalid_reply_and_the_daemon_keeps_serving(shared_daemon, shared_dealer, name):
    daemon, dealer = shared_daemon, shared_dealer
    frames, says, echoed_id = BAD_REQUESTS[name]
    still_serving(dealer, "before")
    with daemon.client() as client:
        invalid_before = client.status()["invalid_requests"]
    reply = exchange(dealer, *frames)
    assert not reply.ok and reply.error is not None
    assert reply.error.code == "invalid"
    assert says in reply.error.message, reply.error.message
    assert reply.id == echoed_id
    still_serving(dealer, "after")
    with daemon.client() as client:
        assert client.status()["invalid_requests"] == invalid_before + 1
    assert daemon.process.poll() is None


def test_a_flood_of_bad_input_and_a_frame_beyond_the_socket_limit_do_not_stop_the_daemon(daemon, dealer):
    for frames, _, _ in BAD_REQUESTS.values():
        dealer.send_multipart(frames)
    replies = []
    while len(replies) < len(BAD_REQUESTS):
        assert dealer.poll(5000), f"only {len(replies)} of {len(BAD_REQUESTS)} bad requests were answered"
        replies.append(wire.reply_decoder.decode(dealer.recv()))
    assert all(not reply.ok and reply.error.code == "invalid" for reply in replies)

    # Beyond 16 MiB ZeroMQ drops the connection instead of buffering it; the daemon carries on.
    context = zmq.Context()
    giant = context.socket(zmq.DEALER)
    giant.setsockopt(zmq.LINGER, 0)
    try:
        giant.connect(daemon.endpoint)
        giant.send(b"\x00" * (17 * 1024 * 1024))
        assert not giant.poll(300)
    finally:
        giant.close()
        context.term()
    still_serving(dealer, "after-flood")
    with daemon.client() as client:
        session = client.open_session("after-flood")
        assert session.memory(action="add", content="Still writing after the flood.")["success"]


def test_a_retried_request_is_answered_from_the_cache_and_applied_once(daemon, dealer):
    with daemon.client() as client:
        session = client.open_session("retrying-agent")
        writes_before = client.status()["writes"]

        # The same frame twice, the second after the first was answered...
        first = wire.encoder.encode(wire.Memory(v=V, id="retry-after-reply", session=session.id, args={"action": "add", "content": "Deploys happen on Tuesdays."}))
        dealer.send(first)
        assert dealer.poll(5000)
        answer = dealer.recv()
        dealer.send(first)
        assert dealer.poll(5000)
        assert dealer.recv() == answer

        # ...and twice back to back, so both may arrive in the same batch.
        second = wire.encoder.encode(wire.Memory(v=V, id="retry-back-to-back", session=session.id, args={"action": "add", "content": "The on-call rota is in PagerDuty."}))
        dealer.send(second)
        dealer.send(second)
        answers = []
        for _ in range(2):
            assert dealer.poll(5000)
            answers.append(dealer.recv())
        assert answers[0] == answers[1]

        for reply in (answer, answers[0]):
            decoded = wire.reply_decoder.decode(reply)
            # Applied twice, the second application would have answered `duplicate`.
            assert decoded.ok and decoded.result["code"] == "ok", decoded
        assert client.entries("memory") == ["Deploys happen on Tuesdays.", "The on-call rota is in PagerDuty."]
        assert client.status()["writes"] == writes_before + 2

        # A non-idempotent call shows it best: a remove re-sent after a matching entry was added
        # would remove that one too.
        remove = wire.encoder.encode(wire.Memory(v=V, id="retry-remove", session=session.id, args={"action": "remove", "old_text": "Deploys happen"}))
        dealer.send(remove)
        assert dealer.poll(5000)
        removed = dealer.recv()
        assert wire.reply_decoder.decode(removed).result["code"] == "ok"
        assert session.memory(action="add", content="Deploys happen on Fridays too.")["success"]
        dealer.send(remove)
        assert dealer.poll(5000)
        assert dealer.recv() == removed
        assert client.entries("memory") == ["The on-call rota is in PagerDuty.", "Deploys happen on Fridays too."]
