"""The `memd` command: one small function per subcommand, its help text beside it.

A subcommand is a function registered with `@command`; its docstring is its help (the first
line is the summary `memd --help` lists). Subcommands that talk to the daemon share
--endpoint, --profile, --timeout and --no-autostart; all but `serve` take --json, which prints
one JSON document on stdout instead of text.

Exit codes: 0 done; 1 refused (the output says why); 2 usage error; 3 daemon unreachable.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from memd import __version__
from memd.config import ConfigError, default_home, load_settings, profile_home, profile_name
from memd.core.render import FILENAMES
from memd.core.store import TARGETS
from memd.display import DESCRIPTIONS, age, backup_time, count, duration, indented, numbered, usage_bar, visible
from memd_client import Client, DaemonUnavailable, MemdError, RequestRefused
from memd_client.client import autostart_enabled, daemon_absent
from memd_client import protocol as wire

if TYPE_CHECKING:
    from memd.service import Report

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
SESSION_NAME = "cli"
log = logging.getLogger("memd")


class UsageError(Exception):
    """The command line asks for something that cannot be done as written (exit 2)."""


class Refusal(Exception):
    """Something other than the daemon refused (exit 1); the message says why."""


# -- the registry -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    run: Callable[[argparse.Namespace], int]
    arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...]
    daemon: bool  # takes the options for reaching the daemon
    output: bool  # takes --json
    dry_run: bool


COMMANDS: list[Command] = []


def arg(*flags: str, **options: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """One argparse argument of a command, declared beside the command."""
    return flags, options


def command(
    name: str, *arguments: tuple[tuple[str, ...], dict[str, Any]], daemon: bool = True,
    output: bool = True, dry_run: bool = False,
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.append(Command(name, run, arguments, daemon, output, dry_run))
        return run
    return register


TARGET = arg("target", choices=TARGETS, help="memory (agent notes, MEMORY.md) or user (user profile, USER.md)")
OPTIONAL_TARGET = arg("target", nargs="?", choices=TARGETS, help="memory or user (default: both)")


# -- shared helpers -----------------------------------------------------------------------


def emit(args: argparse.Namespace, data: Any, lines: Iterable[str]) -> None:
    """The result: `data` as JSON with --json, else `lines` as text."""
    if args.json:
        print(json.dumps(data, ensure_ascii=False, indent=2))
    else:
        for line in lines:
            print(line)


def connect(args: argparse.Namespace, *, autostart: bool = True) -> Client:
    """A client for the daemon the options name; autostart follows the defaults and
    --no-autostart, and is off for commands that only observe."""
    enabled = None if autostart and not args.no_autostart else False
    return Client(args.endpoint, timeout=args.timeout, autostart=enabled)


def endpoint_of(args: argparse.Namespace) -> str:
    return args.endpoint or wire.default_endpoint()


def read_input(source: str) -> str:
    """A file's text, or standard input for `-`."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {source}: {error}") from None


def text_argument(value: str) -> str:
    return read_input("-") if value == "-" else value


HINTS = {
    "over_budget": "Make room first with `memd edit {target}` (or `memd remove {target} TEXT`), then try again.",
    "no_match": "See the entries with `memd show {target}`.",
    "ambiguous": "Use a longer piece of text that only one entry contains (`memd show {target}`).",
    "would_empty": "To empty the store on purpose, remove its entries one at a time with `memd remove {target} TEXT`.",
    "unreadable": "`memd doctor` explains how to repair the file.",
}


def reply_lines(reply: Mapping[str, Any], target: str, *, hint: bool = True) -> list[str]:
    """A memory reply for a person: what happened and the usage, or why not and (with `hint`)
    which command to use next."""
    name = FILENAMES[target]
    if reply.get("success"):
        lines = [f"{reply['message']} {name}: {reply['usage']}, {count(reply['entry_count'], 'entry')}."]
        if reply.get("dry_run"):
            lines.append("Dry run: nothing was written.")
            for change in reply.get("changes", []):
                if change.get("old") is not None:
                    lines += indented(change["old"], f"  - {change['action']}: ")
                if change.get("new") is not None:
                    lines += indented(change["new"], f"  + {change['action']}: ")
        return lines
    lines = [f"memd: refused ({reply.get('code')}): {reply.get('error', '')}"]
    if reply.get("matches"):
        lines.append("Matching entries:")
        lines += numbered(reply["matches"], "  ")
    elif reply.get("current_entries") is not None:
        lines.append(f"Current entries of {name} ({reply.get('usage', '')}):")
        lines += numbered(reply["current_entries"], "  ") or ["  (none)"]
    if reply.get("remediation"):
        lines.append(reply["remediation"])
    next_step = HINTS.get(str(reply.get("code")))
    if hint and next_step:
        lines.append(next_step.format(target=target))
    return lines


def memory_call(args: argparse.Namespace, call: dict[str, Any]) -> int:
    """Open a short session, make one memory call, close; print the reply."""
    call["target"] = args.target
    if args.dry_run:
        call["dry_run"] = True
    with connect(args) as client, client.open_session(SESSION_NAME, args.profile) as session:
        reply = session.memory(call)
    if args.json:
        emit(args, reply, [])
    elif reply.get("success"):
        emit(args, reply, reply_lines(reply, args.target))
    else:
        print("\n".join(reply_lines(reply, args.target)), file=sys.stderr)
    return EXIT_OK if reply.get("success") else EXIT_REFUSED


# -- the daemon ---------------------------------------------------------------------------


def daemon_endpoint(given: str | None) -> str:
    """The endpoint `memd serve` binds: the flag, `$MEMD_ENDPOINT`, systemd's runtime directory,
    else the client's default (so that clients find the daemon without being told)."""
    if given:
        return given
    if os.environ.get("MEMD_ENDPOINT"):
        return os.environ["MEMD_ENDPOINT"]
    runtime_directory = os.environ.get("RUNTIME_DIRECTORY")
    if runtime_directory:
        return f"ipc://{Path(runtime_directory.split(':')[0]) / 'memd.sock'}"
    return wire.default_endpoint()


@command(
    "serve",
    arg("--home", help="memory home (default: $HERMES_HOME or ~/.hermes)"),
    arg("--endpoint", help="ipc://PATH or tcp://HOST:PORT (default: $MEMD_ENDPOINT, else "
                           "$RUNTIME_DIRECTORY/memd.sock under systemd, else the runtime dir)"),
    arg("--config", help="config file (default: <home>/config.yaml)"),
    daemon=False, output=False,
)
def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground.

    One daemon serves one memory home and all its profiles; a second one for the same home
    refuses to start. It stops cleanly on SIGTERM or Ctrl-C. Under systemd (Type=notify) it
    reports readiness and pings the watchdog.
    """
    from memd.server import serve

    home = Path(args.home).expanduser() if args.home else default_home()
    try:
        settings = load_settings(home, Path(args.config) if args.config else None)
    except ConfigError as error:
        log.error("memd cannot start: %s", error)
        return EXIT_USAGE
    return serve(settings, daemon_endpoint(args.endpoint))


def status_lines(status: Mapping[str, Any]) -> list[str]:
    lines = [
        f"memd {status['version']} is running: pid {status['pid']}, up {duration(status['uptime'])}",
        f"home       {status['home']}" + (f" (profile {status['profile']})" if status.get("profile") else ""),
        f"endpoint   {status['endpoint']}",
        f"sessions   {status['sessions']} open" + (
            f" ({status['sessions_all_profiles']} across profiles)"
            if status["sessions_all_profiles"] != status["sessions"] else ""),
        f"served     {count(status['operations'], 'memory operation')}, {count(status['writes'], 'write')}, "
        f"{count(status['requests'], 'request')}",
    ]
    drifts: list[str] = []
    backups: list[str] = []
    for target, store in status["stores"].items():
        name = FILENAMES[target]
        usage = f"{store['usage']}, {count(store['entry_count'], 'entry')}"
        lines.append(f"{name:<10} {usage_bar(store['chars'], store['limit'])}  {usage}")
        if store["unreadable"]:
            lines.append(f"{'':<10} ⚠ cannot be read ({store['unreadable']}); writes are refused. See `memd doctor`.")
        if store["drift"]:
            drift = store["drift"]
            drifts.append(
                f"{name} was edited outside memd {age(drift['since'])} ({drift['reason']}); "
                f"backup: {drift['backup']}. Fix: memd edit {target}"
            )
        if store["last_backup"]:
            when = backup_time(store["last_backup"])
            backups.append(f"{store['last_backup']}" + (f" ({age(when)})" if when else ""))
    for label, items in (("drift", drifts), ("backups", backups)):
        lines.append(f"{label:<10} {items[0] if items else 'none'}")
        lines += [f"{'':<10} {item}" for item in items[1:]]
    return lines


@command("status")
def cmd_status(args: argparse.Namespace) -> int:
    """Show whether the daemon runs, its sessions and work, and how full and healthy each store is.

    Never starts the daemon. --json prints the daemon's status with "running": true, or
    {"running": false, "endpoint": ..., "error": ...} with exit code 3.
    """
    endpoint = endpoint_of(args)
    try:
        if daemon_absent(endpoint):  # answered at once rather than after the timeout
            raise DaemonUnavailable(f"nothing listens at {endpoint}")
        with connect(args, autostart=False) as client:
            status = client.status(args.profile)
    except DaemonUnavailable as error:
        emit(args, {"running": False, "endpoint": endpoint, "error": str(error)}, [
            f"memd is not running at {endpoint}.",
            "Agents and memd commands start it on demand (unless MEMD_AUTOSTART=0); to run it "
            "yourself: memd serve, or as a service: memd install-service",
        ])
        return EXIT_UNREACHABLE
    emit(args, {"running": True, **status}, status_lines(status))
    return EXIT_OK


# -- reading memory -----------------------------------------------------------------------


def describe_store(target: str, store: Mapping[str, Any], entries: Sequence[str]) -> dict[str, Any]:
    """A store as `show` reports it; each entry carries what the injection scanner finds in it."""
    from memd.core.scan import scan

    described = []
    for number, entry in enumerate(entries, start=1):
        findings = scan(entry)
        described.append({
            "number": number, "text": entry, "chars": len(entry), "blocked": bool(findings),
            "findings": [{"id": finding.id, "category": finding.category} for finding in findings],
        })
    keys = ("usage", "chars", "limit", "entry_count", "over_budget", "drift", "unreadable", "last_backup", "path")
    return {"target": target, "file": FILENAMES[target], **{key: store[key] for key in keys}, "entries": described}


def naming_text(entry: str, width: int = 40) -> str:
    """The first words of an entry's first line: enough to name it in `memd remove`."""
    words = entry.split("\n", 1)[0].split(" ")
    named = words[0]
    for word in words[1:]:
        if len(named) + 1 + len(word) > width:
            break
        named += " " + word
    return named


def provenance_line(origin: Mapping[str, Any] | None) -> str:
    """Who wrote an entry as it stands, and when."""
    if not origin or origin.get("seq") is None:
        return "written before the journal began"
    who = origin["session"] or "outside memd"
    return f"{origin['action']} by {who}, {format_time(origin['time'])} (change #{origin['seq']})"


def show_lines(stores: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines: list[str] = []
    for target, store in stores.items():
        if lines:
            lines.append("")
        lines.append(f"{store['file']} ({DESCRIPTIONS[target]}): {store['usage']}, {count(store['entry_count'], 'entry')}")
        lines.append(usage_bar(store["chars"], store["limit"]))
        if store["drift"]:
            drift = store["drift"]
            lines.append(f"⚠ edited outside memd ({drift['reason']}); backup {drift['backup']}. Fix: memd edit {target}")
        if not store["entries"]:
            lines.append("  (no entries)")
        width = len(str(len(store["entries"])))
        pad = " " * (width + 4)
        for entry in store["entries"]:
            label = f"  {entry['number']:>{width}}. "
            if entry["blocked"]:
                categories = ", ".join(dict.fromkeys(finding["category"] for finding in entry["findings"]))
                lines.append(f"{label}⚠ POISONED ({categories}): agents see a [BLOCKED] notice instead of this entry")
                lines += indented(visible(entry["text"], reveal_invisible=True), pad + "│ ")
                lines.append(f"{pad}delete it: memd remove {target} {shlex.quote(naming_text(entry['text']))}")
            else:
                first, *rest = visible(entry["text"]).split("\n")
                lines.append(label + first)
                lines += [pad + line for line in rest]
            if "provenance" in entry:
                lines.append(f"{pad}└ {provenance_line(entry['provenance'])}")
    return lines


@command("show", OPTIONAL_TARGET, arg("--provenance", action="store_true", help="say who wrote each entry, and when"))
def cmd_show(args: argparse.Namespace) -> int:
    """List the live entries of the stores, numbered, with usage.

    Entries the injection scanner flags are marked POISONED: agents never see them (their
    system prompts carry a [BLOCKED] notice instead), and they stay in the file until a person
    deletes them. --json prints {"profile": ..., "stores": {"memory": {"usage", "chars",
    "limit", "entry_count", "drift", "entries": [{"number", "text", "blocked", "findings"}]...}}}.
    With --provenance each entry also has "provenance": {"seq", "time", "session", "action"},
    from the journal (seq null: written before the journal began).
    """
    targets = [args.target] if args.target else list(TARGETS)
    with connect(args) as client:
        status = client.status(args.profile)
        stores = {
            target: describe_store(target, status["stores"][target], client.entries(target, args.profile))
            for target in targets
        }
        if args.provenance:
            for target, store in stores.items():
                origins = {row["entry"]: row for row in client.provenance(target, args.profile)}
                for entry in store["entries"]:
                    origin = origins.get(entry["text"], {})
                    entry["provenance"] = {key: origin.get(key) for key in ("seq", "time", "session", "action")}
    emit(args, {"profile": args.profile, "stores": stores}, show_lines(stores))
    return EXIT_OK


@command("snapshot")
def cmd_snapshot(args: argparse.Namespace) -> int:
    """Print exactly what a new session would put in its system prompt.

    The memory block, then the user profile block, separated by a blank line; entries the
    scanner flags appear as [BLOCKED] notices. Nothing is printed for empty stores. --json
    prints {"memory": TEXT or null, "user": TEXT or null}.
    """
    with connect(args) as client:
        blocks = client.preview(args.profile)
    text = "\n\n".join(block for block in (blocks.memory, blocks.user) if block)
    emit(args, {"memory": blocks.memory, "user": blocks.user}, [text] if text else [])
    if not text and not args.json:
        print("(memory is empty: a new session's system prompt gets no memory blocks)", file=sys.stderr)
    return EXIT_OK


# -- changing memory ----------------------------------------------------------------------


@command("add", TARGET, arg("text", help="the entry; - reads it from standard input"), dry_run=True)
def cmd_add(args: argparse.Namespace) -> int:
    """Add an entry.

    Refused when it would take the store over its limit, or when the injection scanner finds
    instructions in it. --json prints the daemon's reply ({"success", "code", "usage", ...}).
    """
    return memory_call(args, {"action": "add", "content": text_argument(args.text)})


@command(
    "replace", TARGET,
    arg("old", help="text that occurs in exactly one entry (or a whole entry)"),
    arg("new", help="the entry that replaces it; - reads it from standard input"),
    dry_run=True,
)
def cmd_replace(args: argparse.Namespace) -> int:
    """Replace the entry containing OLD with NEW.

    --json prints the daemon's reply, with "replaced_entry" on success.
    """
    return memory_call(args, {"action": "replace", "old_text": args.old, "content": text_argument(args.new)})


@command("remove", TARGET, arg("old", help="text that occurs in exactly one entry (or a whole entry)"), dry_run=True)
def cmd_remove(args: argparse.Namespace) -> int:
    """Remove the entry containing OLD.

    --json prints the daemon's reply, with "removed_entry" on success.
    """
    return memory_call(args, {"action": "remove", "old_text": args.old})


def read_operations(source: str) -> list[Any]:
    try:
        document = yaml.safe_load(read_input(source))
    except yaml.YAMLError as error:
        raise UsageError(f"{source} is neither YAML nor JSON: {error}") from None
    if isinstance(document, Mapping) and "operations" in document:
        document = document["operations"]  # a whole tool call pasted from a log
    if not isinstance(document, list) or not document:
        raise UsageError(
            f"{source} must hold a list of operations, e.g.\n"
            "  - {action: remove, old_text: stale fact}\n"
            "  - {action: add, content: new fact}"
        )
    return document


@command(
    "batch", TARGET,
    arg("file", help="YAML or JSON list of {action, content?, old_text?}; - reads standard input"),
    dry_run=True,
)
def cmd_batch(args: argparse.Namespace) -> int:
    """Apply a list of operations atomically: all of them, or none.

    The budget is checked on the final state only, so one batch can remove, merge and add.
    FILE holds, in YAML or JSON:

        - {action: remove, old_text: "stale fact"}
        - {action: replace, old_text: "Python 3.10", content: "Project uses Python 3.12"}
        - {action: add, content: "New fact"}

    --json prints the daemon's reply.
    """
    return memory_call(args, {"operations": read_operations(args.file)})


# -- history ------------------------------------------------------------------------------


TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def time_argument(value: str) -> float:
    """A moment: Unix time, an ISO date/time in local time (`2026-12-02 18:30`), or an age
    (`90s`, `15m`, `2h`, `3d`, `1w` ago)."""
    text = value.strip()
    if text[:-1].replace(".", "", 1).isdigit() and text[-1:] in TIME_UNITS:
        return time.time() - float(text[:-1]) * TIME_UNITS[text[-1]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a time: use e.g. '2026-12-02 18:30', '2h' (ago) or a Unix time"
        ) from None


def format_time(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time).strftime("%Y-%m-%d %H:%M:%S")


STEP_MARKS = {"add": "+", "remove": "-", "replace": "~"}
ACTION_NAMES = {
    "external": "edited outside memd", "baseline": "found when the journal began",
    "drift_detected": "drift detected", "drift_resolved": "drift resolved", "unreadable": "became unreadable",
}


def log_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    lines: list[str] = []
    for record in records:
        who = record["session"] or "outside memd"
        what = ACTION_NAMES.get(record["action"], record["action"])
        if record.get("undo_of"):
            what += f" of #{record['undo_of']}"
        head = f"#{record['seq']:<5} {format_time(record['time'])}  {FILENAMES[record['target']]:<9}  {what}  by {who}"
        lines.append(head + (f"  → {record['usage']}" if record.get("usage") else ""))
        if record.get("backup"):
            lines.append(f"       backup: {record['backup']}")
        if record.get("reason"):
            lines.append(f"       why: {record['reason']}")
        for step in record["steps"]:
            mark = STEP_MARKS.get(step["action"], "?")
            if step["action"] == "replace":
                lines += indented(step["old"], f"       {mark} was: ")
                lines += indented(step["new"], "         now: ")
            else:
                lines += indented(step["new"] if step["action"] == "add" else step["old"], f"       {mark} ")
    return lines


@command(
    "log", OPTIONAL_TARGET,
    arg("--since", type=time_argument, metavar="TIME", help="only changes from TIME on ('2026-12-02 18:00', '2h', a Unix time)"),
    arg("--session", metavar="NAME", help="only changes made by sessions of this name (e.g. cli, gateway:telegram)"),
    arg("--limit", type=int, default=200, metavar="N", help="at most the N most recent changes (default 200)"),
)
def cmd_log(args: argparse.Namespace) -> int:
    """Show the journal: every change to the stores, oldest first, with who made it.

    Each change has a number (use it with `memd undo`), its time, the store, the action (add,
    replace, remove, batch, undo, restore, or a change seen from outside memd), the session that
    made it, and the entries it added (+), removed (-) or replaced (~). --json prints a list of
    records {"seq", "time", "session", "target", "action", "steps": [{"action", "old", "new"}],
    "usage", "after", "backup", "reason", "undo_of"}.
    """
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    with connect(args) as client:
        records = client.history(args.target, since=args.since, session=args.session, limit=args.limit, profile=args.profile)
    emit(args, records, log_lines(records) or ["(no changes recorded)"])
    return EXIT_OK


def history_reply(args: argparse.Namespace, reply: Mapping[str, Any], target: str | None) -> int:
    """Print the reply of an undo or restore, like any memory reply."""
    if args.json:
        emit(args, reply, [])
    elif reply.get("success") and target is not None:
        emit(args, reply, reply_lines(reply, target))
    else:
        lines = reply_lines(reply, target, hint=False) if target else [f"memd: refused ({reply.get('code')}): {reply.get('error', '')}"]
        print("\n".join(lines), file=sys.stderr)
    return EXIT_OK if reply.get("success") else EXIT_REFUSED


@command("undo", arg("seq", type=int, help="the change's number, from `memd log`"), dry_run=True)
def cmd_undo(args: argparse.Namespace) -> int:
    """Revert one change from the journal, as a new change.

    The inverse is applied as one validated batch: budget, injection scanning and drift rules
    hold as for any write. It is refused (code conflict) when a later change touched the same
    entries, since undoing it would overwrite that change. --json prints the daemon's reply.
    """
    with connect(args) as client:
        reply = client.undo(args.seq, dry_run=args.dry_run, name=SESSION_NAME, profile=args.profile)
    return history_reply(args, reply, reply.get("target"))


@command(
    "restore", TARGET,
    arg("--at", type=time_argument, required=True, metavar="TIME", help="the moment to go back to ('2026-12-02 18:00', '2h', a Unix time)"),
    dry_run=True,
)
def cmd_restore(args: argparse.Namespace) -> int:
    """Bring a store back to its state at a moment, as a new change (which can itself be undone).

    --json prints the daemon's reply.
    """
    with connect(args) as client:
        reply = client.restore(args.target, args.at, dry_run=args.dry_run, name=SESSION_NAME, profile=args.profile)
    return history_reply(args, reply, args.target)


def ask(prompt: str) -> bool:
    """A yes/no question on the terminal; no answer (end of input) is no."""
    print(prompt, end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


@command(
    "edit", arg("target", nargs="?", choices=TARGETS, default="memory", help="memory (default) or user"),
    arg("--yes", "-y", action="store_true", help="apply without asking for confirmation"),
    arg("--from", dest="from_file", metavar="FILE", help="start from text kept by an earlier edit instead of the live entries"),
    dry_run=True,
)
def cmd_edit(args: argparse.Namespace) -> int:
    """Edit a store's entries in $VISUAL or $EDITOR (else vi, or notepad on Windows).

    The entries appear one block per entry, separated by lines holding only §, under a
    comment header that explains the format. After the editor closes, the change is shown
    (entries changed, removed, added) with the resulting usage, and applied after you confirm
    (--yes skips the question) as one validated batch: all of it, or nothing. When it is
    refused (over budget, blocked content...) or you decline, your text is kept in a file;
    `memd edit --from FILE` starts again from it. A store edited outside memd (drift) is
    repaired here: the clean result is written to the file directly. --json prints {"changed",
    "applied", "method", "changes", "operations", "reply", "kept"}.
    """
    from memd.edit import EditAborted, edit

    from_file = Path(args.from_file) if args.from_file else None
    if from_file is not None and not from_file.is_file():
        raise UsageError(f"--from {from_file}: no such file")
    say: Callable[[str], None] = (lambda line: None) if args.json else print
    try:
        with connect(args) as client:
            result = edit(client, args.target, args.profile, say=say, ask=ask, yes=args.yes,
                          dry_run=args.dry_run, from_file=from_file)
    except EditAborted as error:
        raise Refusal(str(error)) from None
    if args.json:
        emit(args, result.to_json(), [])
    elif result.reply is not None and not result.reply.get("success"):
        lines = reply_lines(result.reply, args.target, hint=False)
        lines.append(f"Nothing was applied. Your text is kept in {result.kept}; fix it with: "
                     f"memd edit {args.target} --from {shlex.quote(str(result.kept))}")
        print("\n".join(lines), file=sys.stderr)
    elif result.applied and result.reply is not None:
        print(reply_lines(result.reply, args.target)[0])
    refused = result.reply is not None and not result.reply.get("success")
    declined = result.changed and not result.applied and not result.dry_run
    return EXIT_REFUSED if refused or declined else EXIT_OK


# -- health and the service -----------------------------------------------------------------


@command("doctor", arg("--home", help="memory home to check (default: $HERMES_HOME or ~/.hermes)"))
def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the memory home, the daemon, the stores and the systemd service, and explain
    how to fix each problem found.

    Exits 1 when a problem is found (warnings and notes alone exit 0). Never starts the
    daemon. --json prints {"ok", "problems", "checks": [{"name", "status", "detail", "fix"}]}.
    """
    from memd import doctor

    home = Path(args.home).expanduser() if args.home else default_home()
    context = doctor.Context(
        home=home, store_home=profile_home(home, args.profile), endpoint=endpoint_of(args),
        profile=args.profile, autostart=not args.no_autostart and autostart_enabled(args.endpoint),
    )
    checks = doctor.run_checks(context)
    problems = sum(check.status == "problem" for check in checks)
    warnings = sum(check.status == "warning" for check in checks)
    lines = []
    for check in checks:
        label = "PROBLEM" if check.status == "problem" else check.status
        lines.append(f"{label:<8} {check.name:<12} {check.detail}")
        if check.fix and check.status != "ok":
            lines.append(f"{'':<8} {'':<12} fix: {check.fix}")
    lines.append(f"{count(problems, 'problem')}, {count(warnings, 'warning')}." if problems or warnings else "All good.")
    emit(args, {"ok": problems == 0, "problems": problems, "warnings": warnings,
                "checks": [check.to_json() for check in checks]}, lines)
    return EXIT_REFUSED if problems else EXIT_OK


UNIT_DIR = arg("--unit-dir", help="install the unit here instead of ~/.config/systemd/user "
                                  "($MEMD_UNIT_DIR); systemctl is then left to you")


def service_lines(report: Report) -> list[str]:
    lines = [f"{report.unit}: {report.action}."]
    if report.exec_start:
        lines.append(f"It runs: {report.exec_start}")
    if report.stopped_pid:
        lines.append(f"Stopped the memd that was running outside the service (pid {report.stopped_pid}).")
    if report.active is not None:
        lines.append("The service is active." if report.active else "The service is not active.")
    if report.steps:
        lines.append("To finish, run:")
        lines += [f"  {step}" for step in report.steps]
    lines += [f"Note: {note}" for note in report.notes]
    return lines


@command(
    "install-service",
    arg("--home", help="memory home the service serves (default: $HERMES_HOME or ~/.hermes)"),
    UNIT_DIR,
    arg("--print", dest="print_only", action="store_true", help="print the unit instead of installing it"),
    daemon=False,
)
def cmd_install_service(args: argparse.Namespace) -> int:
    """Install memd as a systemd user service, and enable and start it.

    Writes memd.service with the absolute path of this memd and the memory home, then runs
    `systemctl --user daemon-reload` and `systemctl --user enable --now memd.service` where a
    user manager is reachable; otherwise prints those steps. A memd already running outside
    the service is stopped so that the service can take over. --json prints {"unit",
    "action", "exec_start", "systemctl", "active", "steps", "notes", ...}.
    """
    from memd import service

    home = Path(args.home).expanduser() if args.home else default_home()
    try:
        if args.print_only:
            print(service.render_unit(service.memd_command(), home.resolve()), end="")
            return EXIT_OK
        report = service.install(home, args.unit_dir)
    except service.ServiceError as error:
        raise Refusal(str(error)) from None
    except OSError as error:
        raise Refusal(f"cannot install the unit: {error}") from None
    emit(args, report.to_json(), service_lines(report))
    return EXIT_OK


@command("uninstall-service", UNIT_DIR, daemon=False)
def cmd_uninstall_service(args: argparse.Namespace) -> int:
    """Stop and disable the systemd user service and remove its unit.

    Agents then start memd on demand again (autostart). --json prints {"unit", "action":
    "removed" or "absent", "systemctl", "steps", ...}.
    """
    from memd import service

    try:
        report = service.uninstall(args.unit_dir)
    except OSError as error:
        raise Refusal(f"cannot remove the unit: {error}") from None
    emit(args, report.to_json(), service_lines(report))
    return EXIT_OK


# -- the parser and the entry point ---------------------------------------------------------


EPILOG = """\
exit codes: 0 done, 1 refused (the output says why), 2 usage error, 3 daemon unreachable

environment:
  HERMES_HOME      memory home (default ~/.hermes)
  MEMD_ENDPOINT    daemon endpoint (default ipc://$XDG_RUNTIME_DIR/memd/memd.sock)
  MEMD_AUTOSTART   0 stops clients from starting the daemon on demand
  EDITOR, VISUAL   the editor `memd edit` opens
"""


def daemon_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("reaching the daemon")
    group.add_argument("--endpoint", help="ipc://PATH or tcp://HOST:PORT (default: $MEMD_ENDPOINT or the runtime dir); "
                                          "an explicit endpoint is never autostarted")
    group.add_argument("--profile", help="a named profile of the memory home (<home>/profiles/NAME)")
    group.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="give up after this long (default 5)")
    group.add_argument("--no-autostart", action="store_true", help="do not start the daemon when none is running")
    return options


def output_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memd", description="Shared, self-curating memory for AI agents.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shared_daemon, shared_output = daemon_options(), output_options()
    for entry in COMMANDS:
        doc = inspect.cleandoc(entry.run.__doc__ or "")
        summary = doc.split("\n\n")[0].replace("\n", " ")
        parents = ([shared_daemon] if entry.daemon else []) + ([shared_output] if entry.output else [])
        sub = commands.add_parser(
            entry.name, help=summary, description=doc, parents=parents,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for flags, options in entry.arguments:
            sub.add_argument(*flags, **options)
        if entry.dry_run:
            sub.add_argument("--dry-run", action="store_true", help="validate and show what would change; write nothing")
        sub.set_defaults(run=entry.run)
    return parser


def fail(args: argparse.Namespace, status: int, kind: str, message: str) -> int:
    """Report an error: on stderr, and with --json also as {"error": {...}} on stdout."""
    if getattr(args, "json", False):
        print(json.dumps({"error": {"kind": kind, "message": message}}, ensure_ascii=False, indent=2))
    print(f"memd: {message}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.command == "serve" else logging.WARNING
    logging.basicConfig(level=level, format="memd: %(levelname)s %(message)s", stream=sys.stderr)
    if args.command != "serve":
        # Entries can hold any character; an unencodable one must not crash the output.
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="replace")
    try:
        if getattr(args, "profile", None) is not None:
            profile_name(args.profile)  # a bad name is a usage error, caught before sending
        return args.run(args)
    except (UsageError, ConfigError) as error:
        return fail(args, EXIT_USAGE, "usage", str(error))
    except RequestRefused as error:
        return fail(args, EXIT_REFUSED, error.code, error.message)
    except MemdError as error:  # DaemonUnavailable, or an endpoint that cannot be reached at all
        return fail(args, EXIT_UNREACHABLE, "unreachable", str(error))
    except Refusal as error:
        return fail(args, EXIT_REFUSED, "refused", str(error))
    except KeyboardInterrupt:
        return 130
