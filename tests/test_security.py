"""Only the owner talks to the daemon: an owner-only ipc socket, and CURVE on tcp.

The other-user test needs root (it becomes `nobody` in a forked child), as CI and the project's
containers run.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
from memd_client import Client, DaemonUnavailable, MemdError
from memd_client import protocol as wire

from memd.testing import DaemonProcess

NOBODY = 65534
fork = multiprocessing.get_context("fork")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _ask_as_nobody(endpoint: str) -> None:
    """Become `nobody`, then ask the daemon. Exit 0: no answer; 3: answered; 4: other error."""
    code = 4
    try:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        assert os.geteuid() == NOBODY
        try:
            with Client(endpoint, timeout=1.0, retries=0, autostart=False) as client:
                client.hello()
            code = 3
        except DaemonUnavailable:
            code = 0
    finally:
        os._exit(code)


def ask_as_nobody(endpoint: str) -> int:
    child = fork.Process(target=_ask_as_nobody, args=(endpoint,))
    child.start()
    child.join(15)
    if child.is_alive():
        child.kill()
        child.join()
    return child.exitcode


def test_the_ipc_socket_is_owner_only_and_another_user_gets_no_answer(daemon):
    assert os.geteuid() == 0, "this test impersonates another user and must run as root"
    socket_path = Path(daemon.endpoint.removeprefix("ipc://"))
    publish_path = Path(wire.publish_endpoint(daemon.endpoint).removeprefix("ipc://"))
    for path in (socket_path, publish_path):
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert mode_of(path) == 0o600, oct(mode_of(path))
    directory = socket_path.parent
    assert mode_of(directory) == 0o700, oct(mode_of(directory))

    assert ask_as_nobody(daemon.endpoint) == 0

    # The socket's own mode protects it even when its directory can be entered...
    os.chmod(directory, 0o711)
    try:
        assert ask_as_nobody(daemon.endpoint) == 0
        # ...and it is the modes that stop `nobody`: opened up, the same child gets through.
        os.chmod(socket_path, 0o666)
        try:
            assert ask_as_nobody(daemon.endpoint) == 3
        finally:
            os.chmod(socket_path, 0o600)
    finally:
        os.chmod(directory, 0o700)
    with daemon.client() as client:
        assert client.hello()["pid"] == daemon.pid


def free_port_pair() -> int:
    """A port p on 127.0.0.1 with p + 1 also free (the notification socket takes p + 1)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


@pytest.fixture
def tcp_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    home = tmp_path / "home"
    home.mkdir()
    process = DaemonProcess(home, f"tcp://127.0.0.1:{free_port_pair()}")
    process.start()
    try:
        yield process
    finally:
        process.close()


def test_a_tcp_endpoint_requires_the_curve_keys_kept_in_the_home(tcp_daemon, tmp_path):
    keys = tcp_daemon.home / "memd" / "curve"
    assert mode_of(keys) == 0o700
    for path in keys.rglob("*"):
        assert mode_of(path) == (0o700 if path.is_dir() else 0o600), path

    with Client(tcp_daemon.endpoint, timeout=2, curve_dir=keys, autostart=False) as client:
        session = client.open_session("remote")
        assert session.memory(action="add", content="Reached over tcp with CURVE.")["success"]
        assert client.entries("memory") == ["Reached over tcp with CURVE."]

    # A client key the daemon has not authorised, and a client that trusts another server key.
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    zmq.auth.create_certificates(stranger, "client")
    shutil.copy(keys / "server.key", stranger / "server.key")
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    zmq.auth.create_certificates(impostor, "server")
    os.remove(impostor / "server.key_secret")
    shutil.copy(keys / "client.key_secret", impostor / "client.key_secret")
    for wrong in (stranger, impostor):
        started = time.monotonic()
        with Client(tcp_daemon.endpoint, timeout=1.0, curve_dir=wrong, autostart=False) as client:
            with pytest.raises(DaemonUnavailable, match=tcp_daemon.endpoint):
                client.hello()
        assert time.monotonic() - started < 3.0

    # Without keys the client says where they should come from; a plain socket gets nothing.
    empty = tmp_path / "no-keys"
    empty.mkdir()
    with Client(tcp_daemon.endpoint, timeout=1.0, curve_dir=empty, autostart=False) as client:
        with pytest.raises(MemdError, match="needs CURVE keys") as refused:
            client.hello()
        assert str(empty) in str(refused.value)
    context = zmq.Context()
    plain = context.socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    try:
        plain.connect(tcp_daemon.endpoint)
        plain.send(wire.encoder.encode(wire.Hello(v=wire.PROTOCOL_VERSION, id="plain")))
        assert not plain.poll(1000), "a client without CURVE got an answer"
    finally:
        plain.close()
        context.term()

    # Notifications are protected the same way.
    subscriber_context = zmq.Context()
    eavesdropper = subscriber_context.socket(zmq.SUB)
    eavesdropper.setsockopt(zmq.LINGER, 0)
    eavesdropper.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        eavesdropper.connect(wire.publish_endpoint(tcp_daemon.endpoint))
        with Client(tcp_daemon.endpoint, timeout=2, curve_dir=keys, autostart=False) as client:
            session = client.open_session("remote")
            for number in range(5):
                assert session.memory(action="add", content=f"Heard by nobody {number}.")["success"]
                assert not eavesdropper.poll(100)
    finally:
        eavesdropper.close()
        subscriber_context.term()

    with Client(tcp_daemon.endpoint, timeout=2, curve_dir=keys, autostart=False) as client:
        assert client.hello()["pid"] == tcp_daemon.pid
