"""CURVE keys for tcp endpoints, kept owner-only in the home.

The daemon has one key pair; clients authenticate with a client key pair whose public half is
in the authorised directory. A client on the same machine reads both from the home; a remote one
is given a copy of `server.key` and `client.key_secret` (see README, security model).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from memd.config import state_dir
from memd_client.protocol import curve_dir_for


@dataclass
class CurveKeys:
    directory: Path
    public: bytes
    secret: bytes
    authenticator: ThreadAuthenticator | None = None

    @property
    def authorised_dir(self) -> Path:
        return self.directory / "authorized"

    @classmethod
    def ensure(cls, home: Path) -> CurveKeys:
        """Load the daemon's keys, creating them (and a first client key pair) if missing."""
        state_dir(home)
        directory = curve_dir_for(home)
        old_umask = os.umask(0o077)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            for name in ("server", "client"):
                if not (directory / f"{name}.key_secret").exists():
                    zmq.auth.create_certificates(directory, name)
            authorised = directory / "authorized"
            authorised.mkdir(exist_ok=True, mode=0o700)
            if not any(authorised.glob("*.key")):
                shutil.copy(directory / "client.key", authorised / "client.key")
        finally:
            os.umask(old_umask)
        for path in directory.rglob("*"):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
        public, secret = zmq.auth.load_certificate(directory / "server.key_secret")
        assert secret is not None
        return cls(directory, public, secret)

    def start_authenticator(self, context: zmq.Context) -> None:
        """Only clients whose public key is in the authorised directory get through."""
        self.authenticator = ThreadAuthenticator(context)
        self.authenticator.start()
        self.authenticator.configure_curve(domain="*", location=str(self.authorised_dir))

    def serve(self, socket: zmq.Socket) -> None:
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_server = True

    def stop_authenticator(self) -> None:
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
