"""Edits made outside the daemon: drift is backed up at once and guards rewrites; clean edits,
such as Hermes writing the same directory under its lock, are adopted."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from memd_client import protocol as wire
from test_daemon import fork, hermes_write, store_file, wait_for

from memd.core.format import DELIMITER, parse_entries

FIRST = ["The repo uses uv for dependencies.", "Tests run with pytest -q.", "The staging host is stage.example.org."]


def backups_of(store: Path) -> list[Path]:
    return sorted(store.parent.glob(store.name + ".bak.*"))


def test_free_text_appended_outside_is_backed_up_at_once_and_guards_rewrites(daemon):
    memory_file = store_file(daemon.home, "memory")
    with daemon.client() as client:
        session = client.open_session("cli")
        for entry in FIRST:
            assert session.memory(action="add", content=entry)["success"]
        assert session.memory(action="add", target="user", content="Likes terse replies.")["success"]
        assert backups_of(memory_file) == []

        # A shell `>>`: free text glued to the last entry, longer than the whole limit.
        appended = "\nNotes from the terminal: " + "rotate the logs before the release, " * 70
        written_at = time.time()
        started = time.monotonic()
        with open(memory_file, "a", encoding="utf-8") as handle:
            handle.write(appended)
        drifted = memory_file.read_bytes()
        # No request is sent while waiting: the daemon notices on its own.
        # (The backup file exists a moment before its content is written: wait for the content.)
        wait_for(lambda: any(b.read_bytes() == drifted for b in backups_of(memory_file)), 5,
                 "a backup of the drifted file", interval=0.01)
        took = time.monotonic() - started
        assert took < 2.0, f"the backup was complete after {took:.2f}s"
        [backup] = backups_of(memory_file)
        assert abs(int(backup.name.rsplit(".", 1)[1]) - written_at) <= 5

        drift = client.status()["stores"]["memory"]["drift"]
        assert drift is not None and drift["backup"] == str(backup)
        assert "longer than" in drift["reason"]
        assert client.status()["stores"]["memory"]["last_backup"] == str(backup)
        assert client.status()["stores"]["user"]["drift"] is None

        refusals = [
            session.memory(action="replace", old_text="uv for", content="The repo uses pip."),
            session.memory(action="remove", old_text="pytest"),
            session.memory(operations=[{"action": "remove", "old_text": "staging"}, {"action": "add", "content": "New host."}]),
        ]
        for reply in refusals:
            assert (reply["success"], reply["code"], reply["done"]) == (False, "drift", True), reply
            assert reply["drift_backup"] == str(backup)
            assert str(backup) in reply["error"]
        assert memory_file.read_bytes() == drifted

        # The other store is not affected.
        assert session.memory(action="replace", target="user", old_text="terse", content="Likes terse replies in English.")["success"]

        # A person cleans the file up: the drift is over, rewrites work again.
        clean = [*FIRST, "Rotate the logs before each release."]
        hermes_write(memory_file, clean)
        wait_for(lambda: client.status()["stores"]["memory"]["drift"] is None, 5, "the drift to be resolved")
        assert client.entries("memory") == clean
        reply = session.memory(action="replace", old_text="uv for", content="The repo uses uv 0.5 for dependencies.")
        assert reply["success"] and reply["code"] == "ok", reply
        assert parse_entries(memory_file.read_text(encoding="utf-8"))[0] == "The repo uses uv 0.5 for dependencies."
        assert backups_of(memory_file) == [backup] and backup.read_bytes() == drifted


def drift_and_add(daemon, outside_text: str) -> None:
    """Drift MEMORY.md by appending `outside_text`, then add: it works and keeps that text."""
    memory_file = store_file(daemon.home, "memory")
    with daemon.client() as client:
        session = client.open_session("cli")
        for entry in FIRST:
            assert session.memory(action="add", content=entry)["success"]
        with open(memory_file, "a", encoding="utf-8") as handle:
            handle.write(outside_text)
        drifted = memory_file.read_text(encoding="utf-8")
        wait_for(lambda: client.status()["stores"]["memory"]["drift"], 5, "the drift to be detected")
        reply = session.memory(action="add", content="Releases are tagged vX.Y.Z.")
        assert reply["success"] and reply["code"] == "ok", reply
        text = memory_file.read_text(encoding="utf-8")
        assert text == drifted.rstrip() + DELIMITER + "Releases are tagged vX.Y.Z."
        assert client.status()["stores"]["memory"]["drift"] is not None  # still drifted: nothing was cleaned up


def test_add_still_works_on_a_drifted_store(daemon):
    drift_and_add(daemon, "\n§\n\n§\nA note pasted with a stray delimiter.")


def test_add_still_works_after_free_text_made_an_entry_longer_than_the_limit(daemon):
    drift_and_add(daemon, "\nNotes from the terminal: " + "rotate the logs before the release, " * 70)


def test_a_clean_external_edit_is_adopted(daemon):
    memory_file = store_file(daemon.home, "memory")
    with daemon.client() as client:
        early = client.open_session("early")
        for entry in FIRST:
            assert early.memory(action="add", content=entry)["success"]
        before = client.open_session("before-edit")

        edited = ["Edited in Hermes: the repo uses poetry.", FIRST[1], "Hermes added this one."]
        hermes_write(memory_file, edited)
        wait_for(lambda: client.entries("memory") == edited, 5, "the clean edit to be adopted")
        assert backups_of(memory_file) == []
        assert client.status()["stores"]["memory"]["drift"] is None

        after = client.open_session("after-edit")
        assert "Hermes added this one." in after.snapshot.memory and "uv for" not in after.snapshot.memory
        assert "uv for" in before.snapshot.memory
        assert client.call(wire.Snapshot, session=before.id)["memory"] == before.snapshot.memory

        # Rewrites start from the adopted state.
        assert after.memory(action="replace", old_text="poetry", content="The repo uses poetry 2.")["success"]
        assert parse_entries(memory_file.read_text(encoding="utf-8")) == ["The repo uses poetry 2.", FIRST[1], "Hermes added this one."]


def _hermes_adder(path: str, count: int) -> None:
    """Add entries the way Hermes does: lock, re-read, append, write a temp file, rename."""
    store = Path(path)
    for number in range(count):
        lock_fd = os.open(store.with_name(store.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            current = parse_entries(store.read_text(encoding="utf-8")) if store.exists() else []
            temp = store.with_name(f".{store.name}.hermes.tmp")
            temp.write_text(DELIMITER.join([*current, f"hermes entry {number}"]), encoding="utf-8")
            os.replace(temp, store)
        finally:
            os.close(lock_fd)


def test_hermes_writing_the_same_directory_loses_nothing_and_nothing_is_lost_to_it(daemon):
    """The daemon re-reads the file under the shared lock before every rewrite."""
    memory_file = store_file(daemon.home, "memory")
    with daemon.client() as client:
        session = client.open_session("cli")
        assert session.memory(action="add", content="memd entry start")["success"]
        hermes = fork.Process(target=_hermes_adder, args=(str(memory_file), 40))
        hermes.start()
        try:
            for number in range(40):
                assert session.memory(action="add", content=f"memd entry {number}")["success"]
        finally:
            hermes.join(30)
            if hermes.is_alive():
                hermes.kill()
        assert hermes.exitcode == 0
        entries = parse_entries(memory_file.read_text(encoding="utf-8"))
        expected = {"memd entry start"} | {f"memd entry {n}" for n in range(40)} | {f"hermes entry {n}" for n in range(40)}
        assert set(entries) == expected and len(entries) == len(expected)
        wait_for(lambda: set(client.entries("memory")) == expected, 5, "the daemon to adopt Hermes's last write")
        assert backups_of(memory_file) == []
