"""What the proof harnesses (crashtest, concurrency, fuzz, soak, drift) share.

Each harness is a script that prints its figures and exits non-zero on any violation, and a
function with parameters that the test suite runs in a small, fast form. They start real daemons
(`memd.testing.DaemonProcess`) in throwaway homes and always stop them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memd.core.format import DELIMITER, drift_reason, parse_entries
from memd.disk import decode_store
from memd.testing import DaemonProcess

FILENAMES = {"memory": "MEMORY.md", "user": "USER.md"}
MAX_DETAILS = 40  # violations printed in full; the rest are only counted


@dataclass
class Report:
    """Figures to publish and violations found; a harness passes when there are none."""

    title: str
    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0

    def figure(self, name: str, value: Any) -> None:
        self.figures[name] = value

    def violation(self, text: str) -> None:
        self.violation_count += 1
        if len(self.violations) < MAX_DETAILS:
            self.violations.append(text)

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def render(self) -> str:
        lines = [f"== {self.title} =="]
        width = max((len(name) for name in self.figures), default=0)
        for name, value in self.figures.items():
            lines.append(f"  {name.ljust(width)}  {value}")
        lines.append(f"  {'violations'.ljust(width)}  {self.violation_count}")
        for text in self.violations:
            lines.append(f"    ! {text}")
        if self.violation_count > len(self.violations):
            lines.append(f"    ! ... and {self.violation_count - len(self.violations)} more")
        return "\n".join(lines)

    def exit_status(self) -> int:
        print(self.render(), flush=True)
        return 0 if self.ok else 1


# -- homes and daemons -----------------------------------------------------------------------


@contextlib.contextmanager
def running_daemon(config: Mapping[str, Any] | None = None) -> Iterator[DaemonProcess]:
    """A daemon serving a fresh home (with `config` as its config.yaml); always stopped and
    removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="memd-harness-"))
    home = scratch / "home"
    home.mkdir()
    if config:
        (home / "config.yaml").write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
    daemon: DaemonProcess | None = None
    try:
        daemon = DaemonProcess.start_new(home)
        yield daemon
    finally:
        if daemon is not None:
            daemon.close()
        shutil.rmtree(scratch, ignore_errors=True)


def memories_dir(home: Path, profile: str | None = None) -> Path:
    return (home if profile is None else home / "profiles" / profile) / "memories"


def log_problems(daemon: DaemonProcess) -> list[str]:
    """Lines of the daemon's log that show a crash or a bug (tracebacks, critical errors)."""
    return [line for line in daemon.log().splitlines() if "Traceback" in line or "CRITICAL" in line]


def rss_kb(pid: int) -> int | None:
    """Resident set size of a process, from /proc (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def process_alive(daemon: DaemonProcess) -> bool:
    return daemon.process is not None and daemon.process.poll() is None


# -- store files -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskStore:
    """A store file as a checker sees it: raw bytes, entries, and what is wrong with it."""

    raw: bytes
    entries: tuple[str, ...]
    problem: str | None  # None when the file decodes and is clean (no drift)


def read_disk_store(path: Path, limit: int) -> DiskStore:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return DiskStore(b"", (), None)
    text, problem = decode_store(raw)
    if text is None:
        return DiskStore(raw, (), f"unreadable: {problem}")
    reason = drift_reason(text, limit)
    return DiskStore(raw, tuple(parse_entries(text)), None if reason is None else f"drift: {reason}")


def temp_files(directory: Path) -> list[Path]:
    """Temp files memd's atomic writes leave behind when killed mid-write."""
    return [path for name in FILENAMES.values() for path in directory.glob(f".{name}.*.tmp")]


def hermes_write(store: Path, transform: Any) -> bytes:
    """Rewrite `store` the way Hermes does: exclusive flock on `<store>.lock`, read, change,
    temp file + fsync + os.replace. `transform(old_text) -> new_text`. Returns the bytes written."""
    lock = store.with_name(store.name + ".lock")
    with open(lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            try:
                old = store.read_bytes().decode("utf-8", errors="replace")
            except FileNotFoundError:
                old = ""
            raw = transform(old).encode("utf-8")
            fd, temp = tempfile.mkstemp(dir=store.parent, prefix=".mem_", suffix=".tmp")
            with os.fdopen(fd, "wb") as out:
                out.write(raw)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, store)
            return raw
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def hermes_append(store: Path, entry: str, drop: str | None = None) -> None:
    """Append one entry the Hermes way (under the shared lock), removing `drop` if given."""
    def append(old: str) -> str:
        kept = [item.strip() for item in old.split(DELIMITER) if item.strip() and item.strip() != drop]
        return DELIMITER.join([*kept, entry])

    hermes_write(store, append)


# -- figures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value below which `fraction` of `values` lie (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, int(round(fraction * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def latency_lines(latencies: Mapping[str, Sequence[float]]) -> dict[str, str]:
    """`kind -> "n=…  p50 …ms  p99 …ms  max …ms"` for every kind measured."""
    return {
        kind: (
            f"n={len(values):,}  p50 {percentile(values, 0.50) * 1000:.2f} ms  "
            f"p99 {percentile(values, 0.99) * 1000:.2f} ms  max {max(values) * 1000:.1f} ms"
        )
        for kind, values in sorted(latencies.items()) if values
    }


class Deadline:
    """A bound in time for a loop (every loop in a harness is bounded in count and time)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.end

    @property
    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    """Poll `predicate()` until it is true or `timeout` passes; returns whether it became true."""
    deadline = Deadline(timeout)
    while True:
        if predicate():
            return True
        if deadline.passed:
            return False
        time.sleep(interval)
