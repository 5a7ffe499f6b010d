"""The `memd` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from memd.config import ConfigError, default_home, load_settings
from memd_client import protocol as wire


def daemon_endpoint(given: str | None) -> str:
    """The endpoint `memd serve` binds: the flag, `$MEMD_ENDPOINT`, systemd's runtime directory,
    else the client's default (so that clients find the daemon without being told)."""
    if given:
        return given
    if os.environ.get("MEMD_ENDPOINT"):
        return os.environ["MEMD_ENDPOINT"]
    runtime_directory = os.environ.get("RUNTIME_DIRECTORY")
    if runtime_directory:
        return f"ipc://{Path(runtime_directory.split(':')[0]) / 'memd.sock'}"
    return wire.default_endpoint()


def cmd_serve(args: argparse.Namespace) -> int:
    from memd.server import serve

    home = Path(args.home).expanduser() if args.home else default_home()
    try:
        settings = load_settings(home, Path(args.config) if args.config else None)
    except ConfigError as error:
        logging.getLogger("memd").error("memd cannot start: %s", error)
        return 2
    return serve(settings, daemon_endpoint(args.endpoint))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memd", description="Shared, self-curating memory for AI agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--home", help="memory home (default: $HERMES_HOME or ~/.hermes)")
    serve.add_argument("--endpoint", help="ipc://PATH or tcp://HOST:PORT (default: $MEMD_ENDPOINT or the runtime dir)")
    serve.add_argument("--config", help="config file (default: <home>/config.yaml)")
    serve.set_defaults(run=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="memd: %(levelname)s %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    return args.run(args)
