"""Thin client for memd: needs only pyzmq and msgspec, and never imports the daemon."""

from memd_client.client import (
    Client, DaemonUnavailable, MemdError, RequestRefused, Session, SessionClosed, SnapshotBlocks,
)
from memd_client.tool import TOOL_SCHEMA, handle_tool_call

__all__ = [
    "Client", "DaemonUnavailable", "MemdError", "RequestRefused", "Session", "SessionClosed",
    "SnapshotBlocks", "TOOL_SCHEMA", "handle_tool_call",
]
