"""Store files on disk (SPEC §2, §6): validated reads, atomic durable writes, the shared lock, backups."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from memd.disk import (
    DurabilityError,
    latest_backup,
    lock_path_for,
    StoreLock,
    read_store,
    store_lock,
    write_backup,
    write_durably,
)
from memd.engine import Engine
from tests.helpers_core import make_home

INVALID_UTF8 = "Uses vim.\n§\nCaf".encode() + b"\xe9 au lait"  # Latin-1 é inside UTF-8 text


# -- reading --------------------------------------------------------------------------------------

def test_reading_normalises_bom_and_crlf(tmp_path):
    store = tmp_path / "MEMORY.md"
    store.write_bytes("\ufeffa\r\n§\r\nb".encode())
    found = read_store(store)
    assert found.readable and found.exists and found.text == "a\n§\nb"
    assert found.raw == "\ufeffa\r\n§\r\nb".encode()


def test_a_missing_store_reads_as_empty(tmp_path):
    found = read_store(tmp_path / "MEMORY.md")
    assert found.readable and not found.exists and found.text == ""


def test_invalid_utf8_is_unreadable_with_a_clear_reason(tmp_path):
    store = tmp_path / "MEMORY.md"
    store.write_bytes(INVALID_UTF8)
    found = read_store(store)
    assert not found.readable and found.text is None
    assert "not valid UTF-8" in found.error and "byte 16" in found.error


@pytest.mark.parametrize("call", [
    {"action": "add", "content": "New fact."},
    {"action": "replace", "old_text": "vim", "content": "Uses emacs."},
    {"action": "remove", "old_text": "vim"},
    {"operations": [{"action": "add", "content": "New fact."}]},
    {"action": "add", "content": "New fact.", "dry_run": True},
])
def test_an_invalid_utf8_store_refuses_every_write_and_is_left_untouched(tmp_path, call):
    home = make_home(tmp_path)
    store = home / "memories" / "MEMORY.md"
    store.write_bytes(INVALID_UTF8)
    before = os.stat(store)
    engine = Engine(home)
    session = engine.open_session("cli")
    reply = session.memory(**call)
    assert reply["success"] is False and reply["code"] == "unreadable" and reply["done"] is True
    assert "MEMORY.md" in reply["error"] and "UTF-8" in reply["error"]
    assert store.read_bytes() == INVALID_UTF8
    assert os.stat(store).st_ino == before.st_ino and os.stat(store).st_mtime_ns == before.st_mtime_ns
    assert session.snapshot.memory is None  # nothing undecodable reaches a prompt
    # The other store is unaffected.
    assert session.memory(action="add", target="user", content="Called Priya.")["success"] is True


def test_a_repaired_store_accepts_writes_again(tmp_path):
    home = make_home(tmp_path)
    store = home / "memories" / "MEMORY.md"
    store.write_bytes(INVALID_UTF8)
    engine = Engine(home)
    session = engine.open_session("cli")
    assert session.memory(action="add", content="x")["code"] == "unreadable"
    store.write_text("Uses vim.", encoding="utf-8")
    assert session.memory(action="add", content="Café au lait.")["code"] == "ok"
    assert store.read_text(encoding="utf-8") == "Uses vim.\n§\nCafé au lait."


# -- writing --------------------------------------------------------------------------------------

def test_a_durable_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path):
    store = tmp_path / "MEMORY.md"
    store.write_text("old", encoding="utf-8")
    with open(store, "rb") as reader_before:
        raw = write_durably(store, "new\n§\nCafé")
        # Atomic replacement: a reader that opened the old file still reads all of it.
        assert reader_before.read() == b"old"
    assert raw == "new\n§\nCafé".encode() and store.read_bytes() == raw
    assert sorted(os.listdir(tmp_path)) == ["MEMORY.md"]


def test_a_failed_write_raises_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "MEMORY.md"
    target.mkdir()  # a directory cannot be replaced by a file
    (target / "keep").write_text("k")
    with pytest.raises(DurabilityError, match="could not durably write"):
        write_durably(target, "text")
    assert sorted(os.listdir(tmp_path)) == ["MEMORY.md"]
    assert (target / "keep").read_text() == "k"


def test_engine_writes_leave_only_the_store_and_its_lock(tmp_path):
    home = make_home(tmp_path)
    session = Engine(home).open_session("cli")
    for index in range(5):
        session.memory(action="add", content=f"Fact {index}.")
    session.memory(action="add", target="user", content="Called Priya.")
    assert sorted(os.listdir(home / "memories")) == ["MEMORY.md", "MEMORY.md.lock", "USER.md", "USER.md.lock"]


# -- the lock shared with Hermes -----------------------------------------------------------------

def test_the_lock_file_sits_beside_the_store_with_mode_0600(tmp_path):
    store = tmp_path / "MEMORY.md"
    assert lock_path_for(store) == tmp_path / "MEMORY.md.lock"
    with store_lock(store):
        mode = stat.S_IMODE(os.stat(tmp_path / "MEMORY.md.lock").st_mode)
    assert mode == 0o600


def test_a_symlinked_lock_file_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("precious")
    store = tmp_path / "MEMORY.md"
    (tmp_path / "MEMORY.md.lock").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="symbolic link"), store_lock(store):
        pass
    assert elsewhere.read_text() == "precious"


def test_a_dangling_symlinked_lock_file_is_refused_and_creates_nothing(tmp_path):
    store = tmp_path / "MEMORY.md"
    (tmp_path / "MEMORY.md.lock").symlink_to(tmp_path / "target-of-link")
    with pytest.raises(PermissionError), store_lock(store):
        pass
    assert not (tmp_path / "target-of-link").exists()


def test_the_engine_refuses_a_home_whose_lock_file_is_a_symlink(tmp_path):
    home = make_home(tmp_path, memory=["Uses vim."])
    (home / "memories" / "MEMORY.md.lock").symlink_to(tmp_path / "attacker-chosen")
    with pytest.raises(PermissionError):
        Engine(home)
    assert not (tmp_path / "attacker-chosen").exists()
    assert (home / "memories" / "MEMORY.md").read_text(encoding="utf-8") == "Uses vim."


def taken_elsewhere(store) -> bool:
    """Whether another process, opening the lock file by its path as Hermes does, finds it taken."""
    probe = textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(lock_path_for(store))!r}, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(3)
        sys.exit(0)
    """)
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 3


def test_while_memd_holds_the_lock_another_process_cannot_take_it(tmp_path):
    store = tmp_path / "MEMORY.md"
    with store_lock(store):
        assert taken_elsewhere(store)
    assert not taken_elsewhere(store)


# -- backups ----------------------------------------------------------------------------------------

def test_a_backup_holds_the_given_bytes_under_the_unix_time(tmp_path):
    store = tmp_path / "MEMORY.md"
    backup = write_backup(store, b"pre-existing\xe9", 1_700_000_000.7)
    assert backup == tmp_path / "MEMORY.md.bak.1700000000"
    assert backup.read_bytes() == b"pre-existing\xe9"
    assert stat.S_IMODE(os.stat(backup).st_mode) == 0o600


def test_a_backup_never_overwrites_an_earlier_one(tmp_path):
    store = tmp_path / "MEMORY.md"
    first = write_backup(store, b"first", 1_700_000_000)
    second = write_backup(store, b"second", 1_700_000_000)
    third = write_backup(store, b"third", 1_700_000_000)
    assert first.read_bytes() == b"first" and second.read_bytes() == b"second" and third.read_bytes() == b"third"
    assert [first.name, second.name, third.name] == [
        "MEMORY.md.bak.1700000000", "MEMORY.md.bak.1700000001", "MEMORY.md.bak.1700000002",
    ]
    assert latest_backup(store) == third


def test_the_same_bytes_in_the_same_second_are_backed_up_once(tmp_path):
    store = tmp_path / "MEMORY.md"
    assert write_backup(store, b"same", 1_700_000_000) == write_backup(store, b"same", 1_700_000_000)
    assert len(list(tmp_path.iterdir())) == 1


def test_latest_backup_picks_the_newest_and_ignores_other_files(tmp_path):
    store = tmp_path / "MEMORY.md"
    assert latest_backup(store) is None
    write_backup(store, b"b", 1_700_000_500)
    write_backup(store, b"a", 1_700_000_020)
    (tmp_path / "MEMORY.md.bak.notes").write_text("x")
    write_backup(tmp_path / "USER.md", b"u", 1_800_000_000)
    assert latest_backup(store) == tmp_path / "MEMORY.md.bak.1700000500"


def test_a_kept_lock_still_excludes_others_after_its_file_was_deleted_or_replaced(tmp_path):
    # The engine keeps its lock files open between writes; Hermes opens the path every time.
    store = tmp_path / "MEMORY.md"
    lock = StoreLock(store)
    try:
        with lock:
            pass
        lock_path_for(store).unlink()
        with lock:
            assert taken_elsewhere(store)
        replacement = tmp_path / "other.lock"
        replacement.write_text("")
        os.replace(replacement, lock_path_for(store))
        with lock:
            assert taken_elsewhere(store)
        assert not taken_elsewhere(store)
    finally:
        lock.close()
