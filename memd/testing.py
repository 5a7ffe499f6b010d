"""A real memd daemon in a child process, for tests, harnesses and agents' own integration tests.

    with DaemonProcess.start_new() as daemon:
        with daemon.client() as client:
            session = client.open_session("test")

The daemon runs `python -m memd serve` on an ipc socket under a short temporary directory (Unix
socket paths are limited to about 107 bytes) and is ready when it answers `hello`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memd_client import Client, DaemonUnavailable, MemdError
from memd_client.protocol import curve_dir_for


class DaemonProcess:
    def __init__(
        self, home: Path, endpoint: str, *, env: dict[str, str] | None = None, log_path: Path | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> None:
        self.home = home
        # Run in the child before memd starts (POSIX only): to lower a limit it must cope with, say.
        self.preexec_fn = preexec_fn
        self.endpoint = endpoint
        # A test run under systemd must not make its daemons talk to the real systemd.
        inherited = {key: value for key, value in os.environ.items() if key not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        self.env = {**inherited, **(env or {})}
        self.log_path = log_path or home / "memd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._scratch: str | None = None

    @classmethod
    def start_new(
        cls, home: Path | None = None, *, env: dict[str, str] | None = None, timeout: float = 15.0,
        preexec_fn: Callable[[], object] | None = None,
    ) -> DaemonProcess:
        """A daemon on a fresh short socket path; a fresh home unless one is given."""
        scratch = tempfile.mkdtemp(prefix="memd-", dir="/tmp" if os.path.isdir("/tmp") else None)
        if home is None:
            home = Path(scratch) / "home"
        home.mkdir(parents=True, exist_ok=True)
        daemon = cls(home, f"ipc://{scratch}/m.sock", env=env, preexec_fn=preexec_fn)
        daemon._scratch = scratch
        daemon.start(timeout=timeout)
        return daemon

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 15.0) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "memd", "serve", "--home", str(self.home), "--endpoint", self.endpoint],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                preexec_fn=self.preexec_fn,
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()  # a daemon that never became ready must not outlive the caller
            raise

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Ask until the daemon answers; fail early if it exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"memd exited with {self.process.returncode}:\n{self.log()}")
            try:
                with self.client(timeout=0.5, retries=0) as client:
                    client.hello()
                return
            except DaemonUnavailable:
                continue
            except MemdError:
                time.sleep(0.02)  # tcp: the daemon has not written its CURVE keys yet
                continue
        raise RuntimeError(f"memd did not become ready within {timeout}s:\n{self.log()}")

    def client(self, **options: Any) -> Client:
        options.setdefault("timeout", 10.0)
        if self.endpoint.startswith("tcp://"):
            options.setdefault("curve_dir", curve_dir_for(self.home))  # the keys the daemon made
        return Client(self.endpoint, autostart=False, **options)

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the daemon and wait for it; returns its exit status."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, timeout: float = 15.0) -> None:
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        self.stop()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
