#!/usr/bin/env python3
"""Kill the daemon at random moments under write load; prove acknowledged writes survive.

    python scripts/crashtest.py --cycles 200

Every cycle starts the daemon on the same home, lets several writer clients run mixed operations
(add, replace, remove, batches, duplicate adds, dry runs) on both stores of two profiles (the
home's and "work"), SIGKILLs the daemon at a random moment and checks the files it left:

- every acknowledged operation is on disk;
- the one operation each writer had in flight (sent, no reply) is wholly applied or not at all —
  a batch never half-applied;
- both files of both profiles decode and are clean (no drift); nothing else is in them;
- the restarted daemon serves exactly what is on disk and reports no drift.

Each writer owns its entries ("w3-17-5 …"), so what must be on disk is decidable per writer: the
state after its acknowledged operations, or that plus its in-flight operation.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_common import FILENAMES, Report, memories_dir, read_disk_store, running_daemon, temp_files

from memd.config import DEFAULT_LIMITS
from memd.testing import DaemonProcess
from memd_client import Client, DaemonUnavailable, MemdError

PROFILES = (None, "work")
STORES = tuple((profile, target) for profile in PROFILES for target in ("memory", "user"))
Store = tuple[str | None, str]
WORDS = ("alpha", "bravo", "charlie delta", "echo", "foxtrot golf hotel", "india", "juliet kilo")
OWNER = re.compile(r"^w(\d+)-")
MAX_OWN_ENTRIES = 6  # per writer and store, so that every store stays well inside its budget


@dataclass(frozen=True)
class Op:
    """One memory call and what it does to its writer's entries in one store."""

    store: Store
    kind: str
    args: dict[str, Any]
    before: frozenset[str]
    after: frozenset[str]
    expect: str  # the reply code an acknowledgement must carry


@dataclass
class Writer:
    """One writer client's cycle: what it knew at the start, what was acknowledged, what was in
    flight when the daemon died."""

    index: int
    cycle: int
    states: dict[Store, frozenset[str]]
    acked: list[Op] = field(default_factory=list)
    in_flight: Op | None = None
    problem: str | None = None
    serial: int = 0

    def new_entry(self, rng: random.Random) -> str:
        self.serial += 1
        return f"w{self.index}-{self.cycle}-{self.serial} {rng.choice(WORDS)}"

    def plan(self, rng: random.Random) -> Op:
        """A random operation on the writer's own entries of a random store."""
        store = rng.choice(STORES)
        target = store[1]
        own = sorted(self.states[store])
        before = frozenset(own)
        roll = rng.random()
        if len(own) < 2 or (len(own) < MAX_OWN_ENTRIES - 2 and roll < 0.3):
            new = self.new_entry(rng)
            return Op(store, "add", {"action": "add", "target": target, "content": new}, before, before | {new}, "ok")
        if roll < 0.45:
            old, new = rng.choice(own), self.new_entry(rng)
            args = {"action": "replace", "target": target, "old_text": old, "content": new}
            return Op(store, "replace", args, before, (before - {old}) | {new}, "ok")
        if roll < 0.6:
            old = rng.choice(own)
            return Op(store, "remove", {"action": "remove", "target": target, "old_text": old}, before, before - {old}, "ok")
        if roll < 0.9:
            return self._batch(rng, store, own)
        if roll < 0.95:
            existing = rng.choice(own)
            return Op(store, "duplicate", {"action": "add", "target": target, "content": existing}, before, before, "duplicate")
        old = rng.choice(own)
        args = {"action": "remove", "target": target, "old_text": old, "dry_run": True}
        return Op(store, "dry_run", args, before, before, "ok")

    def _batch(self, rng: random.Random, store: Store, own: list[str]) -> Op:
        """2–4 operations: removes and replaces of distinct entries, then adds."""
        state = set(own)
        untouched = list(own)
        rng.shuffle(untouched)
        operations: list[dict[str, str]] = []
        for _ in range(rng.randint(0, min(2, len(untouched)))):
            old = untouched.pop()
            if rng.random() < 0.5:
                operations.append({"action": "remove", "old_text": old})
                state.discard(old)
            else:
                new = self.new_entry(rng)
                operations.append({"action": "replace", "old_text": old, "content": new})
                state.discard(old)
                state.add(new)
        # At least two operations, never an empty set, never more than MAX_OWN_ENTRIES.
        while len(operations) < 2 or not state or (len(state) < MAX_OWN_ENTRIES and rng.random() < 0.3 and len(operations) < 4):
            if len(state) >= MAX_OWN_ENTRIES and untouched:
                old = untouched.pop()
                operations.append({"action": "remove", "old_text": old})
                state.discard(old)
                continue
            new = self.new_entry(rng)
            operations.append({"action": "add", "content": new})
            state.add(new)
        args = {"target": store[1], "operations": operations}
        return Op(store, "batch", args, frozenset(own), frozenset(state), "ok")


def run_writer(writer: Writer, endpoint: str, seed: int, ready: threading.Barrier, stop: threading.Event) -> None:
    """Apply random operations until the daemon dies (or `stop`); record what was acknowledged."""
    rng = random.Random(seed)
    with Client(endpoint, timeout=1.5, retries=0, autostart=False) as client:
        try:
            sessions = {profile: client.open_session(f"crash-writer-{writer.index}", profile) for profile in PROFILES}
        except MemdError:
            ready.wait()
            return  # killed before this writer got going: nothing was sent
        ready.wait()
        for _ in range(100_000):
            if stop.is_set():
                return
            op = writer.plan(rng)
            try:
                reply = sessions[op.store[0]].memory(op.args)
            except DaemonUnavailable:
                writer.in_flight = op
                return
            except MemdError as error:
                writer.in_flight = op
                writer.problem = f"{op.kind} on {op.store} was refused: {error}"
                return
            if not (reply.get("success") and reply.get("code") == op.expect):
                writer.in_flight = op  # may or may not have been applied: keep both outcomes open
                writer.problem = f"{op.kind} {op.args} on {op.store} answered {reply}"
                return
            writer.acked.append(op)
            writer.states[op.store] = op.after


@dataclass
class Totals:
    cycles: int = 0
    acked: Counter[str] = field(default_factory=Counter)
    in_flight_applied: int = 0
    in_flight_not_applied: int = 0
    in_flight_no_effect: int = 0  # duplicate adds and dry runs: nothing to tell apart
    temps_after_kill: int = 0
    temps_after_restart: int = 0


def store_path(home: Path, store: Store) -> Path:
    return memories_dir(home, store[0]) / FILENAMES[store[1]]


def check_disk(
    home: Path, cycle: int, writers: list[Writer], model: dict[Store, dict[int, frozenset[str]]],
    totals: Totals, report: Report,
) -> None:
    """Compare the files the killed daemon left with what its writers were told; update `model`
    to what is on disk so the next cycle starts from the truth."""
    for store in STORES:
        disk = read_disk_store(store_path(home, store), DEFAULT_LIMITS[store[1]])
        if disk.problem:
            report.violation(f"cycle {cycle}: {store} is {disk.problem}")
        found: dict[int, set[str]] = {writer.index: set() for writer in writers}
        for entry in disk.entries:
            owner = OWNER.match(entry)
            if owner is None or int(owner.group(1)) not in found:
                report.violation(f"cycle {cycle}: {store} holds an entry no writer wrote: {entry!r}")
                continue
            found[int(owner.group(1))].add(entry)
        for writer in writers:
            on_disk = frozenset(found[writer.index])
            acknowledged = writer.states[store]
            flight = writer.in_flight if writer.in_flight is not None and writer.in_flight.store == store else None
            if on_disk == acknowledged and flight is None:
                pass
            elif flight is not None and on_disk in (flight.before, flight.after) and acknowledged == flight.before:
                if flight.before == flight.after:
                    totals.in_flight_no_effect += 1
                elif on_disk == flight.after:
                    totals.in_flight_applied += 1
                else:
                    totals.in_flight_not_applied += 1
            else:
                lost = sorted(acknowledged - on_disk)
                extra = sorted(on_disk - acknowledged - (flight.after if flight else frozenset()))
                report.violation(
                    f"cycle {cycle}: {store} writer {writer.index}: on disk {sorted(on_disk)}, "
                    f"acknowledged {sorted(acknowledged)}"
                    + (f", in flight {flight.kind} {flight.args}" if flight else "")
                    + (f"; acknowledged but missing {lost}" if lost else "")
                    + (f"; never acknowledged {extra}" if extra else "")
                )
            model[store][writer.index] = on_disk


def check_restart(daemon: DaemonProcess, cycle: int, report: Report) -> None:
    """The restarted daemon serves what is on disk, clean."""
    with daemon.client(timeout=10.0) as client:
        for profile in PROFILES:
            status = client.status(profile)
            for target in ("memory", "user"):
                disk = read_disk_store(store_path(daemon.home, (profile, target)), DEFAULT_LIMITS[target])
                served = client.entries(target, profile)
                if served != list(disk.entries):
                    report.violation(f"cycle {cycle}: after restart {(profile, target)} serves {served}, disk has {list(disk.entries)}")
                store_status = status["stores"][target]
                if store_status["drift"] is not None or store_status["unreadable"] is not None:
                    report.violation(f"cycle {cycle}: after restart {(profile, target)} reports {store_status}")


def count_temps(home: Path) -> int:
    return sum(len(temp_files(memories_dir(home, profile))) for profile in PROFILES)


def run_crashtest(cycles: int, writers: int = 4, max_kill_delay: float = 0.5, seed: int | None = None) -> Report:
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    report = Report(f"crashtest: {cycles} cycles, {writers} writers, kill within {max_kill_delay:g}s, seed {seed}")
    totals = Totals()
    model: dict[Store, dict[int, frozenset[str]]] = {store: {i: frozenset() for i in range(writers)} for store in STORES}
    started = time.monotonic()
    with running_daemon() as daemon:
        for profile in PROFILES:
            if profile is not None:
                (daemon.home / "profiles" / profile).mkdir(parents=True, exist_ok=True)
        for cycle in range(1, cycles + 1):
            if cycle > 1:
                try:
                    daemon.start()
                except RuntimeError as error:
                    report.violation(f"cycle {cycle}: the daemon did not restart: {error}")
                    break
                check_restart(daemon, cycle, report)
                totals.temps_after_restart += count_temps(daemon.home)
            runs = [Writer(i, cycle, {store: model[store][i] for store in STORES}) for i in range(writers)]
            ready = threading.Barrier(writers + 1)
            stop = threading.Event()
            threads = [
                threading.Thread(target=run_writer, args=(run, daemon.endpoint, rng.randrange(2**32), ready, stop), daemon=True)
                for run in runs
            ]
            for thread in threads:
                thread.start()
            ready.wait(timeout=30)
            time.sleep(rng.uniform(0, max_kill_delay))
            daemon.kill()
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
            totals.cycles += 1
            for run in runs:
                totals.acked.update(op.kind for op in run.acked)
                if run.problem:
                    report.violation(f"cycle {cycle}: writer {run.index}: {run.problem}")
            totals.temps_after_kill += count_temps(daemon.home)
            check_disk(daemon.home, cycle, runs, model, totals, report)
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
    elapsed = time.monotonic() - started
    report.figure("cycles run", totals.cycles)
    report.figure("operations acknowledged", f"{sum(totals.acked.values()):,} ({', '.join(f'{k} {v:,}' for k, v in sorted(totals.acked.items()))})")
    report.figure("in flight at kill", (
        f"{totals.in_flight_applied} applied whole, {totals.in_flight_not_applied} not applied, "
        f"{totals.in_flight_no_effect} without effect (duplicate/dry run)"
    ))
    report.figure("temp files left by kills", f"{totals.temps_after_kill} (still there after restart: {totals.temps_after_restart})")
    report.figure("time", f"{elapsed:.1f} s ({elapsed / max(1, totals.cycles):.2f} s per cycle)")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--max-kill-delay", type=float, default=0.5, help="seconds; the kill comes at a uniform random moment within it")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    return run_crashtest(args.cycles, args.writers, args.max_kill_delay, args.seed).exit_status()


if __name__ == "__main__":
    sys.exit(main())
