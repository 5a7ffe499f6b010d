#!/usr/bin/env python3
"""Run the daemon under steady mixed load for a while and watch it for leaks and backlog.

    python scripts/soak.py --minutes 10

Sessions are opened and abandoned continuously (never closed), a writer adds and removes entries,
and a Hermes-style external writer edits MEMORY.md beside it. Every few seconds the daemon's RSS
(/proc/<pid>/status VmRSS), its open sessions (status) and the latency of a `hello` (a proxy for
request backlog) are printed. The home's config sets `memd: {session_idle_seconds: 2}`.

Violations: RSS over 96 MB or still growing after warm-up; abandoned sessions not expired (the
open count must stay bounded, and fall to zero once the load stops); latency growing over the run;
a write refused; an external edit lost.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field
from statistics import median

from harness_common import (
    FILENAMES, Deadline, Report, hermes_append, log_problems, memories_dir, percentile, rss_kb,
    running_daemon, wait_for,
)

from memd_client import Client, MemdError, SessionClosed

IDLE_SECONDS = 2.0
# About 80 MB at rest, some 19 MB of it the scanner's learned model (memd/core/learned.py).
RSS_LIMIT_KB = 96 * 1024


@dataclass
class Sample:
    at: float
    rss_kb: int
    sessions: int
    requests: int
    probe_ms: float
    write_ms: list[float] = field(default_factory=list)


class Load:
    """The traffic: abandoned sessions, writes, external edits, each on its own thread."""

    def __init__(self, endpoint: str, store: str, open_rate: float, write_rate: float, external_interval: float, seed: int) -> None:
        self.endpoint = endpoint
        self.store = store
        self.open_rate = open_rate
        self.write_rate = write_rate
        self.external_interval = external_interval
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.write_latency: list[float] = []
        self.problems: list[str] = []
        self.opened = 0
        self.writes = 0
        self.external_edits = 0
        self.external_live: list[str] = []
        self.session_reopened = 0
        self.threads = [
            threading.Thread(target=self._guard(self.open_sessions), daemon=True),
            threading.Thread(target=self._guard(self.write), daemon=True),
            threading.Thread(target=self._guard(self.edit_externally), daemon=True),
        ]

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except Exception as error:  # a harness thread must report, not die silently
                self.problems.append(f"{body.__name__}: {type(error).__name__}: {error}")
        return run

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _pace(self, rate: float) -> None:
        self.stop.wait(self.rng.expovariate(rate))

    def open_sessions(self) -> None:
        with Client(self.endpoint, timeout=30.0, autostart=False) as client:
            while not self.stop.is_set():
                session = client.open_session(f"soak-abandoned-{self.opened}")
                if self.rng.random() < 0.3:
                    session.refresh()  # used once, then abandoned like the rest
                self.opened += 1
                self._pace(self.open_rate)

    def write(self) -> None:
        own: list[str] = []
        serial = 0
        with Client(self.endpoint, timeout=30.0, autostart=False) as client:
            session = client.open_session("soak-writer")
            while not self.stop.is_set():
                serial += 1
                if len(own) >= 8 or (own and self.rng.random() < 0.4):
                    args = {"action": "remove", "target": "memory", "old_text": own[0]}
                else:
                    args = {"action": "add", "target": self.rng.choice(("memory", "user")), "content": f"soak-{serial} a note"}
                started = time.perf_counter()
                try:
                    reply = session.memory(args)
                except SessionClosed:  # idle longer than the expiry (a slow moment): open again
                    self.session_reopened += 1
                    session = client.open_session("soak-writer")
                    continue
                elapsed = time.perf_counter() - started
                if reply.get("code") != "ok":
                    self.problems.append(f"write {args} answered {reply}")
                    return
                with self.lock:
                    self.write_latency.append(elapsed)
                    self.writes += 1
                if args["action"] == "remove":
                    own.pop(0)
                elif args["target"] == "memory":
                    own.append(args["content"])
                else:  # keep USER.md small: take it straight back out
                    reply = session.memory(action="remove", target="user", old_text=args["content"])
                    if reply.get("code") != "ok":
                        self.problems.append(f"removing {args['content']!r} from USER.md answered {reply}")
                        return
                self._pace(self.write_rate)

    def edit_externally(self) -> None:
        """A Hermes agent in another process: appends an entry, and drops its oldest one."""
        from pathlib import Path

        store = Path(self.store)
        while not self.stop.wait(self.external_interval):
            entry = f"ext-soak-{self.external_edits} from Hermes"
            drop = self.external_live[0] if len(self.external_live) >= 4 else None
            hermes_append(store, entry, drop)
            self.external_edits += 1
            self.external_live.append(entry)
            if drop is not None:
                self.external_live.remove(drop)

    def take_write_latency(self) -> list[float]:
        with self.lock:
            taken, self.write_latency = self.write_latency, []
        return taken


def observe(
    daemon: Any, load: Load, deadline: Deadline, started: float, sample_seconds: float, echo: bool,
) -> tuple[list[Sample], int, float, bool, list[str]]:
    """Sample the daemon while the load runs; then stop the load and wait for sessions to expire."""
    samples: list[Sample] = []
    with daemon.client(timeout=30.0) as probe:
        load.start()
        last_requests, last_at = probe.status()["requests"], time.monotonic()
        while not deadline.passed and not load.problems:
            time.sleep(min(sample_seconds, deadline.remaining))
            t0 = time.perf_counter()
            probe.hello()
            probe_ms = (time.perf_counter() - t0) * 1000
            status = probe.status()
            now = time.monotonic()
            sample = Sample(now - started, rss_kb(daemon.pid) or 0, status["sessions_all_profiles"], status["requests"], probe_ms, load.take_write_latency())
            rate = (sample.requests - last_requests) / max(1e-9, now - last_at)
            last_requests, last_at = sample.requests, now
            samples.append(sample)
            if echo:
                writes = sample.write_ms
                print(
                    f"{sample.at:7.0f} {sample.rss_kb / 1024:9.1f} {sample.sessions:9d} {rate:7.0f} {probe_ms:9.2f} "
                    f"{percentile(writes, 0.5) * 1000:8.2f}/{percentile(writes, 0.99) * 1000:.2f}",
                    flush=True,
                )
        load.finish()
        # With the load stopped, every abandoned session must expire.
        stopped = time.monotonic()
        expired = wait_for(lambda: probe.status()["sessions_all_profiles"] == 0, timeout=IDLE_SECONDS * 3 + 10, interval=0.25)
        expiry_wait = time.monotonic() - stopped
        final_sessions = probe.status()["sessions_all_profiles"]
        wait_for(lambda: set(load.external_live) <= set(probe.entries()), timeout=10)
        entries = probe.entries()
    return samples, final_sessions, expiry_wait, expired, entries


def trend_kb(samples: list[Sample]) -> float:
    """RSS growth across the samples: median of the last third minus median of the first."""
    third = max(1, len(samples) // 3)
    return median(s.rss_kb for s in samples[-third:]) - median(s.rss_kb for s in samples[:third])


def run_soak(
    minutes: float = 10.0, sample_seconds: float = 5.0, open_rate: float = 20.0, write_rate: float = 20.0,
    external_interval: float = 1.0, warmup_fraction: float = 0.25, seed: int | None = None, echo: bool = True,
) -> Report:
    seed = random.randrange(2**32) if seed is None else seed
    report = Report(f"soak: {minutes:g} min, {open_rate:g} abandoned sessions/s, {write_rate:g} writes/s, idle expiry {IDLE_SECONDS:g}s, seed {seed}")
    config = {"memd": {"session_idle_seconds": IDLE_SECONDS}}
    with running_daemon(config) as daemon:
        store = memories_dir(daemon.home) / FILENAMES["memory"]
        load = Load(daemon.endpoint, str(store), open_rate, write_rate, external_interval, seed)
        started = time.monotonic()
        deadline = Deadline(minutes * 60)
        if echo:
            print(f"{'t (s)':>7} {'RSS (MB)':>9} {'sessions':>9} {'req/s':>7} {'hello ms':>9} {'write p50/p99 ms':>17}", flush=True)
        try:
            samples, final_sessions, expiry_wait, expired, entries = observe(daemon, load, deadline, started, sample_seconds, echo)
        except MemdError as error:
            load.finish()
            report.violation(f"the daemon stopped answering: {error}")
            final_sessions, expiry_wait, expired, entries = -1, 0.0, True, None
        for problem in load.problems:
            report.violation(problem)
        for entry in load.external_live if entries is not None else ():
            if entry not in entries:
                report.violation(f"external edit lost: {entry!r} is not in the live entries")
        if not expired:
            report.violation(f"{final_sessions} abandoned session(s) still open {IDLE_SECONDS * 3 + 10:g}s after the load stopped")
        for line in log_problems(daemon):
            report.violation(f"daemon log: {line}")
    judge(report, samples, warmup_fraction, open_rate)
    report.figure("sessions opened and abandoned", f"{load.opened:,}")
    report.figure("writes", f"{load.writes:,} (writer session expired and reopened {load.session_reopened}x)")
    report.figure("external edits (Hermes way)", f"{load.external_edits:,}")
    report.figure("sessions after the load stopped", f"{final_sessions} (waited {expiry_wait:.1f} s)")
    return report


def judge(report: Report, samples: list[Sample], warmup_fraction: float, open_rate: float) -> None:
    if len(samples) < 3:
        report.violation(f"only {len(samples)} samples: run longer")
        return
    steady = samples[int(len(samples) * warmup_fraction):]
    peak = max(s.rss_kb for s in samples)
    growth = trend_kb(steady)
    report.figure("RSS", f"start {samples[0].rss_kb / 1024:.1f} MB, peak {peak / 1024:.1f} MB, end {samples[-1].rss_kb / 1024:.1f} MB")
    report.figure("RSS trend after warm-up", f"{growth / 1024:+.1f} MB (first third to last third of {len(steady)} samples)")
    if peak > RSS_LIMIT_KB:
        report.violation(f"RSS peaked at {peak / 1024:.1f} MB, over {RSS_LIMIT_KB / 1024:.0f} MB")
    if growth > max(2048, 0.05 * median(s.rss_kb for s in steady)):
        report.violation(f"RSS still growing after warm-up: {growth / 1024:+.1f} MB")
    sessions = [s.sessions for s in steady]
    report.figure("open sessions", f"min {min(sessions)}, median {median(sessions):.0f}, max {max(sessions)}")
    # Abandoned sessions live for the idle time plus at most one expiry interval.
    bound = open_rate * (IDLE_SECONDS * 2 + 5) + 10
    if max(sessions) > bound:
        report.violation(f"{max(sessions)} open sessions: abandoned sessions are not expiring (bound {bound:.0f})")
    third = max(1, len(steady) // 3)
    early = median(s.probe_ms for s in steady[:third])
    late = median(s.probe_ms for s in steady[-third:])
    writes_early = [w for s in steady[:third] for w in s.write_ms]
    writes_late = [w for s in steady[-third:] for w in s.write_ms]
    report.figure("hello latency (backlog)", f"median {early:.2f} ms early, {late:.2f} ms late; max {max(s.probe_ms for s in steady):.1f} ms")
    report.figure("write latency", (
        f"p50 {percentile(writes_early, 0.5) * 1000:.2f} ms early, {percentile(writes_late, 0.5) * 1000:.2f} ms late; "
        f"p99 {percentile(writes_early, 0.99) * 1000:.2f} / {percentile(writes_late, 0.99) * 1000:.2f} ms"
    ))
    if late > 3 * early + 5:
        report.violation(f"requests are backing up: hello took {early:.2f} ms early and {late:.2f} ms late")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--open-rate", type=float, default=20.0, help="sessions opened and abandoned per second")
    parser.add_argument("--write-rate", type=float, default=20.0, help="writes per second")
    parser.add_argument("--external-interval", type=float, default=1.0, help="seconds between external edits")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    return run_soak(args.minutes, args.sample_seconds, args.open_rate, args.write_rate, args.external_interval, seed=args.seed).exit_status()


if __name__ == "__main__":
    sys.exit(main())
