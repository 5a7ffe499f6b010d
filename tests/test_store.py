"""The memory operations (SPEC §3, §5): add, replace, remove, batch, dry run, and their replies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.core.format import (
    normalise_entry,
    parse_entries,
    serialise_entries,
    total_chars,
    usage_text,
)
from memd.core.replies import CODES
from memd.core.scan import scan
from memd.core.store import count_failure, match_entry, parse_call
from tests.helpers_core import BENIGN, INJECTION, INJECTION_2, apply, placeholder, view

NOTES = [
    "Deploys go through `make ship`; never on Fridays.",
    "Staging lives at https://staging.example.com.",
    "The test suite runs with `pytest -q`.",
]


def written_entries(outcome) -> list[str]:
    """The entries of the file the outcome would write."""
    assert outcome.text is not None, outcome.reply
    return parse_entries(outcome.text)


# -- the shape of a call ------------------------------------------------------------------------

def test_a_null_target_means_memory():
    call = parse_call({"action": "add", "content": "x", "target": None})
    assert call.target == "memory"
    assert parse_call({"action": "add", "content": "x"}).target == "memory"


@pytest.mark.parametrize("target", ["notes", "MEMORY", "", 3])
def test_an_unknown_target_is_invalid(target):
    reply = parse_call({"action": "add", "content": "x", "target": target})
    assert reply["success"] is False and reply["code"] == "invalid"
    assert "'memory' or 'user'" in reply["error"]


@pytest.mark.parametrize("action", [None, "append", "delete", 1])
def test_an_unknown_action_is_invalid(action):
    outcome = apply(view(NOTES), action=action, content="x")
    assert outcome.reply["code"] == "invalid" and outcome.text is None
    assert "'add', 'replace' or 'remove'" in outcome.reply["error"]


def test_content_must_be_text():
    outcome = apply(view(NOTES), action="add", content=["a", "b"])
    assert outcome.reply["code"] == "invalid" and "'content' must be a string" in outcome.reply["error"]


def test_every_spec_code_is_known():
    assert set(CODES) >= {
        "ok", "duplicate", "over_budget", "no_match", "ambiguous", "blocked", "drift",
        "would_empty", "invalid", "unreadable", "consolidation_exhausted",
    }


# -- add -----------------------------------------------------------------------------------------

def test_add_appends_the_stripped_entry():
    outcome = apply(view(NOTES), action="add", content="  User prefers tea.\n ")
    assert outcome.reply["success"] is True and outcome.reply["code"] == "ok"
    assert outcome.text == serialise_entries([*NOTES, "User prefers tea."])


def test_add_to_an_empty_store():
    outcome = apply(view([]), action="add", content="First fact.")
    assert outcome.text == "First fact."


@pytest.mark.parametrize("content", [None, "", "   \n\t"])
def test_add_without_content_is_invalid(content):
    outcome = apply(view(NOTES), action="add", content=content)
    assert outcome.reply["code"] == "invalid" and outcome.reply["done"] is False
    assert outcome.text is None


def test_new_text_is_an_alias_of_content():
    outcome = apply(view(NOTES), action="add", new_text="Alias works.")
    assert written_entries(outcome)[-1] == "Alias works."


def test_content_wins_over_new_text():
    outcome = apply(view(NOTES), action="add", content="From content.", new_text="From new_text.")
    assert written_entries(outcome)[-1] == "From content."
    assert "From new_text." not in outcome.text


def test_a_duplicate_add_succeeds_with_code_duplicate_and_writes_nothing():
    outcome = apply(view(NOTES), action="add", content=f"  {NOTES[1]}  ")
    reply = outcome.reply
    assert reply["success"] is True and reply["done"] is True and reply["code"] == "duplicate"
    assert outcome.text is None
    assert reply["entry_count"] == 3
    assert "nothing was written" in reply["note"].lower()


def test_a_crlf_copy_of_an_entry_is_a_duplicate():
    outcome = apply(view(["line one\nline two"]), action="add", content="line one\r\nline two")
    assert outcome.reply["code"] == "duplicate" and outcome.text is None


def test_success_reply_carries_target_usage_count_message_note_and_no_entries():
    entries = ["x" * 600, "y" * 628]  # 600 + 3 + 628 = 1,231 chars
    outcome = apply(view(entries, limit=2200), action="add", content="z")  # + 3 + 1 = 1,235
    reply = outcome.reply
    assert reply["success"] is True and reply["done"] is True and reply["code"] == "ok"
    assert reply["target"] == "memory"
    assert reply["usage"] == "56% — 1,235/2,200 chars"
    assert reply["entry_count"] == 3
    assert reply["message"]
    assert reply["note"] == "Write saved. This update is complete — do not repeat it."
    assert "x" * 20 not in json.dumps(reply) and "y" * 20 not in json.dumps(reply)
    assert "current_entries" not in reply and "entries" not in reply


def test_user_target_success_names_user():
    outcome = apply(view(["Called Priya."], limit=1375, target="user"), action="add", content="Likes tea.")
    assert outcome.reply["target"] == "user"
    assert outcome.reply["usage"] == usage_text(len("Called Priya.\n§\nLikes tea."), 1375)


def test_add_over_the_limit_is_over_budget_with_usage_entries_and_the_rejected_size():
    entries = ["a" * 40, "b" * 37]  # 80 chars
    outcome = apply(view(entries, limit=100), action="add", content="c" * 30)
    reply = outcome.reply
    assert reply["success"] is False and reply["done"] is False and reply["code"] == "over_budget"
    assert outcome.text is None and outcome.counts_as_failure
    assert "80/100" in reply["error"]          # current usage and limit
    assert "(30 chars)" in reply["error"]      # the size of the rejected entry
    assert "113" in reply["error"]             # the total it would have made
    assert "operations=" in reply["error"] and "Consolidate now" in reply["error"]
    assert reply["usage"] == "80% — 80/100 chars"
    assert reply["current_entries"] == entries


def test_add_that_fills_the_store_exactly_is_accepted():
    outcome = apply(view(["a" * 40, "b" * 37], limit=100), action="add", content="c" * 17)  # 80 + 3 + 17
    assert outcome.reply["code"] == "ok" and outcome.reply["usage"] == "100% — 100/100 chars"
    outcome = apply(view(["a" * 40, "b" * 37], limit=100), action="add", content="c" * 18)
    assert outcome.reply["code"] == "over_budget"


def test_add_size_uses_thousands_separators():
    outcome = apply(view(["a" * 1500], limit=2200), action="add", content="b" * 1200)
    assert "1,500/2,200" in outcome.reply["error"] and "(1,200 chars)" in outcome.reply["error"]


def test_content_with_a_delimiter_line_is_refused():
    # Written as one entry, it would read back as two (and, with "a", as a repeated entry).
    outcome = apply(view(["a"]), action="add", content="b\n§\na")
    assert outcome.reply["code"] == "invalid" and outcome.text is None
    assert "'§'" in outcome.reply["error"]
    outcome = apply(view(["a"]), action="add", content="b\n§")
    assert outcome.reply["code"] == "invalid"


def test_a_section_sign_inside_a_line_is_fine_in_content():
    outcome = apply(view(["a"]), action="add", content="See §4.\nx § y")
    assert written_entries(outcome) == ["a", "See §4.\nx § y"]


# -- injection scanning on write -----------------------------------------------------------------

@pytest.mark.parametrize("attack", [INJECTION, INJECTION_2])
def test_a_poisoned_add_is_blocked_naming_the_category(attack):
    outcome = apply(view(NOTES), action="add", content=attack)
    reply = outcome.reply
    assert reply["success"] is False and reply["code"] == "blocked"
    assert outcome.text is None
    for finding in scan(attack):
        assert finding.category in reply["error"]
    assert "fact" in reply["error"]  # asks for the fact to be restated


def test_a_poisoned_replace_is_blocked():
    outcome = apply(view(NOTES), action="replace", old_text="Staging", content=INJECTION)
    assert outcome.reply["code"] == "blocked" and outcome.text is None


@pytest.mark.parametrize("note", BENIGN)
def test_ordinary_notes_are_saved(note):
    assert apply(view([]), action="add", content=note).reply["code"] == "ok"


# -- replace and remove: matching ---------------------------------------------------------------

def test_replace_changes_the_whole_matched_entry_and_returns_it():
    outcome = apply(view(NOTES), action="replace", old_text="staging.example", content="Staging moved to k8s.")
    assert written_entries(outcome) == [NOTES[0], "Staging moved to k8s.", NOTES[2]]
    assert outcome.reply["replaced_entry"] == NOTES[1]
    assert outcome.reply["code"] == "ok" and outcome.reply["entry_count"] == 3


@pytest.mark.parametrize("entries, changed", [
    (["deploy", "deploy to staging"], 0),
    (["deploy to staging", "deploy"], 1),
])
def test_an_exact_entry_wins_over_substring_matches(entries, changed):
    outcome = apply(view(entries), action="replace", old_text="deploy", content="ship it")
    expected = list(entries)
    expected[changed] = "ship it"
    assert written_entries(outcome) == expected
    outcome = apply(view(entries), action="remove", old_text="deploy")
    assert written_entries(outcome) == [entries[1 - changed]]


def test_several_distinct_matches_are_ambiguous_with_80_character_previews():
    first = "Staging: " + "the cluster is at https://staging.example.com and deploys by tag, " * 3
    second = "Staging\nnotes: short."
    outcome = apply(view([first, second, "Unrelated."]), action="remove", old_text="Staging")
    reply = outcome.reply
    assert reply["code"] == "ambiguous" and reply["success"] is False and reply["done"] is False
    assert outcome.text is None and not outcome.counts_as_failure
    assert reply["matches"] == [first[:80] + "...", "Staging notes: short."]
    assert "2 different entries" in reply["error"]


def test_identical_duplicates_resolve_to_the_first():
    # A parsed store never holds duplicates, but the rule does not depend on it.
    assert match_entry(["x one", "x one", "y"], "x") == 0
    outcome = apply(view(["a", "x one", "x one"]), action="replace", old_text="one", content="z")
    assert outcome.reply["code"] == "ok"
    assert outcome.text == serialise_entries(["a", "z", "x one"])


def test_no_match_lists_the_current_entries_and_counts_as_failure():
    outcome = apply(view(NOTES), action="replace", old_text="kubernetes", content="x")
    reply = outcome.reply
    assert reply["code"] == "no_match" and reply["done"] is False
    assert reply["current_entries"] == NOTES and reply["usage"] == usage_text(total_chars(NOTES), 2200)
    assert "kubernetes" in reply["error"]
    assert outcome.counts_as_failure and outcome.text is None


@pytest.mark.parametrize("action", ["replace", "remove"])
@pytest.mark.parametrize("old_text", [None, "", "   "])
def test_missing_old_text_is_a_recoverable_error_listing_the_entries(action, old_text):
    outcome = apply(view(NOTES), action=action, old_text=old_text, content="new")
    reply = outcome.reply
    assert reply["success"] is False and reply["done"] is False and reply["code"] == "invalid"
    assert reply["current_entries"] == NOTES
    assert f"memory(action='{action}'" in reply["error"] and "old_text=" in reply["error"]
    assert outcome.text is None


@pytest.mark.parametrize("content", [None, "", "  "])
def test_replace_without_content_is_invalid(content):
    outcome = apply(view(NOTES), action="replace", old_text="Staging", content=content)
    assert outcome.reply["code"] == "invalid" and outcome.text is None


def test_replace_over_the_limit_is_over_budget():
    outcome = apply(view(["a" * 40, "b" * 37], limit=100), action="replace", old_text="bbb", content="c" * 60)
    reply = outcome.reply
    assert reply["code"] == "over_budget" and outcome.text is None and outcome.counts_as_failure
    assert "80/100" in reply["error"] and "103" in reply["error"]
    assert reply["current_entries"] == ["a" * 40, "b" * 37]


def test_a_replace_that_shrinks_an_over_budget_store_is_allowed():
    # An external edit left the store over budget; consolidating must still be possible.
    outcome = apply(view(["a" * 90, "b" * 50], limit=100), action="replace", old_text="bbb", content="b" * 20)
    assert outcome.reply["code"] == "ok"  # 143 -> 113 chars: still over, but better
    assert written_entries(outcome) == ["a" * 90, "b" * 20]


def test_replacing_an_entry_with_the_text_of_another_merges_them():
    # Otherwise the file would hold a repeated entry, which reads back as drift.
    outcome = apply(view(["a", "b", "c"]), action="replace", old_text="c", content="a")
    assert outcome.text == serialise_entries(["a", "b"])


def test_remove_deletes_the_matched_entry_and_returns_it():
    outcome = apply(view(NOTES), action="remove", old_text="pytest")
    assert written_entries(outcome) == NOTES[:2]
    assert outcome.reply["removed_entry"] == NOTES[2] and outcome.reply["entry_count"] == 2


def test_removing_the_last_entry_one_at_a_time_is_allowed():
    outcome = apply(view(["only"]), action="remove", old_text="only")
    assert outcome.reply["code"] == "ok" and outcome.text == ""


# -- batch ---------------------------------------------------------------------------------------

def test_a_batch_applies_in_order_with_one_write():
    ops = [
        {"action": "remove", "old_text": "Fridays"},
        {"action": "replace", "old_text": "staging", "content": "Staging: k8s."},
        {"action": "add", "content": "Uses tea."},
        {"action": "replace", "old_text": "tea", "content": "Uses green tea."},
    ]
    outcome = apply(view(NOTES), operations=ops)
    assert outcome.reply["code"] == "ok" and outcome.reply["applied"] == 4
    assert written_entries(outcome) == ["Staging: k8s.", NOTES[2], "Uses green tea."]
    assert len(outcome.steps) == 4


def test_a_duplicate_add_in_a_batch_is_skipped_not_an_error():
    ops = [{"action": "add", "content": NOTES[0]}, {"action": "add", "content": "New."}, {"action": "add", "content": "New."}]
    outcome = apply(view(NOTES), operations=ops)
    assert outcome.reply["success"] is True and outcome.reply["skipped"] == 2
    assert written_entries(outcome) == [*NOTES, "New."]


def test_a_batch_of_only_duplicates_writes_nothing():
    outcome = apply(view(NOTES), operations=[{"action": "add", "content": NOTES[1]}])
    assert outcome.reply["success"] is True and outcome.text is None


@pytest.mark.parametrize("bad_op, code", [
    ({"action": "rename", "content": "x"}, "invalid"),
    ({"action": "replace", "content": "x"}, "invalid"),          # no old_text
    ({"action": "remove"}, "invalid"),                            # no old_text
    ({"action": "add", "content": "  "}, "invalid"),              # empty content
    ({"action": "add", "content": "a\n§\nb"}, "invalid"),        # a delimiter line
    ("add this", "invalid"),                                      # not an object
    ({"action": "remove", "old_text": "kubernetes"}, "no_match"),
    ({"action": "remove", "old_text": "e"}, "ambiguous"),
])
def test_any_bad_operation_aborts_the_whole_batch_naming_its_position(bad_op, code):
    ops = [{"action": "add", "content": "Fine one."}, bad_op, {"action": "add", "content": "Fine two."}]
    outcome = apply(view(NOTES), operations=ops)
    reply = outcome.reply
    assert reply["success"] is False and reply["code"] == code
    assert outcome.text is None and outcome.counts_as_failure
    assert reply["error"].startswith("Operation 2:")
    assert "Nothing was applied" in reply["error"]


def test_a_later_op_that_matches_nothing_because_of_an_earlier_one_aborts_the_batch():
    ops = [{"action": "remove", "old_text": "pytest"}, {"action": "replace", "old_text": "pytest", "content": "x"}]
    outcome = apply(view(NOTES), operations=ops)
    assert outcome.reply["code"] == "no_match" and outcome.text is None
    assert outcome.reply["current_entries"] == NOTES[:2]  # the working copy at that point


def test_one_poisoned_operation_rejects_the_whole_batch():
    ops = [{"action": "remove", "old_text": "pytest"}, {"action": "add", "content": "Fine."}, {"action": "add", "content": INJECTION}]
    outcome = apply(view(NOTES), operations=ops)
    assert outcome.reply["code"] == "blocked" and outcome.text is None
    assert outcome.reply["error"].startswith("Operation 3:")
    assert scan(INJECTION)[0].category in outcome.reply["error"]


def test_the_batch_budget_is_checked_on_the_final_state_only():
    entries = ["a" * 40, "b" * 37]  # 80 of 100
    ops = [
        {"action": "add", "content": "c" * 50},          # 133: over the limit here
        {"action": "remove", "old_text": "aaa"},          # 90
        {"action": "replace", "old_text": "bbb", "content": "b" * 10},  # 63
    ]
    outcome = apply(view(entries, limit=100), operations=ops)
    assert outcome.reply["code"] == "ok"
    assert written_entries(outcome) == ["b" * 10, "c" * 50]


def test_a_batch_that_ends_over_the_limit_is_over_budget():
    ops = [{"action": "remove", "old_text": "aaa"}, {"action": "add", "content": "c" * 70}]
    outcome = apply(view(["a" * 40, "b" * 37], limit=100), operations=ops)
    assert outcome.reply["code"] == "over_budget" and outcome.text is None and outcome.counts_as_failure
    assert outcome.reply["current_entries"] == ["a" * 40, "b" * 37]


def test_a_batch_that_would_empty_the_store_is_refused():
    ops = [{"action": "remove", "old_text": entry} for entry in NOTES]
    outcome = apply(view(NOTES), operations=ops)
    reply = outcome.reply
    assert reply["code"] == "would_empty" and reply["success"] is False
    assert outcome.text is None and outcome.counts_as_failure
    assert reply["current_entries"] == NOTES


def test_a_batch_on_an_empty_store_may_leave_it_empty():
    ops = [{"action": "add", "content": "x"}, {"action": "remove", "old_text": "x"}]
    assert apply(view([]), operations=ops).reply["success"] is True


def test_operations_must_be_a_list():
    outcome = apply(view(NOTES), operations={"action": "add", "content": "x"})
    assert outcome.reply["code"] == "invalid"


# -- dry run -------------------------------------------------------------------------------------

def test_a_dry_run_validates_and_describes_without_writing():
    outcome = apply(view(NOTES), action="replace", old_text="staging", content="Staging: k8s.", dry_run=True)
    reply = outcome.reply
    assert reply["success"] is True and reply["dry_run"] is True and outcome.text is None
    assert reply["usage"] == usage_text(total_chars([NOTES[0], "Staging: k8s.", NOTES[2]]), 2200)
    assert reply["changes"] == [{"action": "replace", "old": NOTES[1], "new": "Staging: k8s."}]
    assert "nothing was written" in reply["note"].lower()


def test_a_dry_run_batch_describes_every_change():
    ops = [{"action": "add", "content": "New."}, {"action": "remove", "old_text": "pytest"}]
    outcome = apply(view(NOTES), operations=ops, dry_run=True)
    assert outcome.text is None and outcome.reply["entry_count"] == 3
    assert outcome.reply["changes"] == [{"action": "add", "new": "New."}, {"action": "remove", "old": NOTES[2]}]


def test_a_dry_run_reports_the_failure_the_write_would_meet():
    outcome = apply(view(["a" * 90], limit=100), action="add", content="b" * 20, dry_run=True)
    assert outcome.reply["code"] == "over_budget" and outcome.text is None


def test_dry_run_must_be_a_boolean():
    assert apply(view(NOTES), action="add", content="x", dry_run="yes").reply["code"] == "invalid"


# -- a store that cannot be written ---------------------------------------------------------------

@pytest.mark.parametrize("args", [
    {"action": "add", "content": "x"},
    {"action": "remove", "old_text": "a"},
    {"operations": [{"action": "add", "content": "x"}]},
])
def test_an_unreadable_store_refuses_every_write(args):
    outcome = apply(view(["a"], unreadable="it is not valid UTF-8 (byte 3)"), **args)
    reply = outcome.reply
    assert reply["code"] == "unreadable" and reply["done"] is True and outcome.text is None
    assert "not valid UTF-8" in reply["error"]


@pytest.mark.parametrize("args", [
    {"action": "replace", "old_text": "a", "content": "b"},
    {"action": "remove", "old_text": "a"},
    {"operations": [{"action": "add", "content": "x"}]},
])
def test_a_drifted_store_refuses_rewrites_naming_the_backup(args):
    drifted = view(["a", "b"], text="a\n§\n\n§\nb", drift_backup="/m/MEMORY.md.bak.1700000000", drift_reason="stray")
    outcome = apply(drifted, **args)
    reply = outcome.reply
    assert reply["code"] == "drift" and reply["done"] is True and outcome.text is None
    assert reply["drift_backup"] == "/m/MEMORY.md.bak.1700000000"
    assert "/m/MEMORY.md.bak.1700000000" in reply["error"] and reply["remediation"]


@pytest.mark.parametrize("text", [
    "a\n§\n\n§\nb", "a\n§\nb\n§", "a\n§\nb\n§\n§", "a\n§\nb\n§\na", "\n§\na\n§\nb", "\n§\n",
])
def test_add_to_a_drifted_store_appends_keeping_all_its_text(text):
    drifted = view(parse_entries(text), text=text, drift_backup="/m/MEMORY.md.bak.1", drift_reason="stray")
    outcome = apply(drifted, action="add", content="New fact.")
    assert outcome.reply["code"] == "ok"
    assert outcome.text.startswith(text.rstrip())
    assert parse_entries(outcome.text) == [*parse_entries(text), "New fact."]


def test_free_text_in_a_drifted_store_is_not_charged_to_the_budget_of_an_add():
    pasted = "Notes pasted by hand:" + " the release moves to Thursday." * 5  # longer than the limit
    text = "a" * 20 + "\n§\n" + pasted
    drifted = view(parse_entries(text), limit=100, text=text, drift_backup="/m/MEMORY.md.bak.1", drift_reason="long")
    outcome = apply(drifted, action="add", content="b" * 70)  # 20 + 3 + 70 = 93 of 100
    assert outcome.reply["code"] == "ok" and outcome.text == text + "\n§\n" + "b" * 70
    outcome = apply(drifted, action="add", content="b" * 78)  # 101: the tool's own entries must still fit
    assert outcome.reply["code"] == "over_budget" and outcome.text is None


# -- sanitised echoes ----------------------------------------------------------------------------

POISONED = [NOTES[0], INJECTION, NOTES[2]]


def assert_no_raw_injection(reply):
    assert INJECTION not in json.dumps(reply, ensure_ascii=False)


def test_current_entries_in_errors_are_sanitised():
    blocked = placeholder("MEMORY.md", INJECTION)
    outcomes = [
        apply(view(POISONED, limit=300), action="add", content="x" * 200),                    # over_budget
        apply(view(POISONED), action="remove", old_text="kubernetes"),                      # no_match
        apply(view(POISONED), action="replace", content="x"),                                # missing old_text
        apply(view(POISONED), operations=[{"action": "remove", "old_text": e} for e in POISONED]),  # would_empty
    ]
    for outcome in outcomes:
        assert outcome.reply["current_entries"] == [NOTES[0], blocked, NOTES[2]], outcome.reply["code"]
        assert_no_raw_injection(outcome.reply)


def test_current_entries_of_the_user_store_name_user_md():
    outcome = apply(view(["Called Priya.", INJECTION], target="user"), action="remove", old_text="nothing")
    assert outcome.reply["current_entries"][1] == placeholder("USER.md", INJECTION)


def test_ambiguous_previews_are_sanitised():
    outcome = apply(view(POISONED), action="remove", old_text="e")
    assert outcome.reply["code"] == "ambiguous"
    assert_no_raw_injection(outcome.reply)
    assert placeholder("MEMORY.md", INJECTION)[:80] + "..." in outcome.reply["matches"]


def test_replaced_and_removed_entries_are_sanitised():
    replaced = apply(view(POISONED), action="replace", old_text="previous instructions", content="Harmless.")
    assert replaced.reply["replaced_entry"] == placeholder("MEMORY.md", INJECTION)
    assert written_entries(replaced) == [NOTES[0], "Harmless.", NOTES[2]]
    removed = apply(view(POISONED), action="remove", old_text="previous instructions")
    assert removed.reply["removed_entry"] == placeholder("MEMORY.md", INJECTION)
    dry = apply(view(POISONED), action="remove", old_text="previous instructions", dry_run=True)
    for reply in (replaced.reply, removed.reply, dry.reply):
        assert_no_raw_injection(reply)


# -- the failure counter (pure part; per-session behaviour is in test_engine) ----------------------

def test_the_fourth_counted_failure_is_terminal():
    failed = apply(view(NOTES), action="remove", old_text="kubernetes")
    failures = 0
    for expected in (1, 2, 3):
        failures, reply = count_failure(failures, failed, dry_run=False)
        assert failures == expected and reply["code"] == "no_match" and reply["done"] is False
    failures, reply = count_failure(failures, failed, dry_run=False)
    assert reply == {**reply, "success": False, "done": True, "code": "consolidation_exhausted"}
    assert "continue your reply" in reply["error"]
    failures, reply = count_failure(failures, failed, dry_run=False)
    assert reply["code"] == "consolidation_exhausted"


def test_a_success_resets_the_count_and_uncounted_failures_leave_it():
    succeeded = apply(view(NOTES), action="add", content="x")
    ambiguous = apply(view(NOTES), action="remove", old_text="e")
    assert count_failure(3, succeeded, dry_run=False)[0] == 0
    assert count_failure(2, ambiguous, dry_run=False)[0] == 2
    failed = apply(view(NOTES), action="remove", old_text="kubernetes")
    assert count_failure(3, failed, dry_run=True) == (3, failed.reply)  # a dry run only asks


# -- properties -----------------------------------------------------------------------------------

ENTRY = st.text(st.sampled_from("abcdefgh "), min_size=1, max_size=30).map(str.strip).filter(bool)


@given(
    st.lists(ENTRY, unique=True, min_size=1, max_size=6),
    st.lists(ENTRY, max_size=4),
    st.data(),
    st.integers(20, 200),
)
@settings(max_examples=200)
def test_a_batch_succeeds_exactly_when_its_final_state_fits(entries, additions, data, limit):
    removed = data.draw(st.lists(st.sampled_from(entries), unique=True))
    # Adds first, so the store may overflow on the way, then removals by exact text.
    ops = [{"action": "add", "content": text} for text in additions]
    ops += [{"action": "remove", "old_text": text} for text in removed]
    final = [entry for entry in entries if entry not in removed]
    final += [text for text in dict.fromkeys(additions) if text not in entries]
    if not ops or any(text in removed and text not in entries for text in additions):
        return  # no call at all, or an added text equal to a removed one: other stories
    if any(scan(text) for text in additions):
        return  # scanning has its own tests
    outcome = apply(view(entries, limit=limit), operations=ops)
    fits = total_chars(final) <= limit or total_chars(final) <= total_chars(entries)
    if not final:
        assert outcome.reply["code"] == "would_empty"
    elif fits:
        assert outcome.reply["success"] is True, outcome.reply
        if outcome.text is not None:
            assert parse_entries(outcome.text) == final
    else:
        assert outcome.reply["code"] == "over_budget" and outcome.text is None


@given(st.text(st.sampled_from(["a", "b", " ", "\n", "§", "\r", "\ufeff", "x"]), max_size=20))
@settings(max_examples=300)
def test_whatever_content_add_accepts_reads_back_as_exactly_that_entry(content):
    store = view(["a", "b\n§ x"])
    outcome = apply(store, action="add", content=content)
    if outcome.reply["code"] == "ok":
        assert parse_entries(outcome.text) == [*store.entries, normalise_entry(content)]
        assert outcome.reply["entry_count"] == 3
        assert serialise_entries(parse_entries(outcome.text)) == outcome.text
    else:
        assert outcome.text is None
