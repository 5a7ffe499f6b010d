"""Autostart: a client or `memd` command that finds nothing listening at the default endpoint
starts `memd serve` (or asks an installed systemd service to), waits for it, and talks to it.

Every test has its own runtime dir and home, so its default endpoint is private; every daemon
started is found through the home's lock file and stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd_client import Client

HELLO = """
import json, sys
from memd_client import Client
with Client(timeout=float(sys.argv[1])) as client:
    hello = client.hello()
print(json.dumps({"pid": hello["pid"], "endpoint": hello["endpoint"]}))
"""
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
if [ "$FAKE_SYSTEMCTL" = nobus ]; then echo "Failed to connect to bus: No medium found" >&2; exit 1; fi
if [ "$2" = start ]; then
    "$FAKE_PYTHON" -m memd serve --endpoint "ipc://$XDG_RUNTIME_DIR/memd/memd.sock" >"$FAKE_SERVICE_LOG" 2>&1 </dev/null &
    # Like `systemctl start` of a Type=notify unit: back once the service is ready.
    for _ in $(seq 200); do [ -S "$XDG_RUNTIME_DIR/memd/memd.sock" ] && exit 0; sleep 0.05; done
    exit 1
fi
"""


class Private:
    """A private default endpoint: its environment, home, socket and the autostart log."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.home = scratch / "home"
        runtime = scratch / "run"
        runtime.mkdir(mode=0o700)
        self.socket = runtime / "memd" / "memd.sock"
        self.log = runtime / "memd" / "memd.log"
        foreign = ("HERMES_HOME", "MEMD_ENDPOINT", "MEMD_AUTOSTART", "NOTIFY_SOCKET", "WATCHDOG_USEC", "RUNTIME_DIRECTORY")
        self.env = {key: value for key, value in os.environ.items() if key not in foreign}
        self.env.update(HERMES_HOME=str(self.home), XDG_RUNTIME_DIR=str(runtime), XDG_CONFIG_HOME=str(scratch / "config"))

    def hello(self, timeout: float = 15.0, **extra: str) -> subprocess.Popen[str]:
        """A client in its own process asking the default endpoint who is there."""
        return subprocess.Popen(
            [sys.executable, "-c", HELLO, str(timeout)], env={**self.env, **extra},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def memd(self, *args: str, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd", *args], env={**self.env, **extra}, input=stdin,
            capture_output=True, text=True, timeout=60,
        )

    def holder(self) -> int | None:
        """The pid of the daemon holding the home, as its lock file says."""
        try:
            return int(json.loads((self.home / "memd" / "daemon.lock").read_text(encoding="utf-8"))["pid"])
        except (OSError, ValueError, KeyError):
            return None

    def daemons(self) -> list[int]:
        """Every `memd serve` running for this home, whoever started it."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                arguments = (entry / "cmdline").read_bytes().split(b"\0")
                environment = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in arguments and b"memd" in arguments and f"HERMES_HOME={self.home}".encode() in environment:
                if running(int(entry.name)):
                    found.append(int(entry.name))
        return found

    def stop_daemons(self) -> None:
        daemons = self.daemons()
        for pid in daemons:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while any(running(pid) for pid in daemons) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in daemons:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Alive and not a zombie (a daemon whose starter has gone is reaped by someone else)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def answer(process: subprocess.Popen[str]) -> dict[str, object]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out)


@pytest.fixture
def private() -> Iterator[Private]:
    scratch = Path(tempfile.mkdtemp(prefix="memd-as-", dir="/tmp"))
    endpoint = Private(scratch)
    try:
        yield endpoint
    finally:
        endpoint.stop_daemons()
        shutil.rmtree(scratch, ignore_errors=True)


def install_fake_systemctl(private: Private) -> None:
    binaries = private.scratch / "bin"
    binaries.mkdir()
    fake = binaries / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL, encoding="utf-8")
    fake.chmod(0o755)
    units = private.scratch / "config" / "systemd" / "user"
    units.mkdir(parents=True)
    (units / "memd.service").write_text("[Service]\nType=notify\n", encoding="utf-8")
    private.env.update(
        PATH=f"{binaries}{os.pathsep}{private.env.get('PATH', '')}", FAKE_PYTHON=sys.executable,
        FAKE_SYSTEMCTL_LOG=str(private.scratch / "systemctl.log"), FAKE_SERVICE_LOG=str(private.scratch / "service.log"),
    )


def test_a_client_starts_the_daemon_once_and_then_reuses_it(private: Private) -> None:
    first = answer(private.hello())
    assert first["endpoint"] == f"ipc://{private.socket}"
    assert first["pid"] == private.holder() and running(int(first["pid"]))  # type: ignore[arg-type]
    assert "serving home" in private.log.read_text(encoding="utf-8")
    assert answer(private.hello())["pid"] == first["pid"]
    assert private.log.read_text(encoding="utf-8").count("serving home") == 1


def test_racing_clients_start_exactly_one_daemon_and_all_talk_to_it(private: Private) -> None:
    clients = [private.hello() for _ in range(4)]
    pids = {answer(client)["pid"] for client in clients}
    assert pids == {private.holder()}
    # Every daemon a client started has either won or gone: none is left waiting to take over.
    assert private.daemons() == list(pids)
    log = private.log.read_text(encoding="utf-8")
    assert log.count("serving home") == 1, log
    # Those that lost the race said so, as a warning (losing it is no fault), and left the
    # endpoint alone.
    assert log.count("already running") == log.count("WARNING memd not started"), log
    assert "ERROR" not in log, log


def test_a_stale_socket_left_by_a_crash_is_not_taken_for_a_daemon(private: Private) -> None:
    private.socket.parent.mkdir(mode=0o700)
    crashed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    crashed.bind(str(private.socket))
    crashed.listen()
    crashed.close()  # the file stays behind, as after SIGKILL
    assert private.socket.exists()
    with Client(f"ipc://{private.socket}", autostart=False) as client:
        assert not client._daemon_present()
    started = answer(private.hello())
    assert started["pid"] == private.holder()
    with Client(f"ipc://{private.socket}", autostart=False) as client:
        assert client._daemon_present()


def test_a_daemon_serving_the_home_elsewhere_is_named(private: Private) -> None:
    elsewhere = f"ipc://{private.scratch}/elsewhere.sock"
    serving = subprocess.Popen(
        [sys.executable, "-m", "memd", "serve", "--endpoint", elsewhere], env=private.env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        with Client(elsewhere, timeout=10, autostart=False) as client:
            client.hello()
        failed = private.memd("show")
        assert failed.returncode == 3
        assert f"memd already runs for home {private.home} (pid {serving.pid}) at {elsewhere}" in failed.stderr
        assert f"set MEMD_ENDPOINT={elsewhere}" in failed.stderr
    finally:
        serving.terminate()
        serving.wait(15)


def test_autostart_can_be_switched_off_and_status_never_starts_one(private: Private) -> None:
    off = private.hello(timeout=0.3, MEMD_AUTOSTART="0")
    assert off.wait(60) != 0 and "did not answer" in (off.stderr.read() if off.stderr else "")
    assert private.memd("show", "--no-autostart", "--timeout", "0.3").returncode == 3
    assert private.memd("status", "--timeout", "0.3").returncode == 3
    assert private.memd("doctor", "--timeout", "0.3").returncode == 0  # autostart on: not a problem
    assert private.holder() is None and not private.socket.exists()


def test_a_daemon_that_cannot_start_is_reported_at_once(private: Private) -> None:
    private.home.mkdir()
    (private.home / "config.yaml").write_text("memory: [broken\n", encoding="utf-8")
    started = time.monotonic()
    failed = private.memd("show")
    assert failed.returncode == 3
    assert "memd could not start" in failed.stderr and "config.yaml is not valid YAML" in failed.stderr
    assert time.monotonic() - started < 8, "a daemon that exits is not waited for until the timeout"


def test_an_installed_service_is_asked_to_start_memd(private: Private) -> None:
    install_fake_systemctl(private)
    served = answer(private.hello())
    assert served["pid"] == private.holder()
    assert (private.scratch / "systemctl.log").read_text(encoding="utf-8").splitlines() == ["--user start memd.service"]
    assert not private.log.exists(), "no daemon of its own beside the service"


def test_without_a_user_manager_an_installed_unit_does_not_block_autostart(private: Private) -> None:
    install_fake_systemctl(private)
    served = answer(private.hello(FAKE_SYSTEMCTL="nobus"))
    assert served["pid"] == private.holder()
    assert "serving home" in private.log.read_text(encoding="utf-8")


def test_a_new_user_adds_sees_edits_and_snapshots_a_fact(private: Private) -> None:
    """The first steps of a new user, who never starts the daemon by hand."""
    assert private.memd("status").returncode == 3
    assert private.memd("add", "user", "User prefers tabs over spaces").returncode == 0
    status = private.memd("status")
    assert status.returncode == 0 and "USER.md" in status.stdout and "1 entry" in status.stdout
    assert "  1. User prefers tabs over spaces" in private.memd("show", "user").stdout
    editor = private.scratch / "editor.py"
    editor.write_text(
        "import pathlib, sys\npath = pathlib.Path(sys.argv[-1])\n"
        "path.write_text(path.read_text(encoding='utf-8').replace('tabs over spaces', 'spaces over tabs'), encoding='utf-8')\n",
        encoding="utf-8",
    )
    edited = private.memd("edit", "user", stdin="y\n", EDITOR=f"{sys.executable} {editor}")
    assert edited.returncode == 0, edited.stderr
    assert "    - User prefers tabs over spaces\n    + User prefers spaces over tabs" in edited.stdout
    snapshot = private.memd("snapshot").stdout
    assert "USER PROFILE (who the user is)" in snapshot and "User prefers spaces over tabs" in snapshot
    assert "tabs over spaces" not in snapshot
