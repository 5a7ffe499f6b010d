"""memd under systemd: the notify protocol spoken by `memd serve`, the user unit, and
`memd install-service` / `uninstall-service` (against a stand-in systemctl: tests never touch
the real user manager)."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.service import memd_command, render_unit, template_text
from memd_client import Client

REPOSITORY = Path(__file__).resolve().parent.parent
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
if [ "$FAKE_SYSTEMCTL" = nobus ]; then echo "Failed to connect to bus: No medium found" >&2; exit 1; fi
case "$2" in is-active) echo active;; is-enabled) echo enabled;; show) echo 0;; esac
exit 0
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="memd-sd-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def environment(scratch: Path, **extra: str) -> dict[str, str]:
    """A private environment with a stand-in `systemctl` first on PATH that logs its calls."""
    binaries = scratch / "bin"
    binaries.mkdir(exist_ok=True)
    fake = binaries / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL, encoding="utf-8")
    fake.chmod(0o755)
    runtime = scratch / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    foreign = ("HERMES_HOME", "MEMD_ENDPOINT", "MEMD_UNIT_DIR", "NOTIFY_SOCKET", "WATCHDOG_USEC", "RUNTIME_DIRECTORY")
    env = {key: value for key, value in os.environ.items() if key not in foreign}
    env.update(
        PATH=f"{binaries}{os.pathsep}{env.get('PATH', '')}", FAKE_SYSTEMCTL_LOG=str(scratch / "systemctl.log"),
        XDG_CONFIG_HOME=str(scratch / "config"), XDG_RUNTIME_DIR=str(runtime), HERMES_HOME=str(scratch / "home"),
        MEMD_AUTOSTART="0",
    )
    env.update(extra)
    return env


def memd(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd", *args], env={**env, **extra}, capture_output=True, text=True, timeout=60,
    )


def systemctl_calls(scratch: Path) -> list[str]:
    log = scratch / "systemctl.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


# -- the unit -------------------------------------------------------------------------------


def parse_unit(text: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # unit keys are case-sensitive
    unit.read_string(text)
    return unit


def test_the_unit_is_a_notify_service_with_a_watchdog_and_a_private_runtime_dir() -> None:
    unit = parse_unit(template_text())
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["WatchdogSec"] and service["Restart"] == "on-failure"
    assert service["RuntimeDirectory"] == "memd" and service["RuntimeDirectoryMode"] == "0700"
    assert service["ExecStart"] == "@MEMD@ serve --home @HOME@"
    assert service["ProtectSystem"] == "strict" and service["ReadWritePaths"] == "-@HOME@"
    assert service["NoNewPrivileges"] == "yes" and service["PrivateTmp"] == "yes"
    assert unit["Install"]["WantedBy"] == "default.target"
    # System-only settings would be ignored (or fail) in a user unit.
    assert not {"User", "Group", "ProtectHome", "ProtectControlGroups", "DynamicUser"} & set(service)


def test_the_source_tree_unit_is_the_packaged_template() -> None:
    assert (REPOSITORY / "systemd" / "memd.service").read_text(encoding="utf-8") == template_text()


def test_the_rendered_unit_passes_systemd_analyze_verify(scratch: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is needed to check the unit: apt-get install systemd"
    home = scratch / "a home with spaces and 100%"
    text = render_unit(memd_command(), home)
    assert "@MEMD@" not in text and "@HOME@" not in text
    service = parse_unit(text)["Service"]
    assert service["ExecStart"] == f'{memd_command()[0]} serve --home "{str(home).replace("%", "%%")}"'
    assert service["ReadWritePaths"] == f'"-{str(home).replace("%", "%%")}"'
    unit = scratch / "memd.service"
    unit.write_text(text, encoding="utf-8")
    runtime = scratch / "run"
    runtime.mkdir(mode=0o700)
    verified = subprocess.run(
        [analyze, "--user", "verify", str(unit)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "warning"},
    )
    assert verified.returncode == 0 and verified.stdout + verified.stderr == "", verified.stdout + verified.stderr


# -- install-service and uninstall-service --------------------------------------------------


def test_install_service_into_a_chosen_directory_leaves_systemctl_alone(scratch: Path) -> None:
    env = environment(scratch)
    units = scratch / "units"
    home = scratch / "home"
    installed = memd(env, "install-service", "--unit-dir", str(units), "--json")
    assert installed.returncode == 0, installed.stderr
    report = json.loads(installed.stdout)
    unit_path = units / "memd.service"
    assert report["unit"] == str(unit_path) and report["action"] == "installed" and report["systemctl"] == "skipped"
    assert report["steps"] == [
        f"systemctl --user link {unit_path}", "systemctl --user daemon-reload", "systemctl --user enable --now memd.service",
    ]
    service = parse_unit(unit_path.read_text(encoding="utf-8"))["Service"]
    program, *rest = service["ExecStart"].split(" ")
    assert Path(program).is_absolute() and os.access(program, os.X_OK)
    assert rest[-3:] == ["serve", "--home", str(home.resolve())] and service["ReadWritePaths"] == f"-{home.resolve()}"
    assert (home / "memories").is_dir(), "the unit makes only the home writable, so it must exist"
    again = json.loads(memd(env, "install-service", "--unit-dir", str(units), "--json").stdout)
    assert again["action"] == "unchanged"
    assert systemctl_calls(scratch) == []
    removed = memd(env, "uninstall-service", "--unit-dir", str(units))
    assert removed.returncode == 0 and "memd.service: removed." in removed.stdout and not unit_path.exists()
    absent = json.loads(memd(env, "uninstall-service", "--json", MEMD_UNIT_DIR=str(units)).stdout)
    assert absent["action"] == "absent"


def test_install_service_enables_and_starts_it_through_the_user_manager(scratch: Path) -> None:
    env = environment(scratch)
    installed = memd(env, "install-service")
    assert installed.returncode == 0, installed.stderr
    unit_path = scratch / "config" / "systemd" / "user" / "memd.service"
    assert unit_path.exists()
    assert f"{unit_path}: installed." in installed.stdout and "The service is active." in installed.stdout
    assert "loginctl enable-linger" in installed.stdout
    calls = systemctl_calls(scratch)
    assert calls[0] == "--user daemon-reload" and "--user enable --now memd.service" in calls
    service_checks = [check for check in json.loads(memd(env, "doctor", "--json").stdout)["checks"] if check["name"] == "service"]
    assert service_checks == [{"name": "service", "status": "ok", "detail": "memd.service is active (enabled)", "fix": None}]
    # A unit whose memd has gone (a deleted virtualenv, say) is a problem with a fix.
    unit_path.write_text(unit_path.read_text(encoding="utf-8").replace("ExecStart=/", "ExecStart=/gone/"), encoding="utf-8")
    doctor = json.loads(memd(env, "doctor", "--json").stdout)
    assert {"status": "problem", "fix": "memd install-service"}.items() <= next(
        check for check in doctor["checks"] if check["name"] == "service").items()
    assert memd(env, "uninstall-service").returncode == 0
    assert "--user disable --now memd.service" in systemctl_calls(scratch) and not unit_path.exists()


def test_install_service_without_a_user_manager_prints_the_steps(scratch: Path) -> None:
    env = environment(scratch, FAKE_SYSTEMCTL="nobus")
    installed = memd(env, "install-service")
    assert installed.returncode == 0, installed.stderr
    assert "To finish, run:\n  systemctl --user daemon-reload\n  systemctl --user enable --now memd.service" in installed.stdout
    assert "no systemd user manager is reachable (Failed to connect to bus" in installed.stdout
    report = json.loads(memd(env, "install-service", "--json").stdout)
    assert report["systemctl"] == "unavailable" and report["action"] == "unchanged"
    units = scratch / "config" / "systemd" / "user"
    printed = memd(env, "install-service", "--print")
    assert printed.returncode == 0 and printed.stdout == (units / "memd.service").read_text(encoding="utf-8")
    # Enabled while a user manager ran, then uninstalled without one: no dangling link is left.
    (units / "default.target.wants").mkdir()
    (units / "default.target.wants" / "memd.service").symlink_to(units / "memd.service")
    removed = json.loads(memd(env, "uninstall-service", "--json").stdout)
    assert removed["action"] == "removed" and removed["systemctl"] == "unavailable" and removed["steps"] == []
    assert not list(units.rglob("memd.service"))
    assert not (units / "default.target.wants" / "memd.service").is_symlink()


# -- the notify protocol --------------------------------------------------------------------


def test_serve_notifies_ready_pings_the_watchdog_and_says_stopping(scratch: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(scratch / "notify"))
    listener.settimeout(15)
    runtime = scratch / "run" / "memd"
    env = environment(scratch, NOTIFY_SOCKET=str(scratch / "notify"), WATCHDOG_USEC="200000", RUNTIME_DIRECTORY=str(runtime))
    process = subprocess.Popen(
        [sys.executable, "-m", "memd", "serve", "--home", str(scratch / "home")], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        first = listener.recv(4096).decode().split("\n")
        assert "READY=1" in first and f"MAINPID={process.pid}" in first
        assert any(line.startswith("STATUS=serving ") for line in first)
        # Ready means ready: the endpoint ($RUNTIME_DIRECTORY/memd.sock) answers at once.
        with Client(f"ipc://{runtime / 'memd.sock'}", timeout=1.0, retries=0, autostart=False) as client:
            assert client.hello()["pid"] == process.pid
        started = time.monotonic()
        pings = 0
        while pings < 3:
            if "WATCHDOG=1" in listener.recv(4096).decode().split("\n"):
                pings += 1
        assert time.monotonic() - started < 2.0, "pings come every WATCHDOG_USEC/2"
        process.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in listener.recv(4096).decode().split("\n"):
            pass
        assert process.wait(15) == 0
        assert not (runtime / "memd.sock").exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        listener.close()
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
