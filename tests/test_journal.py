"""History over a real daemon: the journal, provenance, undo and restore (issue: history you can trust)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from memd.core.format import parse_entries
from memd.core.history import Record
from memd.journal import Journal
from memd.testing import DaemonProcess
from memd_client import Client, DaemonUnavailable, RequestRefused


def journal_path(daemon: DaemonProcess) -> Path:
    return daemon.home / "memd" / "journal.jsonl"


def memory_file(daemon: DaemonProcess) -> Path:
    return daemon.home / "memories" / "MEMORY.md"


def replace_file(path: Path, text: str) -> None:
    """Save as careful editors and Hermes do: a temp file renamed over the store."""
    temp = path.with_name(path.name + ".edit")
    temp.write_text(text, encoding="utf-8")
    temp.replace(path)


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_every_kind_of_write_is_logged_with_its_fields(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        session = client.open_session("gateway:telegram")
        session.memory(action="add", content="Deploys go through Argo CD")
        session.memory(action="replace", old_text="Argo", content="Deploys go through Argo CD, never kubectl apply")
        session.memory(action="add", target="user", content="Prefers metric units")
        session.memory(operations=[
            {"action": "add", "content": "CI runs on GitHub Actions"},
            {"action": "remove", "old_text": "never kubectl"},
        ])
        session.memory(action="remove", target="user", old_text="metric")
        session.memory(action="add", content="dry runs are not logged", dry_run=True)
        session.memory(action="remove", old_text="no such entry")  # a refusal is not a change
        records = client.history()
    assert [(r["seq"], r["target"], r["action"]) for r in records] == [
        (1, "memory", "add"), (2, "memory", "replace"), (3, "user", "add"), (4, "memory", "batch"), (5, "user", "remove"),
    ]
    assert all(r["session"] == "gateway:telegram" for r in records)
    assert all(isinstance(r["time"], float) and r["usage"].endswith("chars") for r in records)
    assert records[1]["steps"] == [{
        "action": "replace", "old": "Deploys go through Argo CD", "new": "Deploys go through Argo CD, never kubectl apply",
    }]
    assert records[3]["steps"] == [
        {"action": "add", "old": None, "new": "CI runs on GitHub Actions"},
        {"action": "remove", "old": "Deploys go through Argo CD, never kubectl apply", "new": None},
    ]
    assert records[3]["after"] == ["CI runs on GitHub Actions"]
    assert records[4]["after"] == []
    # The journal file itself is owner-only JSON lines.
    assert journal_path(daemon).stat().st_mode & 0o777 == 0o600
    lines = journal_path(daemon).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3, 4, 5]


def test_history_filters(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        cli, cron = client.open_session("cli"), client.open_session("cron:nightly")
        cli.memory(action="add", content="one")
        middle = time.time()
        cron.memory(action="add", content="two")
        cron.memory(action="add", target="user", content="three")
        assert [r["after"][-1] for r in client.history(session="cron:nightly")] == ["two", "three"]
        assert [r["seq"] for r in client.history(target="user")] == [3]
        assert [r["seq"] for r in client.history(since=middle)] == [2, 3]
        assert [r["seq"] for r in client.history(limit=2)] == [2, 3]


def test_provenance_names_the_session_and_time_of_each_live_entry(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        client.open_session("cli").memory(action="add", content="Uses zsh")
        gateway = client.open_session("gateway")
        gateway.memory(action="add", content="Timezone is CET")
        gateway.memory(action="replace", old_text="zsh", content="Uses zsh with starship")
        rows = client.provenance("memory")
    assert [(row["entry"], row["session"], row["action"], row["seq"]) for row in rows] == [
        ("Uses zsh with starship", "gateway", "replace", 3),
        ("Timezone is CET", "gateway", "add", 2),
    ]


@pytest.mark.parametrize("change", ["add", "replace", "remove", "batch"])
def test_undo_restores_the_exact_previous_entries(daemon: DaemonProcess, change: str) -> None:
    calls = {
        "add": {"action": "add", "content": "Staging DB is db-stg-2"},
        "replace": {"action": "replace", "old_text": "Python", "content": "Project targets Python 3.12"},
        "remove": {"action": "remove", "old_text": "Redis"},
        "batch": {"operations": [
            {"action": "remove", "old_text": "Redis"},
            {"action": "replace", "old_text": "Python", "content": "Python 3.12; cache is Redis 7"},
            {"action": "add", "content": "Docs live in docs/"},
        ]},
    }
    with daemon.client() as client:
        session = client.open_session("cli")
        session.memory(operations=[
            {"action": "add", "content": "Project targets Python 3.11"},
            {"action": "add", "content": "Cache is Redis 6"},
            {"action": "add", "content": "Lint with ruff"},
        ])
        before = client.entries("memory")
        assert session.memory(calls[change])["success"]
        assert client.entries("memory") != before
        seq = client.history()[-1]["seq"]
        preview = client.undo(seq, dry_run=True)
        assert preview["success"] and preview["dry_run"] and client.entries("memory") != before
        reply = client.undo(seq)
        assert reply["success"] and reply["undo_of"] == seq
        assert client.entries("memory") == before
        last = client.history()[-1]
        assert last["action"] == "undo" and last["undo_of"] == seq and last["session"] == "undo"


def test_unsafe_undo_is_refused_and_says_why(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        session = client.open_session("cli")
        session.memory(action="add", content="Build with make")
        session.memory(action="replace", old_text="make", content="Build with just")
        before = client.entries("memory")
        reply = client.undo(1)  # undoing the add would remove an entry that has since changed
        assert reply["success"] is False and reply["code"] == "conflict" and reply["done"] is True
        assert "Build with make" in reply["error"] and "later change" in reply["error"]
        assert client.entries("memory") == before
        assert reply["target"] == "memory" and reply["undo_of"] == 1  # refusals say what they were about
        missing = client.undo(999)
        assert missing["code"] == "invalid" and missing["undo_of"] == 999 and "target" not in missing


def test_undo_of_a_record_that_changed_no_entries_is_invalid(daemon: DaemonProcess) -> None:
    path = memory_file(daemon)
    with daemon.client() as client:
        client.open_session("cli").memory(action="add", content="kept")
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("\n" + "pasted notes " * 200)  # free text: drift
        wait_for(lambda: client.status()["stores"]["memory"]["drift"] is not None)
        drift = next(r for r in client.history() if r["action"] == "drift_detected")
        reply = client.undo(drift["seq"])
        assert reply["success"] is False and reply["code"] == "invalid"
        assert "changed no entries" in reply["error"]
        assert reply["target"] == "memory" and reply["undo_of"] == drift["seq"]
        assert client.history()[-1]["seq"] == drift["seq"]  # nothing was journaled


@pytest.mark.parametrize("name", ["", "x" * 201])
def test_undo_and_restore_refuse_a_bad_session_name(daemon: DaemonProcess, name: str) -> None:
    with daemon.client() as client:
        client.open_session("cli").memory(action="add", content="kept")
        seq = client.history()[-1]["seq"]
        for call in (lambda: client.undo(seq, name=name), lambda: client.restore("memory", time.time(), name=name)):
            with pytest.raises(RequestRefused, match="session name must be 1 to 200"):
                call()
        assert client.entries("memory") == ["kept"] and client.history()[-1]["seq"] == seq


def test_restore_reproduces_the_state_at_a_chosen_time(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        session = client.open_session("cli")
        for fact in ("alpha", "beta", "gamma"):
            session.memory(action="add", content=fact)
        time.sleep(0.01)
        chosen = time.time()
        wanted = client.entries("memory")
        time.sleep(0.01)
        session.memory(operations=[
            {"action": "remove", "old_text": "alpha"},
            {"action": "replace", "old_text": "gamma", "content": "gamma 2"},
            {"action": "add", "content": "delta"},
        ])
        preview = client.restore("memory", chosen, dry_run=True)
        assert preview["success"] and client.entries("memory") != wanted
        assert client.restore("memory", chosen)["success"]
        assert client.entries("memory") == wanted
        assert client.history()[-1]["action"] == "restore"
        # Back to before anything was written: an empty store, which only restore may produce.
        assert client.restore("memory", chosen - 3600)["code"] == "invalid"


def test_restore_to_empty_and_undo_of_first_add(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        session = client.open_session("cli")
        session.memory(action="add", content="only fact")
        assert client.undo(1)["success"]
        assert client.entries("memory") == []


def test_external_changes_and_drift_backups_are_logged(daemon: DaemonProcess) -> None:
    path = memory_file(daemon)
    with daemon.client() as client:
        client.open_session("cli").memory(action="add", content="kept")
        replace_file(path, "kept\n§\nadded by hand")  # a clean edit, saved atomically: adopted
        wait_for(lambda: client.entries("memory") == ["kept", "added by hand"])
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("\n" + "pasted notes " * 200)  # free text: drift
        wait_for(lambda: client.status()["stores"]["memory"]["drift"] is not None)
        records = client.history()
    external = [r for r in records if r["action"] == "external"]
    assert external and external[0]["session"] is None
    assert external[0]["steps"] == [{"action": "add", "old": None, "new": "added by hand"}]
    drift = [r for r in records if r["action"] == "drift_detected"]
    assert len(drift) == 1 and Path(drift[0]["backup"]).exists()
    assert "pasted notes" in Path(drift[0]["backup"]).read_text(encoding="utf-8")


def test_changes_made_while_no_daemon_ran_are_recorded_at_start(tmp_path: Path) -> None:
    with DaemonProcess.start_new(tmp_path / "home") as daemon:
        with daemon.client() as client:
            client.open_session("cli").memory(action="add", content="first")
        daemon.stop()
        memory_file(daemon).write_text("first\n§\nwritten offline", encoding="utf-8")
        daemon.start()
        with daemon.client() as client:
            last = client.history()[-1]
    assert last["action"] == "external" and last["after"] == ["first", "written offline"]


def test_torn_journal_tail_is_repaired_without_losing_acknowledged_records(tmp_path: Path) -> None:
    with DaemonProcess.start_new(tmp_path / "home") as daemon:
        acknowledged: list[str] = []
        stop = threading.Event()

        def write_storm() -> None:
            with daemon.client(timeout=2.0, retries=0) as client:
                session = client.open_session("storm")
                for index in range(10_000):
                    if stop.is_set():
                        return
                    fact = f"storm fact {index}"
                    try:
                        reply = session.memory(operations=[{"action": "add", "content": fact}] + (
                            [{"action": "remove", "old_text": f"storm fact {index - 5}"}] if index >= 5 else []
                        ))
                    except DaemonUnavailable:
                        return
                    if reply["success"]:
                        acknowledged.append(fact)

        writer = threading.Thread(target=write_storm)
        writer.start()
        wait_for(lambda: len(acknowledged) >= 30, timeout=20)
        daemon.kill()
        stop.set()
        writer.join()
        # Whatever the kill left, a half-written record is what a crash mid-append looks like.
        with open(journal_path(daemon), "ab") as journal:
            journal.write(b'{"seq": 99999, "time": 1, "target": "mem')
        daemon.start()
        with daemon.client() as client:
            records = client.history(limit=100_000)
            logged = {step["new"] for record in records for step in record["steps"] if step["action"] == "add"}
            assert set(acknowledged) <= logged
            assert client.history()[-1]["after"] == client.entries("memory")
            assert journal_path(daemon).read_bytes().endswith(b"\n")
            client.open_session("after").memory(action="add", content="journal works after repair")
            assert client.history()[-1]["seq"] == records[-1]["seq"] + 1
        assert "incomplete last record" in daemon.log()
        assert parse_entries(memory_file(daemon).read_text(encoding="utf-8"))


def test_rotation_keeps_the_window_and_the_latest_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    journal = home / "memd" / "journal.jsonl"
    journal.parent.mkdir(parents=True)
    old = time.time() - 90 * 86400
    records = [
        {"seq": 1, "time": old, "target": "memory", "action": "add", "steps": [{"action": "add", "new": "a"}], "after": ["a"]},
        {"seq": 2, "time": old + 1, "target": "user", "action": "add", "steps": [{"action": "add", "new": "u"}], "after": ["u"]},
        {"seq": 3, "time": old + 2, "target": "memory", "action": "add", "steps": [{"action": "add", "new": "b"}], "after": ["a", "b"]},
        {"seq": 4, "time": time.time() - 86400, "target": "memory", "action": "remove", "steps": [{"action": "remove", "old": "a"}], "after": ["b"]},
    ]
    journal.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").write_text("b", encoding="utf-8")
    (home / "memories" / "USER.md").write_text("u", encoding="utf-8")
    with DaemonProcess.start_new(home) as daemon:
        with daemon.client() as client:
            kept = [r["seq"] for r in client.history()]
    # seq 1 and 3 are older than 30 days and superseded; 2 is old but the latest of USER.md.
    assert kept == [2, 4]


def test_consolidation_seen_in_memd_log_and_reverted_with_memd_undo(daemon: DaemonProcess) -> None:
    """An agent fills the store, consolidates with one batch, and a person reviews and reverts."""
    import subprocess
    import sys

    def memd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd", *args, "--endpoint", daemon.endpoint],
            capture_output=True, text=True, timeout=30,
        )

    with daemon.client() as client:
        agent = client.open_session("cli:agent")
        facts = [f"Service {name} listens on port {port} and logs to /var/log/{name}.log" for name, port in (
            ("api", 8080), ("worker", 8081), ("billing", 8082), ("search", 8083), ("mailer", 8084),
        )]
        used = len("\n§\n".join(facts))
        facts += [f"Note {index}: " + "x" * ((2150 - used) // 4 - 12) for index in range(4)]  # fills to ~2,150 of 2,200
        for fact in facts:
            agent.memory(action="add", content=fact)
        refused = agent.memory(action="add", content="Service auth listens on port 8085 and logs to /var/log/auth.log")
        assert refused["code"] == "over_budget"
        consolidation = agent.memory(operations=[
            {"action": "replace", "old_text": "Service api", "content": "Services api/worker/billing/search/mailer listen on 8080-8084, logs in /var/log/<name>.log"},
            {"action": "remove", "old_text": "Service worker"},
            {"action": "remove", "old_text": "Service billing"},
            {"action": "remove", "old_text": "Service search"},
            {"action": "remove", "old_text": "Service mailer"},
            {"action": "add", "content": "Service auth listens on port 8085 and logs to /var/log/auth.log"},
        ])
        assert consolidation["success"], consolidation
        merged = client.entries("memory")

    log = memd("log", "memory", "--json")
    assert log.returncode == 0, log.stderr
    records = json.loads(log.stdout)
    batch = records[-1]
    assert batch["action"] == "batch" and batch["session"] == "cli:agent"
    assert {"seq", "time", "session", "target", "action"} <= set(batch)
    assert [step["action"] for step in batch["steps"]] == ["replace", "remove", "remove", "remove", "remove", "add"]
    human = memd("log", "memory")
    assert human.returncode == 0 and "cli:agent" in human.stdout and "Service billing" in human.stdout

    undo = memd("undo", str(batch["seq"]))
    assert undo.returncode == 0, undo.stdout + undo.stderr
    with daemon.client() as client:
        restored = client.entries("memory")
    assert set(restored) == set(facts)
    assert restored != merged


def test_cli_log_filters_show_provenance_and_restore(daemon: DaemonProcess) -> None:
    import subprocess
    import sys

    def memd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd", *args, "--endpoint", daemon.endpoint],
            capture_output=True, text=True, timeout=30,
        )

    assert memd("add", "memory", "Uses Postgres 16").returncode == 0
    time.sleep(0.05)
    moment = time.time()
    time.sleep(0.05)
    assert memd("replace", "memory", "Postgres", "Uses Postgres 16 with pgvector").returncode == 0
    with daemon.client() as client:
        client.open_session("gateway").memory(action="add", target="user", content="Name is Ada")

    only_gateway = json.loads(memd("log", "--session", "gateway", "--json").stdout)
    assert [(r["seq"], r["target"]) for r in only_gateway] == [(3, "user")]
    recent = json.loads(memd("log", "memory", "--since", str(moment), "--json").stdout)
    assert [r["action"] for r in recent] == ["replace"]

    shown = json.loads(memd("show", "memory", "--provenance", "--json").stdout)
    entry = shown["stores"]["memory"]["entries"][0]
    assert entry["provenance"]["session"] == "cli" and entry["provenance"]["seq"] == 2
    assert "(change #2)" in memd("show", "--provenance").stdout

    preview = memd("restore", "memory", "--at", str(moment), "--dry-run")
    assert preview.returncode == 0 and "would be restored" in preview.stdout
    with daemon.client() as client:
        assert client.entries("memory") == ["Uses Postgres 16 with pgvector"]
    assert memd("restore", "memory", "--at", str(moment)).returncode == 0
    with daemon.client() as client:
        assert client.entries("memory") == ["Uses Postgres 16"]
    assert memd("restore", "memory", "--at", "not a time").returncode == 2
    assert memd("undo", "2").returncode == 1  # the entry it wrote is gone since the restore: refused


def test_appends_follow_the_file_when_another_engine_rotates_it(tmp_path: Path) -> None:
    # Engines keep the journal open between appends; an embedded engine starting on the same home
    # may rotate it (a new file) meanwhile.
    path = tmp_path / "journal.jsonl"
    old = time.time() - 90 * 86400
    first = Journal(path)
    first.append([Record(seq=0, time=old, target="memory", action="add", after=["a"])])
    first.append([Record(seq=0, time=old, target="memory", action="add", after=["a", "b"])])
    assert Journal(path, window_days=30).rotate(time.time()) == 1  # another engine, at its start
    [appended] = first.append([Record(seq=0, time=time.time(), target="memory", action="add", after=["a", "b", "c"])])
    assert appended.seq == 3
    assert [(record.seq, record.after) for record in Journal(path).records()] == [(2, ["a", "b"]), (3, ["a", "b", "c"])]


def test_rotation_never_drops_the_highest_number(tmp_path: Path) -> None:
    # Numbers must never be given twice, so the newest record stays even when it is not the
    # latest state of a store (a drift_resolved).
    path = tmp_path / "journal.jsonl"
    old = time.time() - 90 * 86400
    journal = Journal(path)
    journal.append([
        Record(seq=0, time=old, target="memory", action="add", after=["a"]),
        Record(seq=0, time=old + 1, target="memory", action="drift_resolved"),
    ])
    Journal(path).rotate(time.time())
    assert Journal(path).append([Record(seq=0, time=time.time(), target="memory", action="add", after=["a", "b"])])[0].seq == 3


def test_an_append_after_a_writer_died_mid_record_stays_readable(tmp_path: Path) -> None:
    # Embedded engines share the journal; one killed (or out of disk) in the middle of an append
    # leaves a record without its newline, which the next append must not be glued to.
    path = tmp_path / "journal.jsonl"
    survivor = Journal(path)
    survivor.append([Record(seq=0, time=time.time(), target="memory", action="add", after=["a"])])
    with open(path, "ab") as handle:
        handle.write(b'{"seq":2,"time":1.0,"target":"memory","action":"add","after":["b')
    [appended] = survivor.append([Record(seq=0, time=time.time(), target="memory", action="add", after=["a", "c"])])
    assert appended.seq == 2  # the unfinished record was never acknowledged: its number is free
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b"\n") == 2
    assert [(record.seq, record.after) for record in Journal(path).records()] == [(1, ["a"]), (2, ["a", "c"])]
