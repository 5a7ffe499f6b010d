#!/usr/bin/env python3
"""Many client processes hammering one daemon, plus a Hermes-style writer beside it.

    python scripts/concurrency.py --clients 64 --seconds 20

N client processes mix reads (entries, a session's snapshot, status), session opens (and closes)
and writes (adds of their own entries, removes of their oldest), while an external writer appends
entries the way Hermes does (flock on MEMORY.md.lock, read, append, temp file + fsync +
os.replace), dropping its oldest beyond a few. Afterwards no update may be lost: every
acknowledged add is on disk unless its removal was acknowledged, no acknowledged removal came
back, every external append is there unless the external writer dropped it (and then it is
gone), nothing else is, and every session's snapshot stayed frozen. Prints throughput, p50/p99 latency
per kind of request, and how many acknowledged writes each durable write (fsync) carried.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness_common import (
    FILENAMES, Deadline, Report, hermes_append, latency_lines, log_problems, memories_dir, read_disk_store,
    running_daemon, wait_for,
)

from memd_client import Client, MemdError
from memd_client import protocol as wire

LIMIT = 500_000  # the test home's store limits: budget refusals are not what is measured here
KINDS = ("entries", "snapshot", "status", "open_session", "write")
WEIGHTS = (30, 20, 10, 10, 30)
KEEP_OWN = 3  # live entries per client and store
KEEP_EXTERNAL = 5  # live entries of the external writer


def client_worker(
    index: int, endpoint: str, seconds: float, max_ops: int, seed: int,
    ready: Any, go: Any, results: Any,
) -> None:
    """One client process: random requests until `seconds` pass or `max_ops` are done."""
    rng = random.Random(seed)
    outcome: dict[str, Any] = {
        "index": index, "latency": defaultdict(list), "added": [], "removed": [], "unknown": [],
        "errors": [], "ops": 0,
    }
    with Client(endpoint, timeout=30.0, retries=2, autostart=False) as client:
        try:
            session = client.open_session(f"load-{index}")
        except MemdError as error:
            outcome["errors"].append(f"cannot open a session: {error}")
            ready.put(index)
            results.put({**outcome, "latency": {}})
            return
        frozen = {"memory": session.snapshot.memory, "user": session.snapshot.user}
        ready.put(index)
        go.wait(300)
        own: dict[str, list[str]] = {"memory": [], "user": []}
        serial = 0
        end = time.monotonic() + seconds
        while outcome["ops"] < max_ops and time.monotonic() < end:
            kind = rng.choices(KINDS, WEIGHTS)[0]
            target = rng.choice(("memory", "user"))
            label = kind
            started = time.perf_counter()
            try:
                if kind == "entries":
                    client.entries(target)
                elif kind == "snapshot":
                    if client.call(wire.Snapshot, session=session.id) != frozen:
                        outcome["errors"].append("a session's snapshot changed while it was open")
                elif kind == "status":
                    client.status()
                elif kind == "open_session":
                    opened = client.open_session(f"load-{index}-extra")
                    outcome["latency"]["open_session"].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    label = "close_session"
                    opened.close()
                elif len(own[target]) >= KEEP_OWN and rng.random() < 0.5:
                    old = own[target][0]
                    label = "remove"
                    reply = session.memory(action="remove", target=target, old_text=old)
                    if reply.get("code") == "ok":
                        own[target].pop(0)
                        outcome["removed"].append((target, old))
                    else:
                        outcome["errors"].append(f"remove {old!r} answered {reply}")
                else:
                    serial += 1
                    new = f"c{index}-{serial} {rng.choice(('note', 'fact', 'longer note here'))}"
                    label = "add"
                    try:
                        reply = session.memory(action="add", target=target, content=new)
                    except MemdError:
                        outcome["unknown"].append((target, new))
                        raise
                    if reply.get("code") == "ok":
                        own[target].append(new)
                        outcome["added"].append((target, new))
                    else:
                        outcome["errors"].append(f"add {new!r} answered {reply}")
            except MemdError as error:
                outcome["errors"].append(f"{label}: {type(error).__name__}: {error}")
                continue
            outcome["latency"][label].append(time.perf_counter() - started)
            outcome["ops"] += 1
        session.close()
    outcome["latency"] = dict(outcome["latency"])
    results.put(outcome)


def external_worker(store: str, interval: float, seconds: float, go: Any, results: Any) -> None:
    """Every `interval` seconds, append an entry the Hermes way and drop its oldest beyond a few."""
    appended: list[str] = []
    removed: list[str] = []
    latency: list[float] = []
    go.wait(300)
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(appended) < 100_000:
        entry = f"ext-{len(appended) + 1} written by a Hermes agent"
        drop = appended[len(removed)] if len(appended) - len(removed) >= KEEP_EXTERNAL else None
        started = time.perf_counter()
        hermes_append(Path(store), entry, drop)
        latency.append(time.perf_counter() - started)
        appended.append(entry)
        if drop is not None:
            removed.append(drop)
        time.sleep(interval)
    results.put({"external": appended, "external_removed": removed, "latency": latency})


def run_concurrency(clients: int = 16, seconds: float = 10.0, max_ops: int = 1_000_000, external_interval: float = 0.05, seed: int | None = None) -> Report:
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    report = Report(f"concurrency: {clients} client processes + 1 Hermes-style writer, {seconds:g}s, seed {seed}")
    config = {"memory": {"memory_char_limit": LIMIT, "user_char_limit": LIMIT}}
    context = multiprocessing.get_context("spawn")
    with running_daemon(config) as daemon:
        ready, results, go = context.Queue(), context.Queue(), context.Event()
        store = memories_dir(daemon.home) / FILENAMES["memory"]
        workers = [
            context.Process(target=client_worker, args=(i, daemon.endpoint, seconds, max_ops, rng.randrange(2**32), ready, go, results))
            for i in range(clients)
        ]
        workers.append(context.Process(target=external_worker, args=(str(store), external_interval, seconds, go, results)))
        try:
            for worker in workers:
                worker.start()
            for _ in range(clients):
                collect(ready, workers, Deadline(300))
            with daemon.client() as client:
                before = client.status()
                go.set()
                started = time.monotonic()
                deadline = Deadline(seconds + 300)
                outcomes = [collect(results, workers, deadline) for _ in workers]
                elapsed = time.monotonic() - started
                after = client.status()
                check(daemon, client, outcomes, report)
        except queue.Empty:
            report.violation("a worker process did not report in time")
            outcomes, elapsed, before, after = [], 1.0, {}, {}
        finally:
            for worker in workers:
                worker.join(timeout=30)
                if worker.is_alive():
                    worker.terminate()
                    worker.join()
        for line in log_problems(daemon):
            report.violation(f"daemon log: {line}")
    figures(report, outcomes, elapsed, before, after)
    return report


def collect(source: Any, workers: list[Any], deadline: Deadline) -> Any:
    """The next item a worker reports; queue.Empty when none comes in time or none can come."""
    while not deadline.passed:
        try:
            return source.get(timeout=1.0)
        except queue.Empty:
            if not any(worker.is_alive() for worker in workers):
                break
    raise queue.Empty


def check(daemon: Any, client: Client, outcomes: list[dict[str, Any]], report: Report) -> None:
    """No lost update, judged against what was acknowledged."""
    external = next((item for item in outcomes if "external" in item), {"external": [], "external_removed": []})
    external_removed = set(external["external_removed"])
    disk = {target: read_disk_store(memories_dir(daemon.home) / name, LIMIT) for target, name in FILENAMES.items()}
    for target, found in disk.items():
        if found.problem:
            report.violation(f"{target} store is {found.problem}")
    # The daemon catches up with the last external append through its watch (or rescan).
    if not wait_for(lambda: all(client.entries(t) == list(disk[t].entries) for t in disk), timeout=15):
        report.violation("the daemon's entries did not converge to the files on disk")
    on_disk = {target: set(found.entries) for target, found in disk.items()}
    known: dict[str, set[str]] = {"memory": set(external["external"]) - external_removed, "user": set()}
    for item in outcomes:
        if "external" in item:
            continue
        for error in item["errors"][:5]:
            report.violation(f"client {item['index']}: {error}")
        removed = set(item["removed"])
        for target, entry in item["added"]:
            known[target].add(entry)
            if (target, entry) not in removed and entry not in on_disk[target]:
                report.violation(f"lost update: acknowledged add {entry!r} ({target}) is not on disk")
        for target, entry in removed:
            if entry in on_disk[target]:
                report.violation(f"acknowledged remove of {entry!r} ({target}) was undone")
        for target, entry in item["unknown"]:
            known[target].add(entry)
    for entry in external["external"]:
        if entry in external_removed:
            if entry in on_disk["memory"]:
                report.violation(f"external removal of {entry!r} was undone")
        elif entry not in on_disk["memory"]:
            report.violation(f"lost update: external append {entry!r} is not on disk")
    for target, entries in on_disk.items():
        for entry in entries - known[target]:
            report.violation(f"{target} holds an entry nobody wrote: {entry!r}")


def figures(report: Report, outcomes: list[dict[str, Any]], elapsed: float, before: dict[str, Any], after: dict[str, Any]) -> None:
    latency: dict[str, list[float]] = defaultdict(list)
    ops = acked_writes = 0
    for item in outcomes:
        if "external" in item:
            latency["external write (Hermes way)"].extend(item["latency"])
            report.figure("external appends", len(item["external"]))
            continue
        ops += item["ops"]
        acked_writes += len(item["added"]) + len(item["removed"])
        for kind, values in item["latency"].items():
            latency[kind].extend(values)
    report.figure("requests", f"{ops:,} in {elapsed:.1f} s = {ops / elapsed:,.0f}/s (writes {acked_writes:,} = {acked_writes / elapsed:,.0f}/s)")
    for kind, line in latency_lines(latency).items():
        report.figure(f"latency {kind}", line)
    if before and after:
        commits = after["commits"] - before["commits"]
        calls = after["committed_calls"] - before["committed_calls"]
        writes = after["writes"] - before["writes"]
        report.figure("group commit", (
            f"{calls:,} memory calls in {commits:,} commit groups ({calls / max(1, commits):.2f} per group); "
            f"{writes:,} durable store writes (each one fsync of the file)"
        ))
        report.figure("acknowledged writes per fsync", f"{acked_writes / max(1, writes):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="client processes (up to 64)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-ops", type=int, default=1_000_000, help="per client")
    parser.add_argument("--external-interval", type=float, default=0.05, help="seconds between external appends")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 64:
        parser.error("--clients must be 1 to 64")
    return run_concurrency(args.clients, args.seconds, args.max_ops, args.external_interval, args.seed).exit_status()


if __name__ == "__main__":
    sys.exit(main())
