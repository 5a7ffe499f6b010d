"""The pure half of `memd edit`: the file a person edits, and turning the edited entries into
one batch that the memory rules apply to exactly the edited list."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memd.core.format import serialise_entries
from memd.core.store import MemoryCall, StoreView, apply_call, parse_call
from memd.edit import edit_file_text, entries_from_edit_file, plan_changes


def apply_plan(old: list[str], new: list[str]) -> tuple[dict, list[str]]:
    """Run the planned batch through the real rules; the reply and the resulting entries."""
    plan = plan_changes(old, new)
    call = parse_call({"target": "memory", "operations": plan.operations})
    assert isinstance(call, MemoryCall), call
    view = StoreView("memory", 10**6, tuple(old), serialise_entries(old))
    outcome = apply_call(call, view)
    return outcome.reply, list(outcome.entries if outcome.entries is not None else old)


# Entries as a store holds them: stripped, non-empty, distinct; short texts make collisions,
# substrings of one another and reorderings likely.
entry = st.text(alphabet="ab c\n", min_size=1, max_size=6).map(str.strip).filter(bool)
entries = st.lists(entry, max_size=8, unique=True)


@settings(max_examples=400, deadline=None)
@given(entries, entries)
def test_the_planned_batch_produces_exactly_the_edited_entries(old: list[str], new: list[str]) -> None:
    if not new:
        return  # emptying a store is refused by the rules (would_empty), on purpose
    plan = plan_changes(old, new)
    if old == new:
        assert plan.operations == [] and plan.changes == []
        return
    reply, result = apply_plan(old, new)
    assert reply["success"], (plan.operations, reply)
    assert result == new
    assert reply.get("skipped", 0) == 0


def test_an_edited_entry_shows_as_changed_in_place() -> None:
    old = ["The project uses pytest", "Deploys happen on Fridays", "The CI runs on GitHub"]
    new = ["The project uses pytest and ruff", "The CI runs on GitHub", "A new fact"]
    plan = plan_changes(old, new)
    assert [(change.kind, change.old, change.new) for change in plan.changes] == [
        ("changed", "The project uses pytest", "The project uses pytest and ruff"),
        ("removed", "Deploys happen on Fridays", None),
        ("added", None, "A new fact"),
    ]
    assert len(plan.operations) == 3


def test_a_rewritten_entry_pairs_with_the_most_similar_one() -> None:
    old = ["User likes tea", "User lives in Lisbon", "User works remotely"]
    new = ["User likes tea", "User lives in Porto now"]
    changes = [(change.kind, change.old, change.new) for change in plan_changes(old, new).changes]
    assert changes == [
        ("changed", "User lives in Lisbon", "User lives in Porto now"),
        ("removed", "User works remotely", None),
    ]


def test_moving_an_entry_up_re_adds_only_what_must_follow_it() -> None:
    plan = plan_changes(["A", "B", "C"], ["C", "A", "B"])
    assert [(change.kind, change.new) for change in plan.changes] == [("moved", "A"), ("moved", "B")]
    assert apply_plan(["A", "B", "C"], ["C", "A", "B"])[1] == ["C", "A", "B"]


def test_the_edit_file_round_trips_and_explains_itself() -> None:
    stored = ["# A markdown heading as an entry", "Two\nlines", "§ is fine inside a line"]
    text = edit_file_text("memory", stored, "1% — 60/2,200 chars, 3 entries", "the default profile")
    header = text.split("\n§\n")[0]
    assert all(line.startswith("#") for line in header.splitlines())
    assert "separated" in header or "below a line holding only §" in header
    assert entries_from_edit_file(text) == stored
    assert entries_from_edit_file(text.replace("\n", "\r\n")) == stored
    assert entries_from_edit_file(edit_file_text("user", [], "0%", "x")) == []
    # Empty blocks vanish, duplicates are kept once, and help lines count only at the top.
    assert entries_from_edit_file("# help\n§\n\n§\nsame\n§\nsame\n§\n# kept\n") == ["same", "# kept"]
