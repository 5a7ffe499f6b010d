#!/usr/bin/env python3
"""How fast memd is on this machine, against the floors it cannot beat.

    python scripts/bench.py                     # about half a minute
    python scripts/bench.py --requests 20000 --seconds 10 --processes 1,2,4,8,16,32

Prints one table:

(a) the floor: a raw pyzmq DEALER/ROUTER round trip to a trivial echo server in a child process,
    with request and reply frames of the same sizes as memd's;
(b) memd's read latency (`client.entries`) and durable write latency (`session.memory(add)`);
(c) one durable file write (`write_durably` of a ~2 KB store), the cost no write can avoid;
(d) write throughput (acknowledged writes per second) of 1, 4 and 16 client processes against
    memd, against the same number of processes each embedding `memd.engine.Engine` (lock, re-read,
    write for every change: the Hermes way), and the ratio.

Figures only, no pass/fail assertions; the targets are printed beside them. Everything runs in a
fresh temporary home, which gets a config.yaml with a large memory_char_limit, and every timed or
counted add is followed by a remove of the same entry, so the store stays at its ~2 KB start.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

try:
    from memd_client import Client
    from memd_client import protocol as wire

    from memd.disk import write_durably
    from memd.engine import Engine
    from memd.testing import DaemonProcess
except ModuleNotFoundError as missing:  # run from a checkout without `pip install -e .`
    sys.exit(f"bench.py needs memd importable ({missing}); run `pip install -e .` first")

BENCH_LIMIT = 100_000  # memory_char_limit of the bench home: throughput loops never meet the budget
PREFILL_CHARS = 2_000
fork = multiprocessing.get_context("fork")


# -- small helpers ---------------------------------------------------------------------------


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def timed(call: Callable[[], Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def prefill_entries() -> list[str]:
    """About 2 KB of ordinary notes, like a store in daily use."""
    entries, number = [], 0
    while sum(len(entry) + 3 for entry in entries) < PREFILL_CHARS:
        number += 1
        entries.append(f"Note {number}: the service on host{number}.internal listens on port {8000 + number} and logs to /var/log/svc{number}.")
    return entries


# -- (a) the floor: an echo server -----------------------------------------------------------


def echo_server(endpoint: str) -> None:
    """Answer every frame at once with a frame of the size its first 4 bytes ask for."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)
    blob = os.urandom(1 << 20)
    try:
        while True:
            peer, frame = router.recv_multipart()
            if frame == b"stop":
                return
            router.send_multipart([peer, blob[: int.from_bytes(frame[:4], "big")]])
    finally:
        router.close(linger=0)
        context.term()


class FloorClient:
    """A raw DEALER to the echo server: the least a request-reply over ZeroMQ can cost."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(endpoint)
        self.round_trips(64, 64, 200)  # connect and warm up

    def round_trips(self, request_size: int, reply_size: int, count: int) -> list[float]:
        request = reply_size.to_bytes(4, "big") + b"x" * max(0, request_size - 4)

        def round_trip() -> None:
            self.dealer.send(request)
            self.dealer.recv()
        return timed(round_trip, count)

    def close(self) -> None:
        self.dealer.close()
        self.context.term()


# -- (d) throughput workers ------------------------------------------------------------------


def _count_writes(write: Callable[[str, str], dict[str, Any]], name: str, go: Any, seconds: float, results: Any) -> None:
    """Add then remove a small entry of our own, again and again; count acknowledged writes."""
    go.wait(60)
    deadline = time.monotonic() + seconds
    done = 0
    number = 0
    while True:
        number += 1
        entry = f"{name} bench entry {number}"
        for action in ("add", "remove"):
            reply = write(action, entry)
            if time.monotonic() > deadline:
                results.put(done)
                return
            if not reply.get("success"):
                raise RuntimeError(f"{name}: {action} refused: {reply}")
            done += 1


def memd_writer(endpoint: str, index: int, ready: Any, go: Any, seconds: float, results: Any) -> None:
    try:
        with Client(endpoint, timeout=30, autostart=False) as client:
            session = client.open_session(f"bench-{index}")

            def write(action: str, entry: str) -> dict[str, Any]:
                field = "content" if action == "add" else "old_text"
                return session.memory({"action": action, field: entry})
            ready.release()
            _count_writes(write, f"memd-{index}", go, seconds, results)
    except BaseException as error:
        results.put(error.__class__.__name__ + ": " + str(error))
        raise


def embedded_writer(home: str, index: int, ready: Any, go: Any, seconds: float, results: Any) -> None:
    try:
        session = Engine(Path(home)).open_session(f"embedded-{index}")

        def write(action: str, entry: str) -> dict[str, Any]:
            field = "content" if action == "add" else "old_text"
            return session.memory({"action": action, field: entry})
        ready.release()
        _count_writes(write, f"embedded-{index}", go, seconds, results)
    except BaseException as error:
        results.put(error.__class__.__name__ + ": " + str(error))
        raise


def throughput(target: Callable[..., None], where: str, processes: int, seconds: float) -> float:
    """Acknowledged writes per second of `processes` processes running `target` together."""
    ready = fork.Semaphore(0)
    go = fork.Event()
    results = fork.Queue()
    workers = [fork.Process(target=target, args=(where, index, ready, go, seconds, results)) for index in range(processes)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            if not ready.acquire(timeout=60):
                raise RuntimeError("a bench process did not get ready within 60s")
        go.set()
        counts = [results.get(timeout=seconds + 60) for _ in workers]
        problems = [count for count in counts if not isinstance(count, int)]
        if problems:
            raise RuntimeError(f"bench process failed: {problems[0]}")
        return sum(counts) / seconds
    finally:
        go.set()
        for worker in workers:
            worker.join(seconds + 30)
            if worker.is_alive():
                worker.kill()
                worker.join()


# -- the run ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="timed reads (and floor round trips); writes are a quarter of it (default 2000)")
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each throughput point (default 2)")
    parser.add_argument("--processes", default="1,4,16", help="process counts for throughput (default 1,4,16)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home and print where it is")
    args = parser.parse_args(argv)
    counts = [int(item) for item in args.processes.split(",") if item.strip()]
    writes = max(50, args.requests // 4)

    scratch = Path(tempfile.mkdtemp(prefix="memd-bench-", dir="/tmp" if os.path.isdir("/tmp") else None))
    home = scratch / "home"
    (home / "memories").mkdir(parents=True)
    (home / "config.yaml").write_text(f"memory:\n  memory_char_limit: {BENCH_LIMIT}\n", encoding="utf-8")
    entries = prefill_entries()
    store_text = "\n§\n".join(entries)
    write_durably(home / "memories" / "MEMORY.md", store_text)
    sample_dir = scratch / "durable"
    sample_dir.mkdir()
    echo_endpoint = f"ipc://{scratch}/echo.sock"
    echo = daemon = None
    started = time.monotonic()
    try:
        echo = subprocess.Popen([sys.executable, __file__, "--echo-server", echo_endpoint])
        daemon = DaemonProcess(home, f"ipc://{scratch}/m.sock")
        daemon.start()
        with daemon.client(timeout=30) as client:
            session = client.open_session("bench")
            read_reply = client.call(wire.Entries, target="memory")
            add_reply = session.memory(action="add", content="bench latency entry 0")
            session.memory(action="remove", old_text="bench latency entry 0")
            sizes = {  # (request, reply) frame sizes of memd's read and write, for the floor
                "read": (
                    len(wire.encoder.encode(wire.Entries(v=wire.PROTOCOL_VERSION, id=uuid.uuid4().hex, target="memory"))),
                    len(wire.encoder.encode(wire.Reply(id=uuid.uuid4().hex, ok=True, result=read_reply))),
                ),
                "write": (
                    len(wire.encoder.encode(wire.Memory(v=wire.PROTOCOL_VERSION, id=uuid.uuid4().hex, session=session.id,
                                                        args={"action": "add", "content": "bench latency entry 0"}))),
                    len(wire.encoder.encode(wire.Reply(id=uuid.uuid4().hex, ok=True, result=add_reply))),
                ),
            }
            number = 0
            floor_dealer = FloorClient(echo_endpoint)
            # (a), (b), (c) in small interleaved rounds, so that a machine busy with something
            # else for a moment weighs on all of them alike.
            floors: dict[str, list[float]] = {"read": [], "write": []}
            reads: list[float] = []
            add_samples: list[float] = []
            durable: list[float] = []
            # A real record of the add above, appended to a file of its own.
            record = (home / "memd" / "journal.jsonl").read_bytes().splitlines(keepends=True)[-2]
            journal_fd = os.open(sample_dir / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            journaled: list[float] = []

            def write_and_journal() -> None:
                write_durably(sample_dir / "MEMORY.md", store_text)
                os.write(journal_fd, record)
                os.fsync(journal_fd)

            rounds = 20
            for _ in range(rounds):
                for kind, (request, reply) in sizes.items():
                    floors[kind] += floor_dealer.round_trips(request, reply, args.requests // rounds)
                reads += timed(lambda: client.entries("memory"), args.requests // rounds)
                for _ in range(writes // rounds):
                    number += 1
                    entry = f"bench latency entry {number}"
                    begun = time.perf_counter()
                    session.memory(action="add", content=entry)
                    add_samples.append(time.perf_counter() - begun)
                    session.memory(action="remove", old_text=entry)
                durable += timed(lambda: write_durably(sample_dir / "MEMORY.md", store_text), max(1, writes // rounds))
                journaled += timed(write_and_journal, max(1, writes // rounds))
            os.close(journal_fd)
            floor_dealer.close()
            session.close()
        echo.terminate()
        echo.wait(10)
        echo = None

        # (d) memd and embedded engines in turn for each process count; the daemon is stopped
        # while the embedded engines run, so that it does not re-read their every write.
        memd_rates: dict[int, tuple[float, float]] = {}  # processes -> (writes/s, calls per commit)
        embedded_rates: dict[int, float] = {}
        for processes in counts:
            if daemon is None:
                daemon = DaemonProcess(home, f"ipc://{scratch}/m.sock")
                daemon.start()
            with daemon.client(timeout=10) as client:
                before = client.status()
                rate = throughput(memd_writer, daemon.endpoint, processes, args.seconds)
                after = client.status()
            commits = max(1, after["commits"] - before["commits"])
            memd_rates[processes] = (rate, (after["committed_calls"] - before["committed_calls"]) / commits)
            daemon.stop()
            daemon = None
            embedded_rates[processes] = throughput(embedded_writer, str(home), processes, args.seconds)
    finally:
        if daemon is not None:
            daemon.stop()
        if echo is not None:
            echo.terminate()
            echo.wait(10)
        if args.keep:
            print(f"(temporary home kept: {scratch})")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    # -- the table -------------------------------------------------------------------------
    floor_read, floor_write = percentile(floors["read"], 0.5), percentile(floors["write"], 0.5)
    durable_p50 = percentile(durable, 0.5)
    read_p50, write_p50 = percentile(reads, 0.5), percentile(add_samples, 0.5)
    read_target = 1.5 * floor_read
    write_target = (floor_write + durable_p50) * 1.25

    def verdict(ok: bool) -> str:
        return "meets target" if ok else "MISSES target"

    print(f"memd bench — Python {platform.python_version()}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), "
          f"{os.cpu_count()} CPU(s), {platform.system()} {platform.release()}")
    print(f"fresh home in {scratch}: MEMORY.md pre-filled with {len(store_text):,} chars in {len(entries)} entries; "
          f"config.yaml sets memory_char_limit {BENCH_LIMIT:,}; every add is followed by a remove of the same entry")
    print()
    print(f"(a) floor: raw pyzmq DEALER/ROUTER round trip over ipc, echo server in a child process ({len(floors['read']):,} each)")
    for kind in ("read", "write"):
        request, reply = sizes[kind]
        print(f"    {kind}-sized frames (request {request:,} B, reply {reply:,} B)    "
              f"p50 {microseconds(percentile(floors[kind], 0.5)):>10}   p99 {microseconds(percentile(floors[kind], 0.99)):>10}")
    print(f"(b) memd read   client.entries('memory')   ({len(reads):,})       "
          f"p50 {microseconds(read_p50):>10}   p99 {microseconds(percentile(reads, 0.99)):>10}   "
          f"target p50 <= 1.5 x floor = {microseconds(read_target)}: {verdict(read_p50 <= read_target)}")
    print(f"    memd write  session.memory(add), durable ({len(add_samples):,})    "
          f"p50 {microseconds(write_p50):>10}   p99 {microseconds(percentile(add_samples, 0.99)):>10}   "
          f"target p50 <= (floor + durable write) x 1.25 = {microseconds(write_target)}: {verdict(write_p50 <= write_target)}")
    print(f"(c) one durable write: write_durably of {len(store_text.encode()):,} B ({len(durable):,})   "
          f"p50 {microseconds(durable_p50):>10}   p99 {microseconds(percentile(durable, 0.99)):>10}")
    journaled_p50 = percentile(journaled, 0.5)
    print(f"    the same, then a {len(record):,} B journal record appended durably ({len(journaled):,})   "
          f"p50 {microseconds(journaled_p50):>10}   p99 {microseconds(percentile(journaled, 0.99)):>10}")
    least = floor_write + journaled_p50
    print(f"    the least any write that keeps SPEC §2 and its journal can take here, floor + this: "
          f"{microseconds(least)} = {least / write_target:.2f} x the write target; memd's own share: "
          f"{microseconds(write_p50 - least)}")
    print(f"(d) write throughput, acknowledged writes/s ({args.seconds:g} s per point; adds and removes both count)")
    print(f"    {'processes':>9}  {'memd':>10}  {'embedded':>10}  {'ratio':>7}  {'calls per commit':>16}")
    for processes in counts:
        rate, per_commit = memd_rates[processes]
        embedded = embedded_rates[processes]
        ratio = rate / embedded if embedded else float("inf")
        note = f"  target >= 5x: {verdict(ratio >= 5)}" if processes == 16 else ""
        print(f"    {processes:>9}  {rate:>10,.0f}  {embedded:>10,.0f}  {ratio:>6.1f}x  {per_commit:>16.1f}{note}")
    print(f"(whole run: {time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--echo-server":
        echo_server(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
