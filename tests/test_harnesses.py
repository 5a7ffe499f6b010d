"""The proof harnesses in small: crash, concurrency, bad input, soak and drift (scripts/*.py).

Each test runs the harness's own function with small parameters against real daemons and fails
on any violation it reports. Then come regression tests for the bugs the harnesses found, made
deterministic by doing the outside edit exactly inside the window the harness hit by chance.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import memd.engine as engine_module
from memd.core.format import DELIMITER, parse_entries
from memd.disk import MAX_STORE_BYTES, PreparedWrite
from memd.engine import Engine

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))


# -- the harnesses, small -------------------------------------------------------------------------


def test_crashtest_acknowledged_writes_survive_sigkill_and_nothing_is_half_applied() -> None:
    from crashtest import run_crashtest

    report = run_crashtest(cycles=6, writers=3, max_kill_delay=0.4, seed=20240601)
    assert report.ok, report.render()
    assert report.figures["cycles run"] == 6


def test_concurrency_loses_no_update_among_client_processes_and_a_hermes_writer() -> None:
    from concurrency import run_concurrency

    report = run_concurrency(clients=6, seconds=3.0, external_interval=0.05, seed=20240602)
    assert report.ok, report.render()


def test_fuzz_hostile_frames_never_crash_the_daemon_or_disturb_valid_requests() -> None:
    from fuzz import run_fuzz

    report = run_fuzz(frames=4000, giants=1, seed=20240603)
    assert report.ok, report.render()


def test_soak_abandoned_sessions_expire_and_memory_and_latency_stay_flat() -> None:
    from soak import run_soak

    report = run_soak(minutes=0.25, sample_seconds=1.0, open_rate=20.0, write_rate=20.0, external_interval=0.5, seed=20240604, echo=False)
    assert report.ok, report.render()


def test_drift_outside_edits_are_adopted_or_backed_up_and_never_overwritten() -> None:
    from drift import run_drift

    report = run_drift(rounds=2, seed=20240605)
    assert report.ok, report.render()


# -- regressions ---------------------------------------------------------------------------------


def store_of(engine: Engine) -> Path:
    return engine.stores["memory"].path


def backups_of(engine: Engine) -> list[bytes]:
    path = store_of(engine)
    return [backup.read_bytes() for backup in path.parent.glob(f"{path.name}.bak.*")]


def test_an_unlocked_append_while_a_rewrite_is_made_durable_is_taken_in_not_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # drift.py: a shell `>>` between memd's re-read under the lock and its rename was lost.
    engine = Engine(tmp_path)
    session = engine.open_session("test")
    session.memory(action="add", content="first fact")
    real_prepare = engine_module.prepare_write
    appended = []

    def prepare_while_a_shell_appends(path: Path, text: str) -> PreparedWrite:
        prepared = real_prepare(path, text)
        if not appended:
            with open(path, "ab") as shell:
                shell.write(b"\n\xc2\xa7\nappended by a shell")
            appended.append(True)
        return prepared

    monkeypatch.setattr(engine_module, "prepare_write", prepare_while_a_shell_appends)
    reply = session.memory(action="replace", old_text="first fact", content="second fact")
    assert reply["code"] == "ok"
    assert parse_entries(store_of(engine).read_text(encoding="utf-8")) == ["second fact", "appended by a shell"]
    assert engine.entries("memory") == ["second fact", "appended by a shell"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the atomic swap is Linux's renameat2")
def test_an_editor_save_in_the_instant_before_the_rename_is_kept_in_a_backup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(tmp_path)
    session = engine.open_session("test")
    session.memory(action="add", content="first fact")
    real_publish = PreparedWrite.swap_in

    def editor_saves_first(self: PreparedWrite, expected_digest: str):  # type: ignore[no-untyped-def]
        saved = self.path.with_name(".editor.swp")
        saved.write_bytes("first fact\n§\nsaved by an editor".encode())
        os.replace(saved, self.path)
        return real_publish(self, expected_digest)

    monkeypatch.setattr(PreparedWrite, "swap_in", editor_saves_first)
    assert session.memory(action="add", content="second fact")["code"] == "ok"
    assert any(b"saved by an editor" in backup for backup in backups_of(engine))


def appended_through_the_displaced_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes, later_writes: int = 0) -> Engine:
    """An engine whose second write swapped out a file that a slow shell's `>>` had opened before the
    swap and wrote `text` into after it (and after `later_writes` more writes)."""
    engine = Engine(tmp_path)
    session = engine.open_session("test")
    session.memory(action="add", content="first fact")
    real_publish = PreparedWrite.swap_in
    slow_shell = []

    def shell_opens_first(self: PreparedWrite, expected_digest: str):  # type: ignore[no-untyped-def]
        if not slow_shell:
            slow_shell.append(open(self.path, "ab"))  # noqa: SIM115 - written to after the swap
        return real_publish(self, expected_digest)

    monkeypatch.setattr(PreparedWrite, "swap_in", shell_opens_first)
    assert session.memory(action="add", content="second fact")["code"] == "ok"
    for number in range(later_writes):
        assert session.memory(action="add", content=f"later fact {number}")["code"] == "ok"
    with slow_shell[0] as shell:
        shell.write(text)
    engine.check_external()  # the daemon does this on every rescan
    return engine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the atomic swap is Linux's renameat2")
def test_an_append_into_the_file_a_rewrite_displaced_is_kept_in_a_backup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # drift.py: a 500 kB `>>` that had opened the old file before the swap wrote into it after.
    engine = appended_through_the_displaced_file(tmp_path, monkeypatch, b"\n\xc2\xa7\nappended through the old file")
    assert any(b"appended through the old file" in backup for backup in backups_of(engine))
    assert engine.entries("memory") == ["first fact", "second fact"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the atomic swap is Linux's renameat2")
def test_an_append_of_more_than_a_store_may_hold_into_the_displaced_file_is_kept_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # drift.py under load: a paste of over 8 MiB through the old file kept its start in a backup, lost its end.
    paste = b"\nhuge paste start " + b"p" * (MAX_STORE_BYTES + 1024) + b" huge paste end\n"
    engine = appended_through_the_displaced_file(tmp_path, monkeypatch, paste)
    assert any(paste in backup for backup in backups_of(engine))
    assert engine.entries("memory") == ["first fact", "second fact"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the atomic swap is Linux's renameat2")
def test_an_append_into_a_displaced_file_after_many_later_writes_is_kept_in_a_backup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # drift.py in CI: a `>>` into the old file came after a dozen more writes had pushed that file out of the
    # eight memd kept open, and was lost.
    engine = appended_through_the_displaced_file(tmp_path, monkeypatch, b"\nlate text from a slow shell\n", 12)
    assert any(b"late text from a slow shell" in backup for backup in backups_of(engine))
    assert engine.entries("memory")[:2] == ["first fact", "second fact"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the atomic swap is Linux's renameat2")
def test_an_append_into_a_displaced_file_within_its_second_is_kept_however_many_writes_came_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # drift.py in CI again: at some six hundred writes a second, sixty-four later writes took a tenth of a second,
    # and a `>>` that came after them into the old file was lost. (The second is stretched here, so that a slow
    # disk's fsyncs cannot age the version out; the count alone must not let it go.)
    monkeypatch.setattr("memd.engine.DISPLACED_SECONDS", 3600.0)
    engine = appended_through_the_displaced_file(tmp_path, monkeypatch, b"\nlater still, from a slower shell\n", 100)
    engine.close()  # the last look at every version still held (the daemon's comes when the second is up)
    assert any(b"later still, from a slower shell" in backup for backup in backups_of(engine))
    assert engine.entries("memory")[:2] == ["first fact", "second fact"]


def test_a_store_emptied_from_outside_keeps_its_last_content_in_a_backup(tmp_path: Path) -> None:
    # drift.py: `: > MEMORY.md` lost every entry silently, while deleting the file kept a backup.
    engine = Engine(tmp_path)
    session = engine.open_session("test")
    for fact in ("first fact", "second fact"):
        session.memory(action="add", content=fact)
    os.truncate(store_of(engine), 0)
    engine.check_external()
    assert engine.entries("memory") == []
    assert DELIMITER.join(["first fact", "second fact"]).encode() in backups_of(engine)


def test_temp_files_left_by_a_killed_write_are_removed_at_start(tmp_path: Path) -> None:
    # crashtest.py: a SIGKILL during a write leaves `.MEMORY.md.<random>.tmp`; one per crash.
    memories = tmp_path / "memories"
    memories.mkdir()
    (memories / "MEMORY.md").write_text("kept", encoding="utf-8")
    left = [memories / ".MEMORY.md.k1ll3d.tmp", memories / ".USER.md.k1ll3d.tmp"]
    hermes_temp = memories / ".mem_abc123.tmp"  # Hermes's own name: not memd's to remove
    for path in (*left, hermes_temp):
        path.write_text("half a write", encoding="utf-8")
    engine = Engine(tmp_path)
    assert not any(path.exists() for path in left)
    assert hermes_temp.exists()
    assert engine.entries("memory") == ["kept"]


def test_profiles_beyond_a_bound_are_refused() -> None:
    # fuzz.py: every profile name a client sent cost a directory, an engine and a watch thread,
    # for the daemon's life (2,500 names: 2,507 threads).
    from harness_common import running_daemon

    from memd.server import MAX_PROFILES
    from memd_client import RequestRefused

    with running_daemon() as daemon, daemon.client() as client:
        for number in range(MAX_PROFILES + 5):
            (daemon.home / "profiles" / f"made-up-{number}").mkdir(parents=True)
        refused = 0
        for number in range(MAX_PROFILES + 5):
            try:
                client.status(profile=f"made-up-{number}")
            except RequestRefused as error:
                assert error.code == "invalid"
                refused += 1
        assert refused == 6  # the home's own engine counts too
        assert len(client.status()["profiles"]) == MAX_PROFILES
        assert client.entries("memory", profile="made-up-1") == []  # those served still are


def test_the_reply_cache_is_bounded_in_bytes_and_refusals_do_not_quote_megabytes(tmp_path: Path) -> None:
    # fuzz.py: refusals quoted the client's megabyte strings, and 8,192 of them stayed cached
    # (RSS 33 -> 157 MB in 20,000 hostile frames).
    from memd.config import Settings
    from memd.server import MAX_MESSAGE_CHARS, REPLY_CACHE_BYTES, Daemon, Refused

    class Socket:
        def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
            pass

    refusal = Daemon.failure_reply("id", Refused(f"unknown target {'t' * 1_000_000!r}"))
    assert len(refusal) < MAX_MESSAGE_CHARS + 200
    daemon = Daemon(Settings(home=tmp_path), "ipc://unused")
    try:
        daemon.router = Socket()  # type: ignore[assignment]
        for number in range(100):
            daemon.answer([b"peer"], f"request-{number}", b"r" * 1_000_000)
        assert daemon.reply_cache_bytes == sum(len(reply) for reply in daemon.reply_cache.values())
        assert daemon.reply_cache_bytes <= REPLY_CACHE_BYTES
        assert "request-99" in daemon.reply_cache  # the newest are kept
    finally:
        daemon.router = None
        daemon.context.term()
