"""`memd doctor`: checks a memory home, its daemon and its service, and says how to fix each
problem found. Every check is a function returning `Check`s; none of them changes anything.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.config import DEFAULT_LIMITS, LIMIT_KEYS, ConfigError, Settings, load_settings
from memd.core.format import drift_reason, parse_entries, total_chars, usage_text
from memd.core.render import FILENAMES
from memd.disk import latest_backup, lock_path_for, read_store
from memd.display import age, backup_time, count, duration
from memd.service import UNIT_NAME, default_unit_dir, service_endpoint, systemctl
from memd_client import Client, MemdError
from memd_client.client import daemon_absent

# Longest path a Unix socket address can hold (sun_path, less its terminating NUL).
MAX_SOCKET_PATH = 107
# A store this large goes into every system prompt of every session; worth a word.
LARGE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class Check:
    """One finding: `status` is ok, info, warning or problem; `fix` is the command (or step)
    that repairs it. Only problems make `memd doctor` exit non-zero."""

    name: str
    status: str
    detail: str
    fix: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True, slots=True)
class Context:
    """What is checked: `home` is the memory home, `store_home` the profile's (the same without
    a profile), where config.yaml and memories/ are."""

    home: Path
    store_home: Path
    endpoint: str
    profile: str | None
    autostart: bool

    @property
    def memory_dir(self) -> Path:
        return self.store_home / "memories"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def check_home(context: Context) -> Iterator[Check]:
    home = context.home
    if not home.exists():
        parent = next((p for p in home.parents if p.exists()), Path("/"))
        if os.access(parent, os.W_OK):
            yield Check("home", "info", f"{home} does not exist yet; memd creates it when it first starts")
        else:
            yield Check("home", "problem", f"{home} does not exist and {parent} is not writable",
                        f"mkdir -p {shlex.quote(str(home))}, or set HERMES_HOME to a writable directory")
        return
    if not home.is_dir():
        yield Check("home", "problem", f"{home} is not a directory", "set HERMES_HOME to a directory")
        return
    if not os.access(home, os.W_OK | os.X_OK):
        yield Check("home", "problem", f"{home} is not writable by you",
                    f"chown -R $USER {shlex.quote(str(home))}, or set HERMES_HOME to a writable directory")
        return
    yield Check("home", "ok", f"{home}")


def check_memory_dir(context: Context) -> Iterator[Check]:
    directory = context.memory_dir
    if not directory.exists():
        if context.store_home.exists():
            yield Check("memory dir", "info", f"{directory} does not exist yet; memd creates it on start")
        return
    quoted = shlex.quote(str(directory))
    if not os.access(directory, os.W_OK | os.X_OK):
        yield Check("memory dir", "problem", f"{directory} is not writable by you", f"chmod u+rwx {quoted}")
        return
    mode = _mode(directory)
    if mode & 0o022:
        yield Check("permissions", "problem", f"{directory} is writable by others (mode {mode:o}): anyone could plant memory",
                    f"chmod 700 {quoted}")
    elif mode & 0o077:
        yield Check("permissions", "warning", f"{directory} is readable by others (mode {mode:o}); memory holds personal facts",
                    f"chmod 700 {quoted}")
    else:
        yield Check("memory dir", "ok", f"{directory} (mode {mode:o})")
    for name in FILENAMES.values():
        store = directory / name
        lock = lock_path_for(store)
        if lock.is_symlink():
            yield Check(name, "problem", f"{lock} is a symbolic link, so memd refuses to write {name}",
                        f"rm {shlex.quote(str(lock))}")
        if not store.exists():
            continue
        store_mode = _mode(store)
        if store_mode & 0o022:
            yield Check("permissions", "problem", f"{store} is writable by others (mode {store_mode:o})",
                        f"chmod 600 {shlex.quote(str(store))}")
        elif not os.access(store, os.R_OK | os.W_OK):
            yield Check("permissions", "problem", f"{store} is not readable and writable by you",
                        f"chmod u+rw {shlex.quote(str(store))}")


def check_state_dir(context: Context) -> Iterator[Check]:
    """memd's own files in the home (the daemon lock, CURVE keys for tcp) are for its owner alone."""
    directory = context.home / "memd"
    if directory.is_dir() and _mode(directory) & 0o077:
        yield Check("permissions", "problem",
                    f"{directory} is open to others (mode {_mode(directory):o}); it holds memd's lock and keys",
                    f"chmod 700 {shlex.quote(str(directory))}")


def check_config(context: Context) -> Iterator[Check]:
    try:
        settings = load_settings(context.store_home)
    except ConfigError as error:
        yield Check("config", "problem", str(error),
                    f"edit {shlex.quote(str(context.store_home / 'config.yaml'))}, e.g. memory: {{memory_char_limit: 2200}}")
        return
    source = context.store_home / "config.yaml"
    yield Check("config", "ok", f"{source} is valid" if source.exists() else "no config.yaml: defaults apply")
    yield from check_limits(settings)


def check_limits(settings: Settings) -> Iterator[Check]:
    described = []
    for target, limit in settings.limits.items():
        origin = "default" if limit == DEFAULT_LIMITS[target] else f"memory.{LIMIT_KEYS[target]}"
        described.append(f"{FILENAMES[target]} {limit:,} chars ({origin})")
        if limit > LARGE_LIMIT:
            yield Check("limits", "warning",
                        f"{FILENAMES[target]} may hold {limit:,} characters, and every session's system prompt carries all of it",
                        f"lower memory.{LIMIT_KEYS[target]} in config.yaml")
    idle = duration(settings.session_idle_seconds)
    yield Check("limits", "ok", f"{'; '.join(described)}; idle sessions close after {idle}")


def daemon_status(context: Context) -> dict[str, Any] | None:
    """The daemon's status, or None when nothing answers (doctor never starts a daemon)."""
    if daemon_absent(context.endpoint):
        return None
    try:
        with Client(context.endpoint, timeout=2.0, retries=0, autostart=False) as client:
            return client.status(context.profile)
    except MemdError:
        return None


def check_daemon(context: Context, status: Mapping[str, Any] | None) -> Iterator[Check]:
    endpoint = context.endpoint
    if endpoint.startswith("ipc://"):
        path = Path(endpoint[len("ipc://"):])
        if len(os.fsencode(str(path))) > MAX_SOCKET_PATH:
            yield Check("endpoint", "problem", f"{path} is longer than the {MAX_SOCKET_PATH} bytes a socket path may have",
                        "set MEMD_ENDPOINT=ipc://<a shorter path>")
        runtime = path.parent
        if runtime.is_dir() and runtime.stat().st_uid == os.getuid() and _mode(runtime) & 0o077:
            yield Check("endpoint", "problem",
                        f"{runtime} is open to others (mode {_mode(runtime):o}); memd's socket must be private",
                        f"chmod 700 {shlex.quote(str(runtime))}")
    if status is not None:
        served = Path(status["home"])
        wanted = context.home
        yield Check("daemon", "ok", f"memd {status['version']} (pid {status['pid']}) answers at {endpoint}, "
                                    f"up {duration(status['uptime'])}")
        if served.resolve() != wanted.resolve():
            yield Check("daemon", "problem", f"the daemon serves {served}, but this shell's home is {wanted}",
                        f"export HERMES_HOME={shlex.quote(str(served))}, or start memd for {wanted}")
        return
    if context.autostart:
        yield Check("daemon", "info", f"not running at {endpoint}; agents and `memd` start it on demand (autostart)")
    else:
        yield Check("daemon", "problem", f"nothing answers at {endpoint}, and autostart is off",
                    "memd serve   (or: memd install-service, to run it as a service)")


def check_stores(context: Context, status: Mapping[str, Any] | None) -> Iterator[Check]:
    """Drift, readability, budget and backups: the daemon's view when it runs, the files' otherwise."""
    settings = _settings_or_default(context.store_home)
    for target, name in FILENAMES.items():
        store = context.memory_dir / name
        if status is not None:
            state = status["stores"][target]
            unreadable, drift = state["unreadable"], state["drift"]
            chars, limit, last_backup = state["chars"], state["limit"], state["last_backup"]
        else:
            limit = settings.limits[target]
            found = read_store(store)
            unreadable = found.error
            text = found.text or ""
            reason = None if unreadable else drift_reason(text, limit)
            newest = latest_backup(store)
            last_backup = str(newest) if newest else None
            # Not backed up yet: the daemon saves a drifted file the moment it sees it.
            drift = {"reason": reason, "backup": None} if reason else None
            chars = total_chars(parse_entries(text))
        if unreadable:
            yield Check(name, "problem", f"{store} cannot be used: {unreadable}; every write to it is refused",
                        f"repair or replace the file (e.g. iconv -f latin1 -t utf-8 {shlex.quote(str(store))}), "
                        f"or restore a backup: ls {shlex.quote(str(store))}.bak.*")
            continue
        if drift:
            backup = f"; its earlier content is saved in {drift['backup']}" if drift.get("backup") else ""
            yield Check(name, "problem", f"{name} was edited outside memd ({drift['reason']}){backup}; replace, "
                                         "remove and batches are refused", f"memd edit {target}")
        elif chars > limit:
            yield Check(name, "warning", f"{name} is over budget: {usage_text(chars, limit)}", f"memd edit {target}")
        else:
            yield Check(name, "ok", f"{usage_text(chars, limit)}, clean")
        if last_backup:
            backups = len(list(store.parent.glob(f"{name}.bak.*")))
            when = backup_time(last_backup)
            yield Check("backups", "info",
                        f"{count(backups, 'backup')} of {name}, latest {last_backup}" + (f" ({age(when)})" if when else "")
                        + "; delete them once reviewed")


def _settings_or_default(home: Path) -> Settings:
    try:
        return load_settings(home)
    except ConfigError:
        return Settings(home=home)


def check_service(context: Context) -> Iterator[Check]:
    unit = default_unit_dir() / UNIT_NAME
    if not unit.exists():
        hint = "memd install-service   (optional: runs memd as a systemd user service)"
        yield Check("service", "info", f"no systemd user unit at {unit}", hint)
        return
    exec_start = next((line.removeprefix("ExecStart=") for line in unit.read_text(encoding="utf-8").splitlines()
                       if line.startswith("ExecStart=")), "")
    # The unit doubles % and $ (specifiers, variables); undo that to get the real words.
    words = [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(exec_start)]
    program = words[0] if words else ""
    if not program or not os.access(program, os.X_OK):
        yield Check("service", "problem", f"{unit} runs {program or 'nothing'}, which is not an executable "
                                          "(memd moved or was uninstalled?)", "memd install-service")
        return
    if "--home" in words[:-1] and Path(words[words.index("--home") + 1]) != context.home.expanduser().resolve():
        yield Check("service", "warning", f"{unit} serves {words[words.index('--home') + 1]}, not {context.home}",
                    "memd install-service   (rewrites the unit for this home)")
    active = systemctl("is-active", UNIT_NAME)
    if active is None or active.returncode not in (0, 3) or not active.stdout.strip():
        yield Check("service", "info", f"{unit} is installed, but no systemd user manager is reachable; autostart stands in")
        return
    state = active.stdout.strip()
    enabled = systemctl("is-enabled", UNIT_NAME)
    enabled_state = enabled.stdout.strip() if enabled is not None else "unknown"
    if state == "active":
        yield Check("service", "ok", f"{UNIT_NAME} is active ({enabled_state})")
    elif state == "failed":
        yield Check("service", "problem", f"{UNIT_NAME} has failed",
                    f"journalctl --user -u {UNIT_NAME}   then: systemctl --user restart {UNIT_NAME}")
    else:
        yield Check("service", "warning", f"{UNIT_NAME} is {state}", f"systemctl --user start {UNIT_NAME}")
    if enabled_state not in ("enabled", "linked", "enabled-runtime"):
        yield Check("service", "warning", f"{UNIT_NAME} is {enabled_state}, so it will not start with your session",
                    f"systemctl --user enable {UNIT_NAME}")
    if context.endpoint != service_endpoint():
        yield Check("service", "warning", f"the service listens on {service_endpoint()}, but this shell uses {context.endpoint}",
                    "unset MEMD_ENDPOINT")


def run_checks(context: Context) -> list[Check]:
    status = daemon_status(context)
    checks: list[Check] = []
    for found in (
        check_home(context), check_memory_dir(context), check_state_dir(context), check_config(context),
        check_daemon(context, status), check_stores(context, status), check_service(context),
    ):
        checks.extend(found)
    return checks
