"""The systemd user unit: rendered from the one template shipped in the package
(`memd/memd.service`, also reachable as `systemd/memd.service` in the source tree), installed,
enabled and removed with `systemctl --user` where a user manager is reachable.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from memd_client import Client, MemdError
from memd_client.client import daemon_absent
from memd_client import protocol as wire

UNIT_NAME = "memd.service"
UNIT_DIR_VARIABLE = "MEMD_UNIT_DIR"
# Characters a unit file cannot carry inside a quoted word without escaping rules that differ
# between settings; a home containing them is refused rather than written ambiguously.
UNSAFE_IN_UNIT = frozenset('"\\\n\r')


class ServiceError(Exception):
    """The unit cannot be installed as asked; the message says why and what to do."""


def template_text() -> str:
    return (resources.files("memd") / UNIT_NAME).read_text(encoding="utf-8")


def default_unit_dir() -> Path:
    """Where a user's own units live: `$XDG_CONFIG_HOME/systemd/user`, else `~/.config/...`."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def unit_dir(override: str | None) -> tuple[Path, bool]:
    """The directory to install into, and whether it is the one the user manager reads (only
    then is `systemctl --user` run; a unit elsewhere is left for the person to link)."""
    chosen = override or os.environ.get(UNIT_DIR_VARIABLE)
    if chosen:
        return Path(chosen).expanduser().absolute(), False
    return default_unit_dir(), True


def memd_command() -> list[str]:
    """The absolute command that runs this installation's `memd`.

    The console script that is running, else the one beside this interpreter, else the
    interpreter with `-m memd`: always the same installation as the one installing the unit.
    """
    script_name = "memd.exe" if sys.platform == "win32" else "memd"
    running = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if running is not None and running.name == script_name and running.is_file():
        return [str(running.absolute())]
    beside = Path(sys.executable).with_name(script_name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [str(Path(sys.executable).absolute()), "-m", "memd"]


def _unit_word(word: str) -> str:
    """One word for a unit file: `%` would start a specifier and `$` a variable, so both are
    doubled; a word with whitespace is double-quoted."""
    if any(char in UNSAFE_IN_UNIT for char in word):
        raise ServiceError(
            f"the path {word!r} contains a quote, backslash or line break, which a systemd unit "
            "cannot hold safely; use a memory home (--home) and an installation path without them"
        )
    word = word.replace("%", "%%").replace("$", "$$")
    return f'"{word}"' if any(char.isspace() for char in word) else word


def render_unit(command: Sequence[str], home: Path) -> str:
    """The unit for running `command serve --home HOME`, from the packaged template."""
    text = template_text()
    text = text.replace("-@HOME@", _unit_word(f"-{home}"))
    text = text.replace("@HOME@", _unit_word(str(home)))
    return text.replace("@MEMD@", " ".join(_unit_word(word) for word in command))


def service_endpoint() -> str:
    """Where the unit's daemon listens: `$RUNTIME_DIRECTORY/memd.sock` with RuntimeDirectory=memd,
    i.e. the client's default endpoint when MEMD_ENDPOINT is not set."""
    return f"ipc://{wire.runtime_dir() / 'memd' / 'memd.sock'}"


def systemctl(*args: str) -> subprocess.CompletedProcess[str] | None:
    """`systemctl --user ARGS`; None where there is no systemctl at all."""
    program = shutil.which("systemctl")
    if program is None:
        return None
    try:
        return subprocess.run(
            [program, "--user", *args], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess([program, "--user", *args], 1, "", str(error))


def _why(result: subprocess.CompletedProcess[str] | None) -> str:
    if result is None:
        return "systemctl is not installed"
    return (result.stderr or result.stdout).strip() or f"systemctl exited with {result.returncode}"


@dataclass
class Report:
    """What install-service or uninstall-service did; `to_json()` is the `--json` output."""

    unit: Path
    action: str  # installed, updated, unchanged, removed, absent
    home: str | None = None
    exec_start: str | None = None
    systemctl: str = "skipped"  # used, unavailable, skipped (unit outside the user manager's dir)
    active: bool | None = None
    stopped_pid: int | None = None
    steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": str(self.unit), "action": self.action, "home": self.home,
            "exec_start": self.exec_start, "systemctl": self.systemctl, "active": self.active,
            "stopped_pid": self.stopped_pid, "steps": self.steps, "notes": self.notes,
        }


def install(home: Path, unit_dir_override: str | None = None) -> Report:
    """Write the unit for `home`, then reload, enable and start it where a user manager is reachable."""
    directory, managed = unit_dir(unit_dir_override)
    command = memd_command()
    home = home.expanduser().resolve()
    text = render_unit(command, home)
    path = directory / UNIT_NAME
    previous = path.read_text(encoding="utf-8") if path.is_file() else None
    action = "unchanged" if previous == text else "updated" if previous is not None else "installed"
    # The unit makes only the home writable (ReadWritePaths=), so it must exist before it starts.
    (home / "memories").mkdir(parents=True, exist_ok=True, mode=0o700)
    if action != "unchanged":
        directory.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{UNIT_NAME}.tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    report = Report(path, action, str(home), exec_start.removeprefix("ExecStart="))
    configured = os.environ.get("MEMD_ENDPOINT")
    if configured and configured != service_endpoint():
        report.notes.append(
            f"MEMD_ENDPOINT is set to {configured}, but the service listens on {service_endpoint()}: "
            "unset MEMD_ENDPOINT so that agents find the service"
        )
    enable = ["systemctl --user daemon-reload", f"systemctl --user enable --now {UNIT_NAME}"]
    if not managed:
        report.steps = [f"systemctl --user link {path}", *enable]
        return report
    reloaded = systemctl("daemon-reload")
    if reloaded is None or reloaded.returncode != 0:
        report.systemctl = "unavailable"
        report.steps = enable
        report.notes.append(
            f"no systemd user manager is reachable ({_why(reloaded)}); until there is one, "
            "agents start memd on demand (autostart)"
        )
        return report
    report.systemctl = "used"
    report.stopped_pid = _stop_unmanaged_daemon()
    started = systemctl("enable", "--now", UNIT_NAME)
    report.active = _is_active()
    if not report.active:
        why = _why(started) if started is None or started.returncode != 0 else "it is not active"
        report.notes.append(
            f"the service did not start ({why}); see `systemctl --user status {UNIT_NAME}` and "
            f"`journalctl --user -u {UNIT_NAME}`"
        )
    report.notes.append(
        "user services stop when you log out; to keep memd running, enable lingering once: "
        "`loginctl enable-linger`"
    )
    return report


def uninstall(unit_dir_override: str | None = None) -> Report:
    """Stop and disable the service where a user manager is reachable, then remove the unit."""
    directory, managed = unit_dir(unit_dir_override)
    path = directory / UNIT_NAME
    report = Report(path, "removed" if path.exists() else "absent")
    if report.action == "absent":
        return report
    if managed:
        stopped = systemctl("disable", "--now", UNIT_NAME)
        if stopped is not None and stopped.returncode == 0:
            report.systemctl = "used"
        else:
            report.systemctl = "unavailable"
            report.notes.append(f"no systemd user manager is reachable ({_why(stopped)}), so none was running memd")
    path.unlink()
    # The link an earlier `enable` made would otherwise be left dangling.
    wanted = directory / "default.target.wants" / UNIT_NAME
    if wanted.is_symlink():
        wanted.unlink()
    if report.systemctl == "used":
        systemctl("daemon-reload")
    elif not managed:
        report.steps = [
            f"systemctl --user disable --now {UNIT_NAME}   (if you linked it into systemd)",
            "systemctl --user daemon-reload",
        ]
    return report


def _is_active() -> bool:
    result = systemctl("is-active", UNIT_NAME)
    return result is not None and result.stdout.strip() == "active"


def _main_pid() -> int:
    result = systemctl("show", "--property=MainPID", "--value", UNIT_NAME)
    value = result.stdout.strip() if result is not None and result.returncode == 0 else ""
    return int(value) if value.isdigit() else 0


def _stop_unmanaged_daemon(wait: float = 15.0) -> int | None:
    """Stop a memd that listens where the service will, but that the service does not run (one
    started by hand or by autostart): it holds the home, and the service could not start beside it.
    Returns its pid when one was stopped."""
    if daemon_absent(service_endpoint()):
        return None
    try:
        with Client(service_endpoint(), timeout=1.0, retries=0, autostart=False) as client:
            pid = int(client.hello()["pid"])
    except (MemdError, KeyError, TypeError, ValueError):
        return None
    if pid == _main_pid() or pid == os.getpid():
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.05)
    return pid


def _running(pid: int) -> bool:
    """Whether `pid` still runs; a zombie (exited, not yet reaped by whoever started it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"
