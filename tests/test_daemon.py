"""The daemon as its users meet it: real `memd serve` processes, real sockets, real files.

Concurrency, the frozen snapshot, the failure counter, crashes, notifications, sessions and
profiles, and the daemon's life cycle. Drift is in test_daemon_drift.py, bad input in
test_daemon_input.py.
"""

from __future__ import annotations

import bisect
import fcntl
import multiprocessing
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from memd_client import Client, DaemonUnavailable, RequestRefused, SessionClosed
from memd_client import protocol as wire

from memd.core.format import DELIMITER, drift_reason, parse_entries
from memd.testing import DaemonProcess

TARGETS = ("memory", "user")
FILES = {"memory": "MEMORY.md", "user": "USER.md"}
# Room for a few hundred small entries, so concurrency tests are not about the budget.
ROOMY = "memory:\n  memory_char_limit: 1000000\n  user_char_limit: 1000000\n"
fork = multiprocessing.get_context("fork")


# -- helpers ---------------------------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def store_file(home: Path, target: str, profile: str | None = None) -> Path:
    base = home if profile is None else home / "profiles" / profile
    return base / "memories" / FILES[target]


def file_entries(home: Path, target: str) -> list[str]:
    """The entries on disk, read strictly: the file must be valid UTF-8 and clean."""
    path = store_file(home, target)
    if not path.exists():
        return []
    text = path.read_bytes().decode("utf-8")
    assert drift_reason(text, 10**9) is None, f"{path} is not a clean store:\n{text[:500]}"
    return parse_entries(text)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons on fresh homes (optionally with a config.yaml); all are stopped afterwards."""
    started: list[DaemonProcess] = []

    def start(config: str | None = None, name: str = "home") -> DaemonProcess:
        home = tmp_path / name
        home.mkdir()
        if config is not None:
            (home / "config.yaml").write_text(config, encoding="utf-8")
        process = DaemonProcess.start_new(home=home)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


class NotificationRecorder:
    """Follows a daemon's notifications on a thread, as a UI would, through Client.notifications().

    A SUB socket only receives what is published after it has joined, so `start` writes a marker
    until the first notification is seen. A blocked SUB wakes only for a message, so `stop` makes
    the daemon publish (by writing the marker again) until the thread has ended.
    """

    MARKER = "notification recorder marker"

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.notes: list[wire.Notification] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.client = daemon.client(timeout=5)
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.writer = daemon.client(timeout=5)
        self.session = self.writer.open_session("recorder")
        self.marker_present = False

    def _follow(self) -> None:
        try:
            stream = self.client.notifications(timeout=30)
            for note in stream:
                self.notes.append(note)
                if self.stopping.is_set():
                    break
            stream.close()
        except BaseException as error:  # reported by the test, not lost on a thread
            self.error = error

    def _toggle_marker(self) -> None:
        action = "remove" if self.marker_present else "add"
        field = "old_text" if self.marker_present else "content"
        reply = self.session.memory({"action": action, field: self.MARKER})
        assert reply["success"], reply
        self.marker_present = not self.marker_present

    def start(self) -> NotificationRecorder:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.notes:
            assert time.monotonic() < deadline, "no notification arrived within 10s"
            self._toggle_marker()
            time.sleep(0.02)
        if self.marker_present:
            self._toggle_marker()
        # Everything published so far has reached the thread once the last seq has.
        published = self.writer.status()["notifications"]
        wait_for(lambda: self.notes[-1].seq >= published, 5, "the warm-up notifications")
        return self

    def wait(self, predicate: Callable[[wire.Notification], bool], timeout: float, what: str) -> wire.Notification:
        def found() -> wire.Notification | None:
            assert self.error is None, f"the notification stream failed: {self.error!r}"
            return next((note for note in self.notes if predicate(note)), None)
        return wait_for(found, timeout, what)

    def stop(self) -> None:
        self.stopping.set()
        deadline = time.monotonic() + 10
        while self.thread.is_alive() and time.monotonic() < deadline:
            try:
                self._toggle_marker()
            except DaemonUnavailable:
                break
            self.thread.join(0.05)
        if self.marker_present:
            self._toggle_marker()
        self.client.close()
        self.writer.close()


def snapshot_of(client: Client, session_id: str) -> dict[str, Any]:
    """A session's snapshot as the daemon serves it now (not the copy the client kept)."""
    return client.call(wire.Snapshot, session=session_id)


def hermes_write(path: Path, entries: list[str]) -> None:
    """Rewrite a store the way Hermes does: under its lock file, temp file, fsync, rename."""
    lock_fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        temp = path.with_name(f".{path.name}.hermes.tmp")
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(DELIMITER.join(entries))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        os.close(lock_fd)


# -- many writers ----------------------------------------------------------------------------

WORKERS = 16
OPERATIONS_PER_WORKER = 50


def _mixed_worker(endpoint: str, index: int, go: Any, results: Any) -> None:
    """50 mixed writes, each touching only entries this worker created, logged with times."""
    rng = random.Random(7919 * index)
    owned: dict[str, list[str]] = {target: [] for target in TARGETS}
    log: list[tuple[float, float, str, list[tuple[str, ...]]]] = []
    counter = 0

    def fresh(target: str) -> str:
        nonlocal counter
        counter += 1
        return f"[w{index:02d}-{counter:03d}] {target} fact {rng.randrange(10**6)}"

    try:
        with Client(endpoint, timeout=60, autostart=False) as client:
            session = client.open_session(f"worker-{index:02d}")
            go.wait(60)
            for _ in range(OPERATIONS_PER_WORKER):
                target = rng.choice(TARGETS)
                mine = owned[target]
                kind = rng.choice(("add", "add", "replace", "remove", "batch")) if mine else "add"
                steps: list[tuple[str, ...]]
                if kind == "add":
                    new = fresh(target)
                    args: dict[str, Any] = {"action": "add", "target": target, "content": new}
                    steps = [("add", new)]
                elif kind == "replace":
                    old, new = rng.choice(mine), fresh(target)
                    args = {"action": "replace", "target": target, "old_text": old, "content": new}
                    steps = [("replace", old, new)]
                elif kind == "remove":
                    old = rng.choice(mine)
                    args = {"action": "remove", "target": target, "old_text": old}
                    steps = [("remove", old)]
                else:
                    first, second, replaced = fresh(target), fresh(target), fresh(target)
                    old = rng.choice(mine)
                    operations = [
                        {"action": "add", "content": first},
                        {"action": "replace", "old_text": old, "content": replaced},
                        {"action": "add", "content": second},
                    ]
                    steps = [("add", first), ("replace", old, replaced), ("add", second)]
                    others = [entry for entry in mine if entry != old]
                    if others:
                        gone = rng.choice(others)
                        operations.append({"action": "remove", "old_text": gone})
                        steps.append(("remove", gone))
                    args = {"target": target, "operations": operations}
                sent = time.monotonic()
                reply = session.memory(args)
                acked = time.monotonic()
                if not reply.get("success") or reply.get("code") != "ok":
                    results.put((index, "refused", (args, reply)))
                    return
                for step in steps:
                    if step[0] == "add":
                        mine.append(step[1])
                    elif step[0] == "replace":
                        mine[mine.index(step[1])] = step[2]
                    else:
                        mine.remove(step[1])
                log.append((sent, acked, target, steps))
        results.put((index, "done", log))
    except BaseException as error:
        results.put((index, "error", repr(error)))


def replay(entries: list[str], steps: list[tuple[str, ...]]) -> None:
    """What the daemon does to a store's entries for one acknowledged call (no duplicates here)."""
    for step in steps:
        if step[0] == "add":
            entries.append(step[1])
        elif step[0] == "replace":
            entries[entries.index(step[1])] = step[2]
        else:
            entries.remove(step[1])


def test_sixteen_writers_lose_nothing_and_the_file_is_the_acknowledged_history(start_daemon):
    """16 processes x 50 mixed writes on both stores. The daemon's notifications give its commit
    order (one `store_changed` per applied call, with the session's name); replaying every
    acknowledged call in that order must give exactly the files, order included."""
    daemon = start_daemon(ROOMY)
    results = fork.Queue()
    go = fork.Event()
    workers = [fork.Process(target=_mixed_worker, args=(daemon.endpoint, i, go, results)) for i in range(WORKERS)]
    for worker in workers:
        worker.start()
    recorder = NotificationRecorder(daemon)
    try:
        recorder.start()
        with daemon.client() as client:
            initial = {target: client.entries(target) for target in TARGETS}
        first_seq = recorder.notes[-1].seq
        go.set()
        logs: dict[int, list[Any]] = {}
        deadline = time.monotonic() + 90
        while len(logs) < WORKERS:
            index, outcome, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
            assert outcome == "done", f"worker {index} {outcome}: {payload}"
            logs[index] = payload
        calls = sum(len(log) for log in logs.values())
        assert calls == WORKERS * OPERATIONS_PER_WORKER
        wait_for(lambda: sum(n.seq > first_seq for n in recorder.notes) >= calls, 30,
                 "a notification for every acknowledged write", interval=0.1)
    finally:
        go.set()
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
        recorder.stop()

    notes = [note for note in recorder.notes if note.seq > first_seq and note.session != "recorder"]
    seqs = [note.seq for note in notes]
    assert seqs == list(range(first_seq + 1, first_seq + 1 + len(seqs))), "notifications missing or out of order"
    assert all(note.kind == "store_changed" for note in notes)

    # Replay every acknowledged call in commit order. A worker's calls are sequential, so its
    # k-th notification is its k-th call.
    expected = {target: list(entries) for target, entries in initial.items()}
    position = {index: 0 for index in logs}
    commit_seq: list[tuple[float, float, int]] = []
    for note in notes:
        index = int((note.session or "").removeprefix("worker-"))
        sent, acked, target, steps = logs[index][position[index]]
        position[index] += 1
        assert note.target == target
        replay(expected[target], steps)
        commit_seq.append((sent, acked, note.seq))
    assert position == {index: len(log) for index, log in logs.items()}, "a write was acknowledged but never committed"

    # The commit order respects real time: a call acknowledged before another was sent
    # was committed before it.
    by_ack = sorted(commit_seq, key=lambda item: item[1])
    ack_times = [acked for _, acked, _ in by_ack]
    highest: list[int] = []
    for _, _, seq in by_ack:
        highest.append(max(seq, highest[-1] if highest else 0))
    for sent, _, seq in commit_seq:
        before = bisect.bisect_left(ack_times, sent)
        assert before == 0 or highest[before - 1] < seq

    with daemon.client() as client:
        for target in TARGETS:
            on_disk = file_entries(daemon.home, target)
            assert on_disk == expected[target], f"{target}: the file is not the acknowledged history"
            assert client.entries(target) == expected[target]
            text = store_file(daemon.home, target).read_text(encoding="utf-8")
            assert text == DELIMITER.join(expected[target])
        status = client.status()
    assert status["commits"] <= status["committed_calls"]


# -- the frozen snapshot ---------------------------------------------------------------------


def test_a_sessions_snapshot_stays_byte_identical_while_others_write(daemon):
    with daemon.client() as client:
        writer = client.open_session("writer")
        assert writer.memory(action="add", content="The build runs with make -j4.")["success"]
        assert writer.memory(action="add", target="user", content="Prefers short answers.")["success"]
        reader = client.open_session("reader")
        frozen = snapshot_of(client, reader.id)
        assert frozen == {"memory": reader.snapshot.memory, "user": reader.snapshot.user}
        assert "MEMORY (your personal notes)" in frozen["memory"] and "make -j4" in frozen["memory"]
        assert "USER PROFILE (who the user is)" in frozen["user"]

        assert writer.memory(action="add", content="Deploys go through the staging cluster first.")["success"]
        assert writer.memory(action="replace", target="user", old_text="short answers", content="Prefers short answers in French.")["success"]
        assert writer.memory(operations=[{"action": "remove", "old_text": "make -j4"}, {"action": "add", "content": "The build uses ninja."}])["success"]
        hermes_write(store_file(daemon.home, "memory"), client.entries("memory") + ["Added by Hermes directly."])
        wait_for(lambda: "Added by Hermes directly." in client.entries("memory"), 5, "the external write to be adopted")

        for _ in range(3):
            again = snapshot_of(client, reader.id)
            assert again == frozen
            assert again["memory"].encode("utf-8") == frozen["memory"].encode("utf-8")

        newcomer = client.open_session("newcomer")
        for text in ("staging cluster", "ninja", "Added by Hermes directly."):
            assert text in newcomer.snapshot.memory
        assert "make -j4" not in newcomer.snapshot.memory
        assert "in French" in newcomer.snapshot.user

        refreshed = reader.refresh()
        assert refreshed != frozen and refreshed == newcomer.snapshot
        assert snapshot_of(client, reader.id) == {"memory": newcomer.snapshot.memory, "user": newcomer.snapshot.user}


# -- the failure counter ---------------------------------------------------------------------


def test_the_failure_counter_is_per_session_and_per_turn(daemon):
    with daemon.client() as client:
        agent = client.open_session("agent")
        other = client.open_session("other")
        assert agent.memory(action="add", content="Uses PostgreSQL 16.")["success"]

        def fail_no_match(session: Any) -> dict[str, Any]:
            return session.memory(action="replace", old_text="MySQL", content="Uses MySQL 8.")

        failing_calls = [
            lambda: fail_no_match(agent),
            lambda: agent.memory(action="add", content="x" * 2500),  # over budget
            lambda: agent.memory(operations=[{"action": "remove", "old_text": "no such entry"}]),
        ]
        expected_codes = ["no_match", "over_budget", "no_match"]
        for call, code in zip(failing_calls, expected_codes):
            reply = call()
            assert (reply["success"], reply["done"], reply["code"]) == (False, False, code), reply

        # Another session's failures and successes are its own.
        reply = fail_no_match(other)
        assert (reply["code"], reply["done"]) == ("no_match", False)

        exhausted = fail_no_match(agent)
        assert (exhausted["success"], exhausted["done"], exhausted["code"]) == (False, True, "consolidation_exhausted")
        assert "continue your reply" in exhausted["error"]
        assert agent.memory(action="add", content="y" * 2500)["code"] == "consolidation_exhausted"

        # The other session is not affected: three more of its failures are still corrective.
        for _ in range(2):
            assert fail_no_match(other)["code"] == "no_match"
        assert fail_no_match(other)["code"] == "consolidation_exhausted"

        # A new turn starts the count again.
        assert agent.new_turn() == 2
        for _ in range(3):
            assert fail_no_match(agent)["code"] == "no_match"
        assert fail_no_match(agent)["code"] == "consolidation_exhausted"

        # So does a success.
        agent.new_turn()
        for _ in range(3):
            fail_no_match(agent)
        assert agent.memory(action="add", content="Uses Redis for caching.")["success"]
        for _ in range(3):
            assert fail_no_match(agent)["code"] == "no_match"
        assert fail_no_match(agent)["code"] == "consolidation_exhausted"
        assert client.entries("memory") == ["Uses PostgreSQL 16.", "Uses Redis for caching."]


# -- crashes ---------------------------------------------------------------------------------


def _storm_writer(endpoint: str, index: int, round_: int, progress: Any, results: Any) -> None:
    """Add small entries to both stores until the daemon stops answering; report what was acked."""
    acked: list[tuple[str, str]] = []
    try:
        with Client(endpoint, timeout=1.5, retries=0, autostart=False) as client:
            session = client.open_session(f"storm-{index}")
            for number in range(100_000):
                target = TARGETS[number % 2]
                content = f"round {round_} writer {index} entry {number}"
                try:
                    reply = session.memory(action="add", target=target, content=content)
                except DaemonUnavailable:
                    break
                if reply.get("success"):
                    acked.append((target, content))
                    with progress.get_lock():
                        progress.value += 1
        results.put((index, "done", acked))
    except BaseException as error:
        results.put((index, "error", (repr(error), acked)))


def test_sigkill_during_a_write_storm_loses_no_acknowledged_write(start_daemon):
    daemon = start_daemon(ROOMY)
    acknowledged: list[tuple[str, str]] = []
    for round_ in range(2):
        progress = fork.Value("i", 0)
        results = fork.Queue()
        writers = [fork.Process(target=_storm_writer, args=(daemon.endpoint, i, round_, progress, results)) for i in range(4)]
        for writer in writers:
            writer.start()
        try:
            wait_for(lambda: progress.value >= 60 + 40 * round_, 30, "the storm to get going")
            daemon.kill()
            for _ in writers:
                index, outcome, payload = results.get(timeout=20)
                assert outcome == "done", f"writer {index}: {payload}"
                acknowledged.extend(payload)
        finally:
            for writer in writers:
                writer.join(10)
                if writer.is_alive():
                    writer.kill()
        assert daemon.process is not None and daemon.process.returncode == -signal.SIGKILL

        for target in TARGETS:  # both files parse as clean stores, with no torn entry
            for entry in file_entries(daemon.home, target):
                assert entry.startswith("round ") and entry.split()[-1].isdigit(), entry
        daemon.start()
        with daemon.client() as client:
            for target in TARGETS:
                live = set(client.entries(target))
                lost = [content for t, content in acknowledged if t == target and content not in live]
                assert not lost, f"{len(lost)} acknowledged {target} write(s) lost, e.g. {lost[:3]}"
                assert set(file_entries(daemon.home, target)) == live
            status = client.status()
            assert all(status["stores"][t]["drift"] is None and status["stores"][t]["unreadable"] is None for t in TARGETS)
    assert len(acknowledged) >= 100


# -- notifications ---------------------------------------------------------------------------


def test_notifications_report_changes_drift_and_its_resolution_in_order(daemon):
    memory_file = store_file(daemon.home, "memory")
    recorder = NotificationRecorder(daemon)
    try:
        recorder.start()
        with daemon.client() as client:
            session = client.open_session("gateway:telegram")
            assert session.memory(action="add", content="The CI runs on GitHub Actions.")["success"]
            changed = recorder.wait(lambda n: n.kind == "store_changed" and n.session == "gateway:telegram", 5, "store_changed")
            assert (changed.target, changed.profile) == ("memory", None)
            assert changed.usage.endswith("/2,200 chars")

            with open(memory_file, "a", encoding="utf-8") as handle:
                handle.write("\n" + "pasted by hand " * 200)
            detected = recorder.wait(lambda n: n.kind == "drift_detected", 5, "drift_detected")
            assert detected.target == "memory" and detected.backup
            assert Path(detected.backup).exists() and Path(detected.backup).parent == memory_file.parent
            assert client.status()["stores"]["memory"]["drift"]["backup"] == detected.backup

            hermes_write(memory_file, ["The CI runs on GitHub Actions.", "Fixed by a person."])
            resolved = recorder.wait(lambda n: n.kind == "drift_resolved", 5, "drift_resolved")
            assert resolved.target == "memory" and resolved.seq > detected.seq > changed.seq
    finally:
        recorder.stop()
    seqs = [note.seq for note in recorder.notes]
    assert all(later > earlier for earlier, later in zip(seqs, seqs[1:])), seqs


# -- sessions, profiles, life cycle ----------------------------------------------------------


def test_idle_sessions_expire_and_busy_ones_do_not(start_daemon):
    # server.py looks for idle sessions every min(60 s, idle time / 2): here every 0.5 s.
    daemon = start_daemon("memd:\n  session_idle_seconds: 1\n")
    with daemon.client() as client:
        idle = client.open_session("cron:nightly")
        busy = client.open_session("cli")
        assert client.status()["sessions"] == 2
        deadline = time.monotonic() + 10
        while client.status()["sessions"] != 1:
            assert time.monotonic() < deadline, "the idle session was not closed within 10s"
            busy.new_turn()  # keeps `busy` in use
            time.sleep(0.1)
        with pytest.raises(SessionClosed, match="open a new session"):
            idle.memory(action="add", content="Nightly job finished.")
        assert busy.memory(action="add", content="The CLI session is still open.")["success"]
        assert client.entries("memory") == ["The CLI session is still open."]


def test_a_profile_has_its_own_memory(daemon):
    (daemon.home / "profiles" / "work").mkdir(parents=True)
    with daemon.client() as client:
        work = client.open_session("cli", profile="work")
        personal = client.open_session("cli")
        assert work.memory(action="add", content="The work VPN is vpn.example.com.")["success"]
        assert personal.memory(action="add", content="Plays chess on Sundays.")["success"]
        assert work.memory(action="add", target="user", content="Works on the payments team.")["success"]

        work_file = store_file(daemon.home, "memory", "work")
        assert work_file.read_text(encoding="utf-8") == "The work VPN is vpn.example.com."
        assert store_file(daemon.home, "memory").read_text(encoding="utf-8") == "Plays chess on Sundays."
        assert store_file(daemon.home, "user", "work").read_text(encoding="utf-8") == "Works on the payments team."
        assert not store_file(daemon.home, "user").exists()
        assert client.entries("memory", profile="work") == ["The work VPN is vpn.example.com."]
        assert client.entries("memory") == ["Plays chess on Sundays."]
        assert client.status(profile="work")["stores"]["memory"]["path"] == str(work_file)
        later = client.open_session("gateway", profile="work")
        assert "vpn.example.com" in later.snapshot.memory and "chess" not in later.snapshot.memory


def test_profiles_are_named_as_in_hermes_and_a_mistyped_one_is_refused(daemon):
    (daemon.home / "profiles" / "work").mkdir(parents=True)
    with daemon.client() as client:
        assert client.open_session("cli", profile="Work").memory(action="add", content="Standup at 9:30.")["success"]
        assert client.entries("memory", profile="work") == ["Standup at 9:30."]
        assert client.status(profile="WORK")["profile"] == "work"
        home = client.open_session("cli", profile="default")  # Hermes's name for the home itself
        assert home.memory(action="add", content="Lives in Porto.")["success"]
        assert client.entries("memory") == ["Lives in Porto."]
        with pytest.raises(RequestRefused, match=r"no profile 'wrok'.*profiles there: work") as refused:
            client.open_session("cli", profile="wrok")
        assert refused.value.code == "invalid"
        assert not (daemon.home / "profiles" / "wrok").exists()
        assert client.status()["profiles"] == ["", "work"]


def test_a_second_daemon_for_the_same_home_refuses_and_leaves_the_first_alone(daemon):
    with daemon.client() as client:
        session = client.open_session("cli")
        assert session.memory(action="add", content="Before the second daemon.")["success"]
        for endpoint in (daemon.endpoint, daemon.endpoint.replace("m.sock", "other.sock")):
            second = subprocess.run(
                [sys.executable, "-m", "memd", "serve", "--home", str(daemon.home), "--endpoint", endpoint],
                capture_output=True, text=True, timeout=30, env=daemon.env,
            )
            assert second.returncode != 0
            assert "already running" in second.stderr and f"pid {daemon.pid}" in second.stderr, second.stderr
            assert daemon.endpoint in second.stderr
            assert Path(daemon.endpoint.removeprefix("ipc://")).exists()
        assert not Path(daemon.endpoint.replace("m.sock", "other.sock").removeprefix("ipc://")).exists()
        assert daemon.process is not None and daemon.process.poll() is None
        assert session.memory(action="add", content="After the second daemon.")["success"]
        assert client.hello()["pid"] == daemon.pid
        assert client.entries("memory") == ["Before the second daemon.", "After the second daemon."]


def test_sigterm_answers_the_request_in_flight_then_exits_zero(daemon):
    """The daemon is made to hang in the middle of a write (a Hermes-style writer holds the
    store's lock) when SIGTERM arrives: the write still completes and is answered."""
    with daemon.client() as client:
        session = client.open_session("cli")
    context = zmq.Context()
    writer = context.socket(zmq.DEALER)
    asker = context.socket(zmq.DEALER)
    lock_fd = os.open(store_file(daemon.home, "memory").with_name("MEMORY.md.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for socket in (writer, asker):
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(daemon.endpoint)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        writer.send(wire.encoder.encode(wire.Memory(
            v=wire.PROTOCOL_VERSION, id="in-flight", session=session.id,
            args={"action": "add", "content": "Written while stopping."},
        )))
        assert not writer.poll(300), "the write was answered although the store was locked"
        asker.send(wire.encoder.encode(wire.Hello(v=wire.PROTOCOL_VERSION, id="waiting")))
        assert not asker.poll(300), "the daemon is not busy with the write"
        daemon.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert daemon.process.poll() is None, "the daemon exited with a write in flight"
        fcntl.flock(lock_fd, fcntl.LOCK_UN)

        assert writer.poll(10_000), "the in-flight write was never answered"
        reply = wire.reply_decoder.decode(writer.recv())
        assert reply.id == "in-flight" and reply.ok and reply.result["success"], reply
        assert asker.poll(10_000), "a request that had arrived before the stop was not answered"
        assert wire.reply_decoder.decode(asker.recv()).ok
        assert daemon.process.wait(15) == 0
        assert file_entries(daemon.home, "memory") == ["Written while stopping."]
        assert not Path(daemon.endpoint.removeprefix("ipc://")).exists()
    finally:
        os.close(lock_fd)
        writer.close()
        asker.close()
        context.term()


def test_sigterm_when_idle_exits_zero_and_a_restart_serves_the_same_memory(daemon):
    with daemon.client() as client:
        assert client.open_session("cli").memory(action="add", content="Survives a restart.")["success"]
    assert daemon.stop(signal.SIGTERM) == 0
    assert "memd stopped" in daemon.log()
    daemon.start()
    with daemon.client() as client:
        assert client.entries("memory") == ["Survives a restart."]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_an_idle_daemon_stays_idle_after_reading_and_writing_its_files(daemon):
    """Its own reads of a store must not wake the watch into reading it again, forever."""
    with daemon.client() as client:
        session = client.open_session("cli")
        assert session.memory(action="add", content="One write, then silence.")["success"]
        assert session.memory(action="add", target="user", content="Likes quiet machines.")["success"]
        hermes_write(store_file(daemon.home, "memory"), ["One write, then silence.", "An outside edit too."])
        wait_for(lambda: len(client.entries("memory")) == 2, 5, "the outside edit to be adopted")
    time.sleep(0.3)  # let the events of those writes settle
    used_before, started = cpu_seconds(daemon.pid), time.monotonic()
    time.sleep(1.5)
    share = (cpu_seconds(daemon.pid) - used_before) / (time.monotonic() - started)
    assert share < 0.2, f"the idle daemon used {share:.0%} of a CPU"


def test_a_daemon_started_under_a_low_open_file_limit_raises_it_and_survives_a_burst_of_writes(tmp_path):
    """Each write holds the version it swapped out open for a moment (an outside program may still
    be appending to it), so a burst of writes holds dozens of descriptors; run out, and a write
    cannot be made durable, which stops the daemon."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(ROOMY, encoding="utf-8")
    with DaemonProcess.start_new(home=home, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_NOFILE, (min(80, hard), hard))) as daemon:
        limits = Path(f"/proc/{daemon.pid}/limits").read_text()
        daemon_soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
        assert daemon_soft == str(65_536 if hard == resource.RLIM_INFINITY else min(hard, 65_536))
        with daemon.client() as client:
            session = client.open_session("cli")
            for number in range(300):
                assert session.memory(action="add", content=f"Burst note {number} about the build.")["success"]
            assert len(client.entries("memory")) == 300


def test_a_daemon_process_that_is_not_ready_in_time_is_not_left_running(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    process = DaemonProcess(home, f"ipc://{tmp_path}/m.sock")
    with pytest.raises(RuntimeError, match="did not become ready"):
        process.start(timeout=0.0)
    assert process.process is not None and process.process.poll() is not None
