"""The engine of one memory home (SPEC §2-§6): sessions and frozen snapshots, the failure counter,
drift, external edits, and sharing the files with Hermes and with other processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.core.format import drift_reason, parse_entries, serialise_entries
from memd.engine import Engine
from tests.helpers_core import INJECTION, make_home, placeholder

RULE = "═" * 46
NOTES = ["Deploys go through `make ship`.", "Staging is at https://staging.example.com.", "Tests run with `pytest -q`."]


def memory_file(home: Path) -> Path:
    return home / "memories" / "MEMORY.md"


def backups(home: Path, name: str = "MEMORY.md") -> list[Path]:
    return sorted((home / "memories").glob(f"{name}.bak.*"))


def hermes_write(store: Path, entries: list[str]) -> None:
    """Write a store the way Hermes's memory tool does: under the `.lock` flock, temp file + rename."""
    with open(store.with_name(store.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fd, temp = tempfile.mkstemp(dir=store.parent, prefix=".mem_", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("\n§\n".join(entries))
        os.replace(temp, store)


def hermes_read(store: Path) -> list[str]:
    """Read a store the way Hermes's memory tool does."""
    raw = store.read_text(encoding="utf-8")
    return list(dict.fromkeys(entry.strip() for entry in raw.split("\n§\n") if entry.strip()))


# -- sessions and the frozen snapshot ----------------------------------------------------------------

def test_a_snapshot_is_the_rendered_block_of_the_live_state(tmp_path):
    home = make_home(tmp_path, memory=["Uses vim."], user=["Called Priya."])
    session = Engine(home).open_session("cli")
    assert session.snapshot.memory == f"{RULE}\nMEMORY (your personal notes) [0% — 9/2,200 chars]\n{RULE}\nUses vim."
    assert session.snapshot.user == f"{RULE}\nUSER PROFILE (who the user is) [0% — 13/1,375 chars]\n{RULE}\nCalled Priya."


def test_an_empty_home_has_an_empty_snapshot(tmp_path):
    session = Engine(make_home(tmp_path)).open_session("cli")
    assert session.snapshot.memory is None and session.snapshot.user is None


def test_a_snapshot_stays_frozen_until_refresh_and_new_sessions_see_writes(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    cli, gateway = engine.open_session("cli"), engine.open_session("gateway:telegram")
    frozen = cli.snapshot
    assert cli.memory(action="add", content="Uses green tea.")["success"] is True
    assert gateway.memory(action="remove", old_text="pytest")["success"] is True
    assert gateway.memory(action="add", target="user", content="Called Priya.")["success"] is True
    assert cli.snapshot == frozen and "green tea" not in cli.snapshot.memory and cli.snapshot.user is None
    assert engine.entries("memory") == [*NOTES[:2], "Uses green tea."]  # the live state moved on
    fresh = engine.open_session("cron:nightly").snapshot
    assert "green tea" in fresh.memory and "pytest" not in fresh.memory and "Called Priya." in fresh.user
    assert cli.refresh() == fresh and cli.snapshot == fresh


def test_a_poisoned_entry_on_disk_never_reaches_a_snapshot_but_stays_in_the_file(tmp_path):
    home = make_home(tmp_path, memory=[NOTES[0], INJECTION])
    engine = Engine(home)
    snapshot = engine.open_session("cli").snapshot
    assert INJECTION not in snapshot.memory
    assert snapshot.memory.endswith(NOTES[0] + "\n§\n" + placeholder("MEMORY.md", INJECTION))
    assert engine.entries("memory") == [NOTES[0], INJECTION]
    assert engine.open_session("x").memory(action="remove", old_text="previous instructions")["success"] is True
    assert hermes_read(memory_file(home)) == [NOTES[0]]


def test_a_closed_session_can_no_longer_write(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    session = engine.open_session("cli")
    session.close()
    reply = session.memory(action="add", content="Too late.")
    assert reply["success"] is False and reply["code"] == "invalid" and "closed" in reply["error"]
    assert hermes_read(memory_file(home)) == NOTES and engine.sessions == {}


def test_idle_sessions_expire_and_active_ones_stay(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    (home / "config.yaml").write_text("memd:\n  session_idle_seconds: 60\n", encoding="utf-8")
    now = [1_700_000_000.0]
    engine = Engine(home, clock=lambda: now[0])
    idle, busy = engine.open_session("cron:nightly"), engine.open_session("cli")
    now[0] += 45
    busy.memory(action="add", content="Still here.")
    now[0] += 30  # idle: 75 s without a call; busy: 30 s
    assert engine.expire_sessions() == 1
    assert idle.closed and not busy.closed and list(engine.sessions.values()) == [busy]
    assert idle.memory(action="add", content="x")["code"] == "invalid"


# -- writes through the engine -------------------------------------------------------------------------

def test_a_null_target_writes_memory_md(tmp_path):
    home = make_home(tmp_path)
    session = Engine(home).open_session("cli")
    reply = session.memory(action="add", target=None, content="Uses vim.")
    assert reply["success"] is True and reply["target"] == "memory"
    assert memory_file(home).read_text(encoding="utf-8") == "Uses vim."
    assert not (home / "memories" / "USER.md").exists()


def test_an_invalid_target_writes_nothing(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    session = Engine(home).open_session("cli")
    reply = session.memory(action="add", target="notes", content="x")
    assert reply["code"] == "invalid" and reply["success"] is False
    assert hermes_read(memory_file(home)) == NOTES and not (home / "memories" / "notes.md").exists()


def test_the_user_target_writes_user_md(tmp_path):
    home = make_home(tmp_path)
    Engine(home).open_session("cli").memory(action="add", target="user", content="Called Priya.")
    assert (home / "memories" / "USER.md").read_text(encoding="utf-8") == "Called Priya."
    assert not memory_file(home).exists()


def test_a_duplicate_add_does_not_touch_the_file(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    session = Engine(home).open_session("cli")
    before = os.stat(memory_file(home))
    reply = session.memory(action="add", content=NOTES[1])
    assert reply["success"] is True and reply["code"] == "duplicate"
    after = os.stat(memory_file(home))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_dry_run_does_not_touch_the_file(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    session = Engine(home).open_session("cli")
    before = memory_file(home).read_bytes()
    reply = session.memory(operations=[{"action": "remove", "old_text": "pytest"}, {"action": "add", "content": "x"}], dry_run=True)
    assert reply["success"] is True and reply["dry_run"] is True and reply["entry_count"] == 3
    assert memory_file(home).read_bytes() == before


def test_files_written_by_the_engine_parse_back_identically(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    session = engine.open_session("cli")
    session.memory(action="add", content="Multi-line\nentry with § inside.")
    session.memory(action="replace", old_text="Staging", content="  Staging moved to k8s.  ")
    session.memory(operations=[{"action": "remove", "old_text": "make ship"}, {"action": "add", "content": "Café ☕ notes."}])
    session.memory(action="add", target="user", content="Called Priya.\r\nWorks nights.")
    for target, name in (("memory", "MEMORY.md"), ("user", "USER.md")):
        text = (home / "memories" / name).read_text(encoding="utf-8")
        assert hermes_read(home / "memories" / name) == parse_entries(text) == engine.entries(target)
        assert serialise_entries(engine.entries(target)) == text and drift_reason(text, 2200) is None
    assert engine.entries("user") == ["Called Priya.\nWorks nights."]
    restarted = Engine(home)
    assert restarted.entries("memory") == engine.entries("memory") and not backups(home)
    assert restarted.store_status("memory")["drift"] is None


# -- the failure counter ---------------------------------------------------------------------------------

def over_budget_home(tmp_path: Path) -> Path:
    return make_home(tmp_path, memory=["a" * 40, "b" * 37], memory_limit=100)


FAILING_CALLS = [
    {"action": "add", "content": "c" * 50},                                     # over_budget
    {"action": "replace", "old_text": "kubernetes", "content": "x"},            # no_match
    {"operations": [{"action": "remove", "old_text": "zzz"}]},                  # failed batch
]


def test_the_fourth_failure_in_a_turn_is_terminal_and_per_session(tmp_path):
    engine = Engine(over_budget_home(tmp_path))
    agent, other = engine.open_session("cli"), engine.open_session("gateway")
    codes = [agent.memory(**call)["code"] for call in FAILING_CALLS]
    assert codes == ["over_budget", "no_match", "no_match"]
    fourth = agent.memory(action="remove", old_text="nothing like it")
    assert fourth["code"] == "consolidation_exhausted" and fourth["done"] is True and fourth["success"] is False
    assert "continue your reply" in fourth["error"]
    assert agent.memory(**FAILING_CALLS[0])["code"] == "consolidation_exhausted"
    # Another session has its own count.
    assert other.memory(**FAILING_CALLS[0])["code"] == "over_budget"


def test_a_new_turn_resets_the_count(tmp_path):
    session = Engine(over_budget_home(tmp_path)).open_session("cli")
    for call in FAILING_CALLS:
        session.memory(**call)
    session.new_turn()
    assert session.memory(**FAILING_CALLS[0])["code"] == "over_budget"
    assert session.memory(**FAILING_CALLS[0])["code"] == "over_budget"
    assert session.memory(**FAILING_CALLS[0])["code"] == "over_budget"
    assert session.memory(**FAILING_CALLS[0])["code"] == "consolidation_exhausted"


def test_a_success_resets_the_count(tmp_path):
    session = Engine(over_budget_home(tmp_path)).open_session("cli")
    for call in FAILING_CALLS:
        session.memory(**call)
    assert session.memory(action="add", content="ok")["success"] is True
    for call in FAILING_CALLS:
        assert session.memory(**call)["code"] != "consolidation_exhausted"
    assert session.memory(**FAILING_CALLS[1])["code"] == "consolidation_exhausted"


def test_failures_that_are_not_consolidation_failures_do_not_count(tmp_path):
    home = make_home(tmp_path, memory=["alpha one", "alpha two"], memory_limit=100)
    session = Engine(home).open_session("cli")
    for _ in range(4):
        assert session.memory(action="remove", old_text="alpha")["code"] == "ambiguous"
        assert session.memory(action="add", content="")["code"] == "invalid"
        assert session.memory(action="add", content="c" * 90, dry_run=True)["code"] == "over_budget"
    assert session.memory(action="add", content="c" * 90)["code"] == "over_budget"


def test_a_failed_batch_of_any_kind_counts(tmp_path):
    session = Engine(over_budget_home(tmp_path)).open_session("cli")
    batches = [
        [{"action": "add", "content": "c" * 60}],                                     # over_budget
        [{"action": "remove", "old_text": "aaa"}, {"action": "remove", "old_text": "bbb"}],  # would_empty
        [{"action": "add"}],                                                          # malformed
    ]
    assert [session.memory(operations=ops)["code"] for ops in batches] == ["over_budget", "would_empty", "invalid"]
    assert session.memory(operations=batches[0])["code"] == "consolidation_exhausted"


# -- drift (SPEC §6) ---------------------------------------------------------------------------------------

FREE_TEXT = "\nMeeting notes, pasted by hand: " + "we agreed to move the release to Thursday and to " * 5


def drifted_home(tmp_path: Path) -> tuple[Path, bytes]:
    """A home whose MEMORY.md had free text appended by a shell `>>`: its last entry is now
    longer than the store's whole limit."""
    home = make_home(tmp_path, memory=NOTES, memory_limit=200)
    with open(memory_file(home), "a", encoding="utf-8") as shell_append:
        shell_append.write(FREE_TEXT)
    return home, memory_file(home).read_bytes()


def test_a_drifted_file_is_backed_up_as_soon_as_the_engine_loads_it(tmp_path):
    home, raw = drifted_home(tmp_path)
    engine = Engine(home)
    [backup] = backups(home)
    assert backup.read_bytes() == raw
    status = engine.store_status("memory")
    assert status["drift"]["backup"] == str(backup) and status["last_backup"] == str(backup)


def test_a_drifted_store_refuses_replace_remove_and_batch_naming_the_backup(tmp_path):
    home, raw = drifted_home(tmp_path)
    session = Engine(home).open_session("cli")
    [backup] = backups(home)
    for call in (
        {"action": "replace", "old_text": "Staging", "content": "Staging moved."},
        {"action": "remove", "old_text": "Staging"},
        {"operations": [{"action": "remove", "old_text": "Staging"}]},
    ):
        reply = session.memory(**call)
        assert reply["code"] == "drift" and reply["done"] is True and reply["success"] is False
        assert reply["drift_backup"] == str(backup) and str(backup) in reply["error"]
        assert reply["remediation"]
    assert memory_file(home).read_bytes() == raw


def test_add_to_a_store_with_free_text_appended_keeps_all_of_it(tmp_path):
    home, raw = drifted_home(tmp_path)
    engine = Engine(home)
    session = engine.open_session("cli")
    reply = session.memory(action="add", content="New fact.")
    assert reply["success"] is True and reply["code"] == "ok"
    text = memory_file(home).read_text(encoding="utf-8")
    assert text == raw.decode("utf-8").rstrip() + "\n§\nNew fact."
    assert engine.entries("memory")[-1] == "New fact."
    # Still drifted: the free text waits for a person, and rewrites stay refused.
    assert session.memory(action="remove", old_text="New fact.")["code"] == "drift"
    assert len(backups(home)) == 1


def test_drift_seen_by_a_check_is_backed_up_at_once_and_add_keeps_all_existing_text(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    session = engine.open_session("cli")
    with open(memory_file(home), "a", encoding="utf-8") as editor:
        editor.write("\n§\n\n§\nTODO (mine): book the team offsite\n§\n")  # stray delimiters
    edited = memory_file(home).read_text(encoding="utf-8")
    events = engine.check_external()
    [backup] = backups(home)
    assert backup.read_text(encoding="utf-8") == edited
    assert [event.kind for event in events] == ["drift_detected"] and events[0].backup == str(backup)
    assert session.memory(action="remove", old_text="TODO")["code"] == "drift"
    reply = session.memory(action="add", content="Uses green tea.")
    assert reply["success"] is True and reply["code"] == "ok"
    text = memory_file(home).read_text(encoding="utf-8")
    assert text.startswith(edited.strip()) and text.endswith("\nUses green tea.")
    assert engine.entries("memory") == [*NOTES, "TODO (mine): book the team offsite", "Uses green tea."]
    assert session.memory(action="remove", old_text="TODO")["code"] == "drift"  # still drifted
    assert backups(home) == [backup]  # its own append is not taken for a new drift


def test_drift_is_rechecked_under_the_lock_before_a_rewrite(tmp_path):
    home = make_home(tmp_path, memory=NOTES, memory_limit=200)
    session = Engine(home).open_session("cli")
    with open(memory_file(home), "a", encoding="utf-8") as shell_append:
        shell_append.write(FREE_TEXT)
    raw = memory_file(home).read_bytes()
    reply = session.memory(action="replace", old_text="pytest", content="Tests run with nox.")  # no check first
    assert reply["code"] == "drift"
    assert memory_file(home).read_bytes() == raw and [b.read_bytes() for b in backups(home)] == [raw]


def test_making_the_file_clean_again_clears_the_drift(tmp_path):
    home, _ = drifted_home(tmp_path)
    engine = Engine(home)
    session = engine.open_session("cli")
    hermes_write(memory_file(home), [*NOTES, "Release moved to Thursday."])
    events = engine.check_external()
    assert "drift_resolved" in [event.kind for event in events]
    assert engine.store_status("memory")["drift"] is None
    assert session.memory(action="replace", old_text="Thursday", content="Release is on Thursday.")["code"] == "ok"
    assert hermes_read(memory_file(home))[-1] == "Release is on Thursday."


def test_a_second_drift_gets_its_own_backup(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home, clock=lambda: 1_700_000_000.0)
    memory_file(home).write_text("a\n§\n\n§\nb", encoding="utf-8")
    engine.check_external()
    memory_file(home).write_text("a\n§\n\n§\nc", encoding="utf-8")
    engine.check_external()
    assert [b.read_text(encoding="utf-8") for b in backups(home)] == ["a\n§\n\n§\nb", "a\n§\n\n§\nc"]


# -- external changes --------------------------------------------------------------------------------------

def test_a_clean_external_write_is_adopted(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    hermes_write(memory_file(home), ["Written by Hermes.", NOTES[0]])
    events = engine.check_external()
    assert [event.kind for event in events] == ["store_changed"] and events[0].session is None
    assert engine.entries("memory") == ["Written by Hermes.", NOTES[0]]
    assert "Written by Hermes." in engine.open_session("new").snapshot.memory
    assert not backups(home)


def test_an_external_write_not_yet_seen_is_never_overwritten(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    session = Engine(home).open_session("cli")
    hermes_write(memory_file(home), [*NOTES, "Written by Hermes."])
    assert session.memory(action="add", content="Written by memd.")["entry_count"] == 5
    assert hermes_read(memory_file(home)) == [*NOTES, "Written by Hermes.", "Written by memd."]


def test_own_writes_are_recognised_by_content_not_by_time(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    engine.open_session("cli").memory(action="add", content="Written by memd.")
    assert engine.check_external() == []  # its own write is not an external change
    stamp = os.stat(memory_file(home))
    hermes_write(memory_file(home), ["Same size, same time."])
    os.utime(memory_file(home), ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert [event.kind for event in engine.check_external()] == ["store_changed"]
    assert engine.entries("memory") == ["Same size, same time."]


def test_an_external_edit_over_budget_is_reported(tmp_path, caplog):
    home = make_home(tmp_path, memory=NOTES, memory_limit=150)
    engine = Engine(home)
    assert engine.store_status("memory")["over_budget"] is False
    hermes_write(memory_file(home), [*NOTES, "Pasted by a person: " + "more context. " * 5])
    engine.check_external()
    status = engine.store_status("memory")
    assert status["over_budget"] is True and status["usage"].startswith("100% — ") and status["drift"] is None
    assert any("over budget" in record.getMessage() for record in caplog.records)
    assert "⚠ OVER BUDGET" in engine.open_session("new").snapshot.memory


def test_deleting_a_store_keeps_its_last_content_in_a_backup(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    engine.open_session("cli").memory(action="add", content="Last words.")
    memory_file(home).unlink()
    engine.check_external()
    [backup] = backups(home)
    assert parse_entries(backup.read_text(encoding="utf-8")) == [*NOTES, "Last words."]
    assert engine.entries("memory") == [] and engine.open_session("new").snapshot.memory is None
    engine.check_external()
    assert backups(home) == [backup]


# -- other processes -----------------------------------------------------------------------------------------

ADDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from memd.engine import Engine
    home, tag, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    session = Engine(home).open_session(tag)
    print("ready", flush=True)
    sys.stdin.readline()
    for index in range(count):
        entry = f"{tag} fact {index}"
        reply = session.memory(action="add", content=entry)
        if reply["success"] and reply["code"] == "ok":
            print(entry, flush=True)
""")


def test_two_processes_adding_concurrently_lose_no_acknowledged_add(tmp_path):
    home = make_home(tmp_path, memory=NOTES, memory_limit=100_000)
    count = 25
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", ADDER, str(home), tag, str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent,
        )
        for tag in ("alpha", "beta")
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # start both at once
            worker.stdin.write("go\n")
            worker.stdin.flush()
        acknowledged = []
        for worker in workers:
            out, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0
            acknowledged += out.split("\n")[:-1]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert len(acknowledged) == 2 * count
    entries = hermes_read(memory_file(home))
    assert set(acknowledged) <= set(entries) and len(entries) == len(NOTES) + 2 * count
    assert drift_reason(memory_file(home).read_text(encoding="utf-8"), 100_000) is None


LOCK_HOLDER = textwrap.dedent("""
    import fcntl, sys
    with open(sys.argv[1], "a+") as lock:   # as Hermes takes it
        fcntl.flock(lock, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.readline()
""")


def test_a_process_holding_the_lock_holds_back_the_engines_write(tmp_path):
    home = make_home(tmp_path, memory=NOTES)
    engine = Engine(home)
    session = engine.open_session("cli")
    before = memory_file(home).read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(memory_file(home)) + ".lock"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    replies: list[dict] = []
    writer = threading.Thread(target=lambda: replies.append(session.memory(action="add", content="Waited.")))
    try:
        assert holder.stdout.readline().strip() == "locked"
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and not replies            # not acknowledged...
        assert memory_file(home).read_bytes() == before     # ...and not written
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert holder.wait(timeout=10) == 0
        writer.join(10)
        assert not writer.is_alive()
    finally:
        if holder.poll() is None:
            holder.kill()
        writer.join(10)
    assert replies and replies[0]["success"] is True
    assert hermes_read(memory_file(home)) == [*NOTES, "Waited."]


# -- all or nothing, on disk -------------------------------------------------------------------------------

WORD = st.sampled_from(["alpha", "beta", "gamma", "delta", "tea", "vim", "x" * 30])
OPERATION = st.one_of(
    st.builds(lambda c: {"action": "add", "content": c}, WORD),
    st.builds(lambda o, c: {"action": "replace", "old_text": o, "content": c}, WORD, WORD),
    st.builds(lambda o: {"action": "remove", "old_text": o}, WORD),
    st.just({"action": "remove"}),
    st.just({"action": "add", "content": INJECTION}),
)


@given(
    st.lists(st.sampled_from(["alpha one", "beta two", "gamma three", "tea time", "x" * 40]), unique=True, max_size=5),
    st.lists(OPERATION, min_size=1, max_size=5),
    st.integers(30, 120),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_batch_is_all_or_nothing_on_disk(entries, operations, limit):
    with tempfile.TemporaryDirectory() as root:
        home = make_home(Path(root), memory=entries, memory_limit=limit)
        store = memory_file(home)
        before = store.read_bytes()
        inode = os.stat(store).st_ino
        engine = Engine(home)
        reply = engine.open_session("cli").memory(operations=operations)
        if not reply["success"]:
            assert store.read_bytes() == before and os.stat(store).st_ino == inode
            assert engine.entries("memory") == entries
        else:
            written = store.read_text(encoding="utf-8")
            assert parse_entries(written) == engine.entries("memory")
            assert reply["entry_count"] == len(engine.entries("memory"))
            assert drift_reason(written, 10**6) is None  # never a file that would not round-trip
