"""Shared fixtures: a real daemon process in a temporary home."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memd.testing import DaemonProcess


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    """A fresh daemon with a fresh home; always stopped afterwards."""
    process = DaemonProcess.start_new()
    try:
        yield process
    finally:
        process.close()
