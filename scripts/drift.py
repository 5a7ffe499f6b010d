#!/usr/bin/env python3
"""Edit MEMORY.md from outside, every way people and tools do, while a client writes to it.

    python scripts/drift.py --rounds 10

Kinds of outside edit (none of them takes memd's lock, as shells and editors do not): a shell
append (free text, a new entry, a stray delimiter, a repeated entry), an editor save through a
temp file and rename, truncation (to nothing, and mid-file), a huge paste (over the store's limit,
and over the 8 MiB memd reads at all), invalid UTF-8, a CRLF rewrite, and deleting the file.

Checks, for every edit:
- every byte written from outside is adopted (visible in `entries`) or preserved in a backup
  (`MEMORY.md.bak.*`) — or, for a file memd cannot read, still in the file, untouched;
- what the file held before a truncation to nothing or a deletion is in a backup;
- while the store is drifted or unreadable, replace, remove and batch are refused and leave the
  file byte for byte as it was; an add keeps every byte and appends (refused when unreadable);
- the daemon's entries end up equal to the file's, and the daemon stays up.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_common import (
    FILENAMES, Report, hermes_write, log_problems, memories_dir, process_alive, running_daemon, wait_for,
)

from memd.config import DEFAULT_LIMITS
from memd.core.format import DELIMITER, drift_reason, parse_entries
from memd.disk import MAX_STORE_BYTES, decode_store
from memd.engine import DISPLACED_SECONDS
from memd_client import Client, MemdError

LIMIT = DEFAULT_LIMITS["memory"]
BASELINE = ("base-1 the project uses Python 3.11", "base-2 tests run with pytest -q", "base-3 deploys on Fridays are banned")


@dataclass
class Edit:
    """What an outside edit wrote, and what must survive it."""

    kind: str
    payloads: list[bytes]  # written from outside: adopted, backed up, or (unreadable) in the file
    before: bytes = b""  # the file before the edit
    keep_before: bool = False  # truncation to nothing or deletion: `before` must be in a backup
    unreadable: bool = False  # memd cannot decode the result: the bytes must stay in the file


def _write_unlocked(path: Path, raw: bytes, mode: str = "wb") -> None:
    with open(path, mode) as handle:
        handle.write(raw)


def shell_append(path: Path, rng: random.Random, tag: str) -> Edit:
    variant = rng.choice(("text", "entry", "stray delimiter", "repeated entry"))
    if variant == "text":
        raw = f"\n{tag} free text appended by echo >>\n".encode()
    elif variant == "entry":
        raw = f"\n§\n{tag} an entry appended by a shell".encode()
    elif variant == "stray delimiter":
        raw = f"\n§\n\n§\n{tag} after an empty entry".encode()
    else:
        raw = f"\n§\n{BASELINE[0]}\n§\n{tag} after a repeated entry".encode()
    _write_unlocked(path, raw, "ab")
    return Edit(f"shell append ({variant})", [f"{tag}".encode()])


def editor_save(path: Path, rng: random.Random, tag: str) -> Edit:
    """Write a temp file beside the store and rename it over, as most editors save."""
    text = path.read_bytes().decode("utf-8", errors="replace") if path.exists() else ""
    entries = parse_entries(text)
    variant = rng.choice(("new entry", "edited entry", "free text"))
    if variant == "new entry":
        entries.insert(rng.randint(0, len(entries)), f"{tag} inserted in an editor")
        new = DELIMITER.join(entries)
    elif variant == "edited entry" and entries:
        index = rng.randrange(len(entries))
        entries[index] = f"{entries[index]} ({tag} edited in an editor)"
        new = DELIMITER.join(entries)
    else:
        new = text + f"\n\n{tag} a paragraph typed in an editor\n" + "x" * (LIMIT + 10)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".editor-", suffix=".swp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(new.encode())
    os.replace(temp, path)
    return Edit(f"editor save ({variant})", [tag.encode()])


def truncation(path: Path, rng: random.Random, tag: str) -> Edit:
    before = path.read_bytes() if path.exists() else b""
    if rng.random() < 0.5 or len(before) < 2:
        os.truncate(path, 0)
        return Edit("truncation (to nothing)", [], before, keep_before=True)
    cut = rng.randrange(1, len(before))
    os.truncate(path, cut)
    text, _ = decode_store(before[:cut])
    return Edit("truncation (mid-file)", [], before, unreadable=text is None)


def huge_paste(path: Path, rng: random.Random, tag: str) -> Edit:
    over_cap = rng.random() < 0.2
    size = MAX_STORE_BYTES + 1024 if over_cap else rng.choice((LIMIT + 1, 50_000, 500_000))
    head, tail = f"\n{tag}-start ".encode(), f" {tag}-end\n".encode()
    _write_unlocked(path, head + b"p" * size + tail, "ab")
    return Edit(f"huge paste ({'over 8 MiB' if over_cap else 'over the limit'})", [head.strip(), tail.strip()], unreadable=over_cap)


def invalid_utf8(path: Path, rng: random.Random, tag: str) -> Edit:
    raw = b"\n\xff\xfe" + f"{tag} with invalid UTF-8".encode() + b"\xc3\x28"
    _write_unlocked(path, raw, "ab")
    return Edit("invalid UTF-8", [raw], unreadable=True)


def crlf_rewrite(path: Path, rng: random.Random, tag: str) -> Edit:
    text = path.read_bytes().decode("utf-8", errors="replace") if path.exists() else ""
    new = (text + f"\n§\n{tag} added with Windows line ends").replace("\n", "\r\n")
    _write_unlocked(path, new.encode())
    return Edit("CRLF rewrite", [tag.encode()])


def deletion(path: Path, rng: random.Random, tag: str) -> Edit:
    before = path.read_bytes() if path.exists() else b""
    path.unlink(missing_ok=True)
    return Edit("deletion", [], before, keep_before=True)


KINDS: dict[str, Callable[[Path, random.Random, str], Edit]] = {
    "shell_append": shell_append, "editor_save": editor_save, "truncation": truncation,
    "huge_paste": huge_paste, "invalid_utf8": invalid_utf8, "crlf_rewrite": crlf_rewrite, "deletion": deletion,
}


@dataclass
class ClientWriter:
    """A client writing its own entries (adds, replaces, removes) as fast as it can."""

    endpoint: str
    tag: str
    stop: threading.Event = field(default_factory=threading.Event)
    codes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    # Entries this client replaced or removed (from the replies): outside text merged into one of
    # them was adopted, then edited away by a client, which is the client's doing, not a loss.
    touched: list[str] = field(default_factory=list)

    def run(self) -> None:
        rng = random.Random(self.tag)
        own: list[str] = []
        with Client(self.endpoint, timeout=20.0, autostart=False) as client:
            session = client.open_session(f"drift-writer-{self.tag}")
            for serial in range(10_000):
                if self.stop.is_set():
                    return
                new = f"cw-{self.tag}-{serial} written by a client"
                live = client.entries()
                own = [entry for entry in own if entry in live]  # an outside edit may have taken it
                if len(own) < 2 or (len(own) < 4 and rng.random() < 0.4):
                    args: dict[str, Any] = {"action": "add", "content": new}
                elif rng.random() < 0.5:
                    args = {"action": "replace", "old_text": own[0], "content": new}
                else:
                    args = {"action": "remove", "old_text": own[0]}
                try:
                    reply = session.memory(args)
                except MemdError as error:
                    self.problems.append(f"{args['action']}: {error}")
                    return
                code = reply.get("code", "?")
                self.codes[f"{args['action']} {code}"] += 1
                self.touched.extend(reply[key] for key in ("replaced_entry", "removed_entry") if key in reply)
                if code == "ok":
                    if args["action"] != "add":
                        own.pop(0)
                    if args["action"] != "remove":
                        own.append(new)
                elif code not in ("drift", "unreadable", "over_budget", "no_match", "consolidation_exhausted"):
                    self.problems.append(f"{args} answered {reply}")
                if code in ("no_match", "over_budget", "consolidation_exhausted"):
                    session.new_turn()  # an outside edit took the entry away, or filled the store


class DriftRun:
    def __init__(self, daemon: Any, report: Report, rng: random.Random) -> None:
        self.daemon = daemon
        self.report = report
        self.rng = rng
        self.store = memories_dir(daemon.home) / FILENAMES["memory"]
        self.client = daemon.client(timeout=20.0)
        self.session = self.client.open_session("drift-probe")
        self.outcomes: Counter[str] = Counter()
        self.writer_codes: Counter[str] = Counter()

    def backups(self, since: set[Path] = frozenset()) -> list[bytes]:
        """The content of every backup beside the store, except those named in `since`."""
        return [path.read_bytes() for path in self.backup_paths() - since]

    def backup_paths(self) -> set[Path]:
        return set(self.store.parent.glob(f"{self.store.name}.bak.*"))

    def store_status(self) -> dict[str, Any]:
        return self.client.status()["stores"]["memory"]

    def reset(self) -> None:
        """A clean store holding the baseline, adopted by the daemon."""
        hermes_write(self.store, lambda _old: DELIMITER.join(BASELINE))
        if not wait_for(lambda: self.client.entries() == list(BASELINE) and self.clean(), timeout=15):
            self.report.violation(f"the daemon did not adopt a clean rewrite: {self.store_status()}")

    def clean(self) -> bool:
        status = self.store_status()
        return status["drift"] is None and status["unreadable"] is None

    def settled(self, edit: Edit) -> bool:
        """The daemon has taken in the file as it is now."""
        raw = self.store.read_bytes() if self.store.exists() else b""
        text, _ = decode_store(raw)
        status = self.store_status()
        if text is None:
            return status["unreadable"] is not None
        if status["unreadable"] is not None:
            return False
        entries = parse_entries(text)
        drifted = drift_reason(text, LIMIT) is not None
        return self.client.entries() == entries and (status["drift"] is not None) == drifted

    def trial(self, kind: str, number: int) -> None:
        tag = f"ext-{kind}-{number}"
        self.reset()
        self.session.new_turn()  # the probe's refusals must not add up to consolidation_exhausted
        writer = ClientWriter(self.daemon.endpoint, f"{number}")
        thread = threading.Thread(target=writer.run, daemon=True)
        thread.start()
        time.sleep(self.rng.uniform(0.02, 0.2))
        earlier = self.backup_paths()
        edit = KINDS[kind](self.store, self.rng, tag)
        edited_at = time.monotonic()
        time.sleep(self.rng.uniform(0.2, 0.6))
        writer.stop.set()
        thread.join(timeout=30)
        self.writer_codes.update(writer.codes)
        for problem in writer.problems:
            self.report.violation(f"{edit.kind}: client writer: {problem}")
        if not wait_for(lambda: self.settled(edit), timeout=15):
            self.report.violation(f"{edit.kind}: the daemon did not take in the file: {self.store_status()}")
        # What a program wrote into a version a rewrite displaced is backed up when memd lets go of that
        # version, DISPLACED_SECONDS after the swap: judged after that time (the status request wakes the daemon,
        # which lets go of its old versions after every request).
        time.sleep(max(0.0, edited_at + DISPLACED_SECONDS + 0.2 - time.monotonic()))
        self.store_status()
        where = self.check_survival(edit, writer.touched, earlier)
        status = self.store_status()
        if status["drift"] is not None or status["unreadable"] is not None:
            self.probe_refusals(edit, unreadable=status["unreadable"] is not None)
        state = "unreadable" if status["unreadable"] else "drift" if status["drift"] else "clean"
        self.outcomes[f"{edit.kind}: {where}, store {state}"] += 1

    def check_survival(self, edit: Edit, touched: list[str], earlier: set[Path]) -> str:
        """Where what the edit wrote (or, for a wipe, what the file held) is now."""
        raw = self.store.read_bytes() if self.store.exists() else b""
        adopted = DELIMITER.join([*self.client.entries(), *touched]).encode()
        backups = self.backups(since=earlier)
        places = set()
        for payload in edit.payloads:
            if edit.unreadable and payload in raw:
                places.add("left in the file")
            elif payload in adopted:
                places.add("adopted")
            elif any(payload in backup for backup in backups):
                places.add("backed up")
            else:
                places.add("LOST")
                self.report.violation(
                    f"{edit.kind}: bytes written from outside were lost: {payload[:80]!r} is neither in the "
                    f"entries nor in any of {len(backups)} backup(s)" + (" nor in the file" if edit.unreadable else "")
                )
        if edit.keep_before and edit.before.strip():
            # The baseline entries (no client touches them) were wiped from outside: they must be
            # in a backup, or still live (a client write that raced the wipe put them back).
            kept = [entry.encode() for entry in BASELINE if entry.encode() in edit.before]
            if any(all(entry in backup for entry in kept) for backup in backups):
                places.add("previous content backed up")
            elif all(entry in adopted for entry in kept):
                places.add("previous content still live")
            else:
                places.add("previous content LOST")
                self.report.violation(f"{edit.kind}: what the file held before ({len(edit.before)} bytes) is in no backup")
        return " + ".join(sorted(places)) or "nothing to keep"

    def probe_refusals(self, edit: Edit, unreadable: bool) -> None:
        """A drifted or unreadable file is never rewritten by replace, remove or batch."""
        expected = "unreadable" if unreadable else "drift"
        calls = (
            {"action": "replace", "old_text": "base-2", "content": "probe replacement"},
            {"action": "remove", "old_text": "base-3"},
            {"operations": [{"action": "remove", "old_text": "base-1"}, {"action": "add", "content": "probe batch"}]},
        )
        for args in calls:
            before = self.store.read_bytes()
            reply = self.session.memory(args)
            after = self.store.read_bytes()
            action = args.get("action", "batch")
            if reply.get("code") != expected:
                self.report.violation(f"{edit.kind}: {action} on a store that is {expected} answered {reply.get('code')}: {reply.get('error', '')[:120]}")
            if after != before:
                self.report.violation(f"{edit.kind}: {action} rewrote a file that is {expected}")
        before = self.store.read_bytes()
        reply = self.session.memory(action="add", content=f"probe add after {edit.kind}")
        after = self.store.read_bytes()
        if unreadable:
            if reply.get("code") != "unreadable" or after != before:
                self.report.violation(f"{edit.kind}: add on an unreadable store answered {reply.get('code')} and {'kept' if after == before else 'changed'} the file")
        elif reply.get("code") != "ok" and reply.get("code") != "over_budget":
            self.report.violation(f"{edit.kind}: add on a drifted store answered {reply}")
        elif reply.get("code") == "ok" and not after.startswith(before.strip()):
            self.report.violation(f"{edit.kind}: add on a drifted store did not keep the file's bytes")


def run_drift(rounds: int = 10, kinds: list[str] | None = None, seed: int | None = None) -> Report:
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    kinds = kinds or list(KINDS)
    report = Report(f"drift: {rounds} round(s) of {len(kinds)} kinds of outside edit during client writes, seed {seed}")
    started = time.monotonic()
    with running_daemon() as daemon:
        run = DriftRun(daemon, report, rng)
        pid = daemon.pid
        trials = 0
        try:
            for number in range(rounds):
                for kind in rng.sample(kinds, len(kinds)):
                    run.trial(kind, trials)
                    trials += 1
            if run.client.hello()["pid"] != pid or not process_alive(daemon):
                report.violation("the daemon restarted or died")
        finally:
            run.client.close()
        backups = len(list(run.store.parent.glob(f"{run.store.name}.bak.*")))
        log = daemon.log()
        reapplied, displaced = log.count("changed while being rewritten"), log.count("as memd rewrote it")
        for line in log_problems(daemon):
            report.violation(f"daemon log: {line}")
    report.figure("outside edits", trials)
    for outcome, count in sorted(run.outcomes.items()):
        report.figure(f"  {outcome}", count)
    report.figure("backups written", backups)
    report.figure("outside change caught mid-write", f"{reapplied} time(s) before the rename (calls applied again), {displaced} at the rename (version saved as a backup)")
    report.figure("client writes meanwhile", ", ".join(f"{key} {value}" for key, value in sorted(run.writer_codes.items())))
    report.figure("time", f"{time.monotonic() - started:.1f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every kind of edit")
    parser.add_argument("--kinds", nargs="*", choices=sorted(KINDS), help="only these kinds")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    return run_drift(args.rounds, args.kinds, args.seed).exit_status()


if __name__ == "__main__":
    sys.exit(main())
