"""`memd edit`: a store's entries in $EDITOR, applied back as one validated batch.

The file the person edits is the store's own format — entries separated by lines holding only
`§` — under a comment header (every line before the first `§` line that starts with `#`). The
difference between the entries before and after is turned into remove/replace/add operations
that reproduce the edited list exactly, order included, and sent as one batch: validated by a
dry run, shown, confirmed, applied. Whatever goes wrong after the editor closes, the edited text
is kept in a file, so nothing typed is lost. Operations name entries by their text, so a
change an agent makes while the editor is open is kept, and the edit is refused if an entry it
changes has gone meanwhile.

A drifted store (edited by hand so that a rewrite would lose text) refuses batches; `memd edit`
is how a person repairs it, so there the result is written to the file directly, under the lock
memd and Hermes share, and the daemon adopts it as a clean outside change.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import platformdirs

from memd.core.format import drift_reason, parse_entries, serialise_entries
from memd.core.render import FILENAMES
from memd.core.store import MemoryCall, StoreView, apply_call, parse_call
from memd.disk import read_store, store_lock, write_durably
from memd.display import DESCRIPTIONS, count, indented
from memd_client import Client

SEPARATOR = "§"
SESSION_NAME = "cli:edit"


class EditAborted(Exception):
    """Nothing was applied; the message says why and what to do."""


# -- the file the person edits ------------------------------------------------------------


def edit_file_text(target: str, entries: Sequence[str], now: str, where: str) -> str:
    """A comment header explaining the format, then the entries, each after a `§` line."""
    name = FILENAMES[target]
    header = [
        f"# memd edit: {name} ({DESCRIPTIONS[target]}) of {where}",
        f"# Now {now}.",
        "#",
        f"# Each block below a line holding only {SEPARATOR} is one entry, as in {name} itself.",
        "# Change a block's text, delete a block (with its § line) to remove the entry, or add",
        f"# a {SEPARATOR} line and a new block at the end to add one. An entry may span several lines.",
        "# Empty blocks are ignored. Lines starting with # above the first § line are this help.",
        "# Save and quit to review the changes before anything is applied; quit without saving",
        "# to cancel.",
    ]
    body = "".join(f"{SEPARATOR}\n{entry}\n" for entry in entries)
    return "\n".join(header) + "\n" + (body or f"{SEPARATOR}\n")


def entries_from_edit_file(text: str) -> list[str]:
    """The entries of an edited file: the help header dropped, blocks split on `§` lines,
    stripped, empty ones dropped, the first of exact duplicates kept (as a store is read)."""
    lines = text.replace("\r\n", "\n").removeprefix("\ufeff").split("\n")
    first = lines.index(SEPARATOR) if SEPARATOR in lines else len(lines)
    lines = [line for line in lines[:first] if not line.startswith("#")] + lines[first:]
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line == SEPARATOR:
            blocks.append([])
        else:
            blocks[-1].append(line)
    return parse_entries(serialise_entries(["\n".join(block) for block in blocks]))


# -- from two lists of entries to a batch -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One change as a person sees it: `changed`, `removed`, `added` or `moved`."""

    kind: str
    old: str | None = None
    new: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "old": self.old, "new": self.new}


@dataclass(frozen=True, slots=True)
class EditPlan:
    operations: list[dict[str, str]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)


def plan_changes(old: Sequence[str], new: Sequence[str]) -> EditPlan:
    """Batch operations that turn the entries `old` into exactly `new`, order included.

    A batch changes or removes entries where they stand, but adds only at the end. So the
    longest start of `new` that can stay in place is kept there: entries found in `old` keep
    their own slot (in order), new texts take the slots of entries that are going away (each
    the most similar one, so an edited sentence shows as changed, not as removed and added);
    the rest of `new` is appended, existing entries among it being removed and re-added
    ("moved"). Removes run first, then replaces, then adds, and a replace never writes text
    that another entry holds, so no step can merge entries or be skipped as a duplicate. Every
    old_text is a whole entry, which the matching rules take over any substring match.
    """
    slots = {entry: index for index, entry in enumerate(old)}
    wanted = set(new)
    leaving = [index for index, entry in enumerate(old) if entry not in wanted]
    kept = len(new)
    while (gaps := _gaps(new[:kept], slots, leaving, len(old))) is None:
        kept -= 1
    replaced: dict[int, str] = {}
    for texts, free in gaps:
        for text, index in zip(texts, _most_similar_in_order(texts, [old[i] for i in free])):
            replaced[free[index]] = text
    staying = {slots[entry] for entry in new[:kept] if entry in slots}
    removes = [entry for index, entry in enumerate(old) if index not in staying and index not in replaced]
    appends = list(new[kept:])
    moved = set(removes) & set(appends)
    changes = [Change("changed", old[index], text) for index, text in sorted(replaced.items())]
    changes += [Change("removed", old=entry) for entry in removes if entry not in moved]
    changes += [Change("moved" if entry in moved else "added", new=entry) for entry in appends]
    operations = [{"action": "remove", "old_text": entry} for entry in removes]
    operations += [
        {"action": "replace", "old_text": old[index], "content": text} for index, text in sorted(replaced.items())
    ]
    operations += [{"action": "add", "content": entry} for entry in appends]
    return EditPlan(operations, changes)


def _gaps(
    prefix: Sequence[str], slots: Mapping[str, int], leaving: Sequence[int], size: int,
) -> list[tuple[list[str], list[int]]] | None:
    """Whether `prefix` can stay in place: None if not, else for each stretch of new texts
    between entries that keep their slots, those texts and the slots (of leaving entries)
    available to them."""
    gaps: list[tuple[list[str], list[int]]] = []
    texts: list[str] = []
    previous = -1
    for entry in [*prefix, None]:
        if entry is not None and entry not in slots:
            texts.append(entry)
            continue
        bound = size if entry is None else slots[entry]
        if bound <= previous:
            return None  # an entry that comes before another in `old` now comes after it
        free = [index for index in leaving if previous < index < bound]
        if len(texts) > len(free):
            return None
        if texts:
            gaps.append((texts, free))
        texts, previous = [], bound
    return gaps


def _most_similar_in_order(texts: Sequence[str], candidates: Sequence[str]) -> list[int]:
    """For each text, the index of a distinct candidate, in increasing order, making the total
    similarity as high as possible (len(candidates) >= len(texts))."""
    count, width = len(texts), len(candidates)
    # best[i][j]: the best total for texts[i:] placed among candidates[j:]
    best = [[0.0] * (width + 1) for _ in range(count + 1)]
    for i in range(count - 1, -1, -1):
        best[i][width] = float("-inf")
        for j in range(width - 1, -1, -1):
            similarity = SequenceMatcher(None, texts[i], candidates[j], autojunk=False).ratio()
            best[i][j] = max(similarity + best[i + 1][j + 1], best[i][j + 1])
    chosen: list[int] = []
    j = 0
    for i in range(count):
        while best[i][j] == best[i][j + 1]:  # skipping this candidate loses nothing
            j += 1
        chosen.append(j)
        j += 1
    return chosen


def change_lines(changes: Sequence[Change]) -> list[str]:
    """The changes as a small diff: `-` old text, `+` new text, `=` an entry that moved."""
    lines: list[str] = []
    for change in changes:
        if change.kind == "changed":
            lines.append("  changed:")
            lines += indented(change.old or "", "    - ") + indented(change.new or "", "    + ")
        elif change.kind == "removed":
            lines.append("  removed:")
            lines += indented(change.old or "", "    - ")
        elif change.kind == "added":
            lines.append("  added:")
            lines += indented(change.new or "", "    + ")
        else:
            lines.append("  moved (re-added after the entries that stay in place):")
            lines += indented(change.new or "", "    = ")
    return lines


# -- the editor, and keeping what was typed -----------------------------------------------


def editor_command() -> list[str]:
    """`$VISUAL`, else `$EDITOR` (either may carry arguments, e.g. `code --wait`), else vi
    (notepad on Windows)."""
    configured = os.environ.get("VISUAL") or os.environ.get("EDITOR")
    if configured:
        return shlex.split(configured, posix=sys.platform != "win32")
    fallback = "notepad" if sys.platform == "win32" else "vi"
    if shutil.which(fallback) is None:
        raise EditAborted("no editor found: set $EDITOR (for example `export EDITOR=nano`)")
    return [fallback]


def run_editor(path: Path) -> None:
    command = [*editor_command(), str(path)]
    try:
        status = subprocess.call(command)
    except OSError as error:
        raise EditAborted(f"cannot run the editor {command[0]!r} ({error}): set $EDITOR to one that works") from None
    if status != 0:
        raise EditAborted(f"the editor exited with status {status}; nothing was applied")


def kept_edits_dir() -> Path:
    return platformdirs.user_state_path("memd") / "edits"


def keep(text: str, target: str) -> Path:
    """Save edited text where it survives, owner-only; returns the path."""
    directory = kept_edits_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        path = directory / f"{target}-{stamp}{'-' + str(attempt) if attempt else ''}.md"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path
    raise EditAborted(f"cannot keep the edited text in {directory}: too many files there")


# -- applying -----------------------------------------------------------------------------


class Applier:
    """Validates (dry run) and applies a plan through the daemon, as one batch."""

    method = "batch"

    def __init__(self, client: Client, target: str, profile: str | None) -> None:
        self.client = client
        self.target = target
        self.profile = profile

    def run(self, plan: EditPlan, entries: Sequence[str], *, dry_run: bool) -> dict[str, Any]:
        with self.client.open_session(SESSION_NAME, self.profile) as session:
            return session.memory(target=self.target, operations=plan.operations, dry_run=dry_run)


class Rewriter(Applier):
    """For a drifted store: the same rules, checked here, and the file rewritten directly under
    the store lock; the daemon sees a clean outside change and adopts it, resolving the drift."""

    method = "rewrite"

    def __init__(self, client: Client, target: str, profile: str | None, store: Mapping[str, Any], base: Sequence[str]) -> None:
        super().__init__(client, target, profile)
        self.path = Path(store["path"])
        self.limit = int(store["limit"])
        self.base = tuple(base)
        if not self.path.is_file():
            raise EditAborted(
                f"{FILENAMES[target]} has drifted, and a drifted store can only be repaired where "
                f"its file is ({self.path} is not on this machine): run `memd edit {target}` there"
            )

    def run(self, plan: EditPlan, entries: Sequence[str], *, dry_run: bool) -> dict[str, Any]:
        view = StoreView(self.target, self.limit, self.base, serialise_entries(self.base))
        call = parse_call({"target": self.target, "operations": plan.operations, "dry_run": dry_run})
        if not plan.operations:
            # No entry changed; rewriting the same entries cleanly is what resolves the drift.
            call = MemoryCall(self.target, (), True, dry_run, ())
        assert isinstance(call, MemoryCall)
        reply = apply_call(call, view).reply
        text = serialise_entries(entries)
        still = drift_reason(text, self.limit)
        if reply["success"] and still:
            return {
                "success": False, "done": False, "code": "drift",
                "error": f"The result would still count as drifted: {still}. Split it into "
                         f"entries separated by lines holding only {SEPARATOR}.",
            }
        if not reply["success"] or dry_run:
            return reply
        with store_lock(self.path):
            found = read_store(self.path)
            if not found.readable or tuple(parse_entries(found.text or "")) != self.base:
                return {
                    "success": False, "done": False, "code": "changed",
                    "error": f"{FILENAMES[self.target]} changed while you were editing; nothing was written.",
                }
            write_durably(self.path, text)
        reply["message"] = f"{FILENAMES[self.target]} rewritten cleanly; memd adopts it and the drift is resolved."
        return reply

    def wait_adopted(self, timeout: float = 10.0) -> bool:
        """Wait until the daemon has seen the clean file (its watch or its periodic rescan)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.client.status(self.profile)["stores"][self.target]["drift"] is None:
                return True
            time.sleep(0.1)
        return False


@dataclass
class EditResult:
    """What `memd edit` did; `to_json()` is its `--json` output."""

    target: str
    changed: bool = False
    applied: bool = False
    dry_run: bool = False
    method: str = "batch"
    plan: EditPlan = field(default_factory=EditPlan)
    reply: dict[str, Any] | None = None
    kept: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target, "changed": self.changed, "applied": self.applied,
            "dry_run": self.dry_run, "method": self.method,
            "changes": [change.to_json() for change in self.plan.changes],
            "operations": self.plan.operations, "reply": self.reply,
            "kept": str(self.kept) if self.kept else None,
        }


Say = Callable[[str], None]
Ask = Callable[[str], bool]


def edit(
    client: Client, target: str, profile: str | None, *, say: Say, ask: Ask, yes: bool = False,
    dry_run: bool = False, from_file: Path | None = None,
) -> EditResult:
    """Run one edit of `target`: editor, plan, dry run, review, confirmation, apply."""
    store = client.status(profile)["stores"][target]
    if store["unreadable"]:
        raise EditAborted(
            f"{FILENAMES[target]} cannot be read ({store['unreadable']}), so it cannot be edited "
            "safely; `memd doctor` explains how to repair it"
        )
    base = client.entries(target, profile)
    result = EditResult(target, dry_run=dry_run)
    drift = store["drift"]
    applier: Applier = Rewriter(client, target, profile, store, base) if drift else Applier(client, target, profile)
    result.method = applier.method
    start = entries_from_edit_file(from_file.read_text(encoding="utf-8")) if from_file else base
    where = f"profile {profile}" if profile else "the default profile"
    text = edit_file_text(target, start, f"{store['usage']}, {count(store['entry_count'], 'entry')}", where)
    with tempfile.TemporaryDirectory(prefix="memd-edit-") as scratch:
        path = Path(scratch) / f"memd-edit-{FILENAMES[target]}"
        path.write_text(text, encoding="utf-8")
        run_editor(path)
        edited_text = path.read_text(encoding="utf-8")
    edited = entries_from_edit_file(edited_text)
    result.plan = plan_changes(base, edited)
    result.changed = bool(result.plan.operations) or bool(drift)
    if not result.changed:
        say(f"No changes: {FILENAMES[target]} is left as it was.")
        return result
    if drift and not result.plan.operations:
        say(f"No entry changed, but {FILENAMES[target]} has drifted ({drift['reason']}): saving rewrites it cleanly.")

    def refuse(reply: dict[str, Any]) -> EditResult:
        result.reply = reply
        result.kept = keep(edited_text, target)
        return result

    check = applier.run(result.plan, edited, dry_run=True)
    if not check["success"]:
        return refuse(check)
    if result.plan.changes:
        say(f"Changes to {FILENAMES[target]} ({len(result.plan.changes)}):")
        for line in change_lines(result.plan.changes):
            say(line)
    say(f"{FILENAMES[target]} after this edit: {check['usage']}, {count(check['entry_count'], 'entry')} (now {store['usage']}).")
    if dry_run:
        result.reply = check
        say("Dry run: nothing was written.")
        return result
    if not yes and not ask("Apply these changes? [y/N] "):
        result.kept = keep(edited_text, target)
        say(f"Nothing applied. Your text is kept in {result.kept}.")
        return result
    reply = applier.run(result.plan, edited, dry_run=False)
    if not reply["success"]:
        return refuse(reply)
    result.reply = reply
    result.applied = True
    if isinstance(applier, Rewriter) and not applier.wait_adopted():
        say("The file is rewritten, but memd has not confirmed the drift resolved yet; check `memd status`.")
    return result
