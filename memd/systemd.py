"""The systemd notify protocol (`Type=notify`): one datagram per message to `$NOTIFY_SOCKET`."""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING to systemd; does nothing when not run by systemd."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        environ = dict(os.environ if environ is None else environ)
        address = environ.get("NOTIFY_SOCKET", "")
        # An address starting with '@' is in the abstract namespace, spelled with a NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        if not hasattr(socket, "AF_UNIX"):
            self.address = ""  # no systemd where there are no Unix sockets
        watchdog_usec = environ.get("WATCHDOG_USEC", "")
        watchdog_pid = environ.get("WATCHDOG_PID", "")
        for_us = not watchdog_pid or watchdog_pid == str(os.getpid())
        # systemd asks for a ping at least every WATCHDOG_USEC; pinging at half leaves a margin.
        self.watchdog_interval = int(watchdog_usec) / 2e6 if watchdog_usec.isdigit() and for_us else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> None:
        if not self.address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto("\n".join(fields).encode("utf-8"), self.address)
            except OSError:
                pass  # systemd gone or socket unwritable: notification is best effort by design

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")
