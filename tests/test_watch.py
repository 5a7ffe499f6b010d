"""The directory watch, both backends: what it reports, what it ignores, and the daemon relying
on it alone (the periodic rescan set to an hour)."""

from __future__ import annotations

import os
import select
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon import store_file, wait_for

from memd.testing import DaemonProcess
from memd.watch import Changed, InotifyWatch, StoreWatch, WatchdogWatch, WatchError, make_watch

BACKENDS = [
    pytest.param("inotify", marks=pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")),
    "watchdog",
]


@pytest.fixture(params=BACKENDS)
def watched(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[StoreWatch, Path]]:
    directory = tmp_path / "memories"
    directory.mkdir()
    watch = make_watch(request.param)
    watch.add("work", directory)
    watch.start()
    try:
        yield watch, directory
    finally:
        watch.stop()


def collect(watch: StoreWatch, wanted: Changed | None = None, seconds: float = 5.0) -> Changed:
    """What the watch reports within `seconds`, or as soon as all of `wanted` was reported."""
    changed: Changed = set()
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        if select.select([watch.wake_fd], [], [], remaining)[0]:
            changed |= watch.drain()
        if wanted is not None and wanted <= changed:
            break
    return changed


def test_an_append_is_reported(watched: tuple[StoreWatch, Path]) -> None:
    watch, directory = watched
    with open(directory / "MEMORY.md", "a", encoding="utf-8") as shell:
        shell.write("free text")
    assert collect(watch, {("work", "memory")}) == {("work", "memory")}


def test_a_save_by_rename_and_a_deletion_are_reported(watched: tuple[StoreWatch, Path]) -> None:
    watch, directory = watched
    (directory / ".USER.md.swp").write_text("Likes tea", encoding="utf-8")
    os.replace(directory / ".USER.md.swp", directory / "USER.md")
    assert ("work", "user") in collect(watch, {("work", "user")})
    os.unlink(directory / "USER.md")
    assert ("work", "user") in collect(watch, {("work", "user")})


def test_other_files_in_the_directory_are_not_reported(watched: tuple[StoreWatch, Path]) -> None:
    # memd's own temp files, the lock file and backups change with every write.
    watch, directory = watched
    for name in (".MEMORY.md.1a2b.tmp", "MEMORY.md.lock", "MEMORY.md.bak.1700000000", "notes.txt"):
        (directory / name).write_text("x", encoding="utf-8")
    os.replace(directory / ".MEMORY.md.1a2b.tmp", directory / ".MEMORY.md.3c4d.tmp")
    assert collect(watch, seconds=0.5) == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_a_directory_deleted_and_made_again_is_watched_again(tmp_path: Path) -> None:
    directory = tmp_path / "memories"
    directory.mkdir()
    watch = InotifyWatch()
    try:
        watch.add(None, directory)
        shutil.rmtree(directory)
        # Its stores went with it: both are reported.
        assert collect(watch, {(None, "memory"), (None, "user")}) == {(None, "memory"), (None, "user")}
        directory.mkdir()
        watch.revive()  # the daemon calls this before each periodic rescan
        (directory / "MEMORY.md").write_text("back", encoding="utf-8")
        assert (None, "memory") in collect(watch, {(None, "memory")})
    finally:
        watch.stop()


def test_the_backend_is_chosen_by_name_and_a_wrong_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = make_watch("watchdog")
    try:
        assert isinstance(chosen, WatchdogWatch)
    finally:
        chosen.stop()
    with pytest.raises(WatchError, match="'fanotify' is not a watch"):
        make_watch("fanotify")
    monkeypatch.setenv("MEMD_WATCH", "watchdog")
    chosen = make_watch()
    try:
        assert isinstance(chosen, WatchdogWatch)
    finally:
        chosen.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_linux_reads_inotify_itself_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMD_WATCH", raising=False)
    chosen = make_watch()
    try:
        assert isinstance(chosen, InotifyWatch)
    finally:
        chosen.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_daemon_backs_up_drift_through_the_watch_alone(tmp_path: Path, backend: str) -> None:
    home = tmp_path / "home"
    (home / "memories").mkdir(parents=True)
    (home / "config.yaml").write_text("memd:\n  rescan_seconds: 3600\n", encoding="utf-8")
    with DaemonProcess.start_new(home, env={"MEMD_WATCH": backend}) as daemon, daemon.client() as client:
        session = client.open_session("cli")
        assert session.memory(action="add", content="The repo uses uv.")["success"]
        memory_file = store_file(home, "memory")
        with open(memory_file, "a", encoding="utf-8") as shell:
            shell.write("\n§\nThe repo uses uv.")  # the same entry twice: drift
        drifted = memory_file.read_bytes()
        wait_for(
            lambda: any(backup.read_bytes() == drifted for backup in memory_file.parent.glob("MEMORY.md.bak.*")),
            2.0, "a backup made on the watch's event", interval=0.01,
        )
        assert client.status()["stores"]["memory"]["drift"] is not None


def test_a_daemon_asked_for_an_unknown_watch_refuses_to_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    daemon = DaemonProcess(home, f"ipc://{tmp_path}/m.sock", env={"MEMD_WATCH": "fanotify"})
    with pytest.raises(RuntimeError, match="exited with 1"):
        daemon.start(timeout=10)
    assert "MEMD_WATCH='fanotify' is not a watch" in daemon.log()
